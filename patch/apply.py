"""Putting the astra ops into a running Python process that uses SGLang.

For every op, each SGLang callable in the spec's `replaces` list is resolved on its
module (now, or when that module is imported later: an exec_module hook on the loaders of
sglang / sgl_kernel / flashinfer modules) and replaced there by a wrapper that maps the call
onto the op's ABI (adapters.py) and runs the astra kernel (ops.OpState), or SGLang's original
for anything the adapter does not cover. JIT module factories found by discovery (functions
that JIT-build the op's production .cuh) are wrapped so the modules they return route the
op's methods to the astra op.

The replacing itself goes through SGLang's own HookRegistry (install.py): a REPLACE hook,
which also rebinds import-time bindings (`from sgl_kernel import silu_and_mul [as x]`, in
any module, under any alias); modules imported later bind the replaced attribute, and
call-time lookups (`X.f`, imports inside functions) see it too.

Everything is undone by `Patcher.revert()`.
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from astra_sglang.errors import AstraError

from ._posthook import spec_with_post_exec
from .adapters import Binder, JitRoute, Served
from .install import Installed, install, lookup, uninstall
from .ops import OpState, _Bypass, bypassing, is_tracing

log = logging.getLogger("astra_sglang.patch")

WATCH_PREFIXES = ("sglang", "sgl_kernel", "flashinfer")


@dataclass
class TargetStatus:
    target: str
    state: str  # "patched" | "absent" (module not imported/installed yet) | "unsupported: ..."
    rebound: List[str] = field(default_factory=list)  # "module:name" rebound to the wrapper
    via: str = ""  # who replaced it: install.VIA_SGLANG or install.VIA_ASTRA


class Patcher:
    """Applies a set of OpStates to this process; idempotent; revertible."""

    def __init__(self, states: Mapping[str, OpState], factories: Sequence[Tuple[str, str, str, str]] = ()):
        """factories: (op, module, function, cuda_file) from discovery's jit_factory sites."""
        self.states = dict(states)
        self.factories = list(factories)
        self.originals: Set[int] = set()
        self.wrappers: Set[int] = set()
        self.installed: List[Installed] = []
        self.status: Dict[str, Dict[str, TargetStatus]] = {
            op: {t: TargetStatus(t, "absent") for t in st.targets} for op, st in self.states.items()}
        self.wrapped_factories: Dict[Tuple[str, str], Any] = {}
        self._watch: Set[str] = set(WATCH_PREFIXES)
        for st in self.states.values():
            for t in st.targets:
                self._watch.add(t.split(":")[0].split(".")[0])
        self._lock = threading.RLock()
        self._hook: Optional[_ExecHook] = None
        self.active = False

    # ------------------------------------------------------------------ lifecycle
    def activate(self) -> "Patcher":
        with self._lock:
            self.active = True
            self._resolve_all()
            self._hook = _ExecHook(self)
            sys.meta_path.insert(0, self._hook)
        return self

    def revert(self) -> None:
        with self._lock:
            if self._hook is not None and self._hook in sys.meta_path:
                sys.meta_path.remove(self._hook)
            self._hook = None
            for inst in reversed(self.installed):
                uninstall(inst)
            self.installed.clear()
            self.originals.clear()
            self.wrappers.clear()
            self.wrapped_factories.clear()
            self.active = False
            for st in self.states.values():
                st.counters.set_status(st.name, state="reverted")
            for c in {id(st.counters): st.counters for st in self.states.values()}.values():
                c.close()

    # ------------------------------------------------------------------ resolution
    def _resolve_all(self) -> None:
        names = {t.split(":")[0] for st in self.states.values() for t in st.targets}
        for name in sorted(names | {m for _, m, _, _ in self.factories}):
            if name in sys.modules:
                self._module_loaded(sys.modules[name])
        self._publish()

    def _module_loaded(self, module) -> bool:
        """Replace the targets and wrap the JIT factories `module` holds; True if anything was new."""
        name = module.__name__
        new = [self._register(op, t, module) for op, st in self.states.items() for t in st.targets
               if t.split(":")[0] == name]
        wrapped = len(self.wrapped_factories)
        for op, mod_name, fn, cfile in self.factories:
            if mod_name == name:
                self._wrap_factory(op, module, fn, cfile)
        return any(new) or len(self.wrapped_factories) != wrapped

    def _publish(self) -> None:
        """Record in each op's <pid>.json which callables are patched here, and where."""
        for op, targets in self.status.items():
            self.states[op].counters.set_status(
                op, targets={t: (f"{s.state} (rebound in {len(s.rebound)} module(s))" if s.state == "patched"
                                 else s.state) for t, s in targets.items()},
                jit_factories=self._factories_of(op))

    def _factories_of(self, op: str) -> List[str]:
        return [f"{m}:{f}" for (m, f), w in self.wrapped_factories.items() if getattr(w, "__astra_op__", None) == op]

    def _register(self, op: str, target: str, module) -> bool:
        """Resolve `target` on its (imported) module; True if a new original was found."""
        st = self.states[op]
        name = target.split(":", 1)[1]
        obj = lookup(module, name)
        if obj is None:
            self.status[op][target].state = "absent"
            return False
        if id(obj) in self.wrappers or id(obj) in self.originals:  # bound to a replacement already
            self.status[op][target] = TargetStatus(target, "patched", via=getattr(obj, "__astra_via__", ""))
            return False
        if not callable(obj):
            self.status[op][target].state = f"unsupported: {type(obj).__name__} is not callable"
            return False
        binder = Binder(obj, st.adapter, st.spec)
        if not binder.ok:
            self.status[op][target].state = f"unsupported: {binder.problem}"
            return False
        inst = self._install(module, name, obj, make_replacement(st, binder, obj, target))
        self.originals.add(id(obj))
        self.status[op][target] = TargetStatus(target, "patched", inst.rebound, inst.via)
        if st.default_original is None:
            st.default_original = _canonical_caller(binder, obj)
        return True

    def _install(self, module, name: str, original, replacement) -> Installed:
        inst = install(module, name, original, replacement)
        self.installed.append(inst)
        self.wrappers.update((id(replacement), id(inst.bound)))
        return inst

    def on_module_executed(self, module) -> None:
        """Called right after a watched module finished executing (the import hook)."""
        if not self.active:
            return
        with self._lock:
            if self._module_loaded(module):
                self._publish()

    def watches(self, fullname: str) -> bool:
        return fullname.split(".")[0] in self._watch

    # ------------------------------------------------------------------ JIT factories
    def _wrap_factory(self, op: str, module, fn: str, cuda_file: str) -> None:
        st = self.states[op]
        routes = st.adapter.jit_routes.get(cuda_file, ())
        key = (module.__name__, fn)
        if not routes or key in self.wrapped_factories:
            return
        ns = vars(module)
        orig = ns.get(fn)
        if orig is None or not callable(orig):
            return
        self.wrapped_factories[key] = self._install(module, fn, orig, make_factory_wrapper(st, orig, routes)).bound

    # ------------------------------------------------------------------ report
    def summary(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for op, targets in self.status.items():
            st = self.states[op]
            out[op] = {
                "backend": st.backend.name,
                "disabled": st.disabled,
                "last_fallback": st.last_fallback,
                "targets": {t: {"state": s.state, "rebound": list(s.rebound), "via": s.via}
                            for t, s in targets.items()},
                "jit_factories": self._factories_of(op),
            }
        return out


def _canonical_caller(binder: Binder, fn: Callable) -> Callable[[Dict[str, Any]], Any]:
    """Call SGLang's original with canonical arguments (for compiled graphs' self-check)."""
    return lambda canon: binder.call_with(fn, {}, canon)


def make_replacement(st: OpState, binder: Binder, orig: Callable, target: str) -> Callable:
    import torch

    ad = st.adapter
    precheck = ad.precheck

    def not_covered(canon, args, kwargs):
        """A call the op's kernel does not take after binding. A fused op's expand may have done the layer
        method's own work already (qknorm_rope: the qkv GEMM), so SGLang's kernel sequence serves the rest;
        otherwise SGLang's original serves the whole call."""
        if ad.expand is None:
            return orig(*args, **kwargs)
        with _Bypass():
            ad.sequence(canon)
        return ad.returns(canon)

    def replacement(*args, **kwargs):
        if torch.compiler.is_compiling():
            if st.disabled:
                return orig(*args, **kwargs)
            canon, vals = binder.bind(args, kwargs)
            if canon is None or isinstance(canon, Served):  # nothing stashed is trusted under tracing
                return orig(*args, **kwargs)
            prep = st.prepare(canon)
            if isinstance(prep, str):
                return not_covered(canon, args, kwargs)
            st.emit(canon)
            return ad.returns(canon)
        if st.disabled or bypassing():
            if st.disabled:
                st.fallback("")
            return orig(*args, **kwargs)
        if precheck is not None:
            why = precheck(args, kwargs)
            if why:
                st.fallback(why)
                return orig(*args, **kwargs)
        canon, vals = binder.bind(args, kwargs)
        if canon is None:
            st.fallback(vals)
            return orig(*args, **kwargs)
        if isinstance(canon, Served):  # answered from the op's own earlier launch: no kernel here
            st.counters.bump(st.name, "served")
            return canon.value
        prep = st.prepare(canon)
        if isinstance(prep, str):
            st.fallback(prep)
            return not_covered(canon, args, kwargs)
        views, dims, dt = prep
        if is_tracing(views[ad.data]):
            st.emit(canon)
            return ad.returns(canon)
        st.execute(views, dims, dt, lambda c: binder.call_with(orig, vals, c))
        return ad.returns(canon)

    if not binder.from_schema:
        functools.update_wrapper(replacement, orig)
        resolve_signature(replacement, orig)
    else:  # a torch custom op: its name and doc, the signature its schema gives, none of the op object's state
        functools.update_wrapper(replacement, orig, updated=())
        del replacement.__wrapped__
        replacement.__signature__ = binder.signature  # type: ignore[attr-defined]
    replacement.__astra_original__ = orig  # type: ignore[attr-defined]
    replacement.__astra_op__ = st.name  # type: ignore[attr-defined]
    replacement.__astra_target__ = target  # type: ignore[attr-defined]
    return replacement


def resolve_signature(wrapper: Callable, orig: Callable) -> None:
    """update_wrapper leads inspect to `orig`'s signature, whose annotations are strings where its module
    has `from __future__ import annotations`; torch.library.infer_schema evaluates them in the
    *wrapper's* globals (SGLang 0.5.17 registers the patched fused_inplace_qknorm as a custom op at
    import: NameError 'torch', the server died). The wrapper gets the signature with its annotations
    evaluated where `orig` was defined."""
    try:
        wrapper.__signature__ = inspect.signature(orig, eval_str=True)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an unresolvable annotation: keep what update_wrapper gave
        pass


# ---------------------------------------------------------------------- JIT factories
class _JitModuleProxy:
    """Stands in for a JIT module: the op's methods go to the astra op, the rest (and
    everything the adapter does not accept) to the real module, built on first need."""

    def __init__(self, st: OpState, build: Callable[[], Any], routes: Sequence[JitRoute]):
        self._st = st
        self._build = build
        self._real_mod = None
        self._routes = {r.method: r for r in routes}

    def _real(self):
        if self._real_mod is None:
            self._real_mod = self._build()
        return self._real_mod

    def __getattr__(self, name: str):
        route = self._routes.get(name)
        if route is None:
            return getattr(self._real(), name)
        st = self._st

        def method(*args):
            real = lambda *a: getattr(self._real(), name)(*a)  # noqa: E731
            if st.disabled or bypassing() or not route.match(args):
                return real(*args)
            canon = {p: a for p, a in zip(route.params, args) if not p.startswith("=")}

            def original(c):
                return real(*[a if p.startswith("=") else c.get(p, a) for p, a in zip(route.params, args)])

            prep = st.prepare(canon)
            if isinstance(prep, str):
                st.fallback(prep)
                return real(*args)
            views, dims, dt = prep
            st.execute(views, dims, dt, original)
            return None

        return method


def make_factory_wrapper(st: OpState, factory: Callable, routes: Sequence[JitRoute]) -> Callable:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None and any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        sig = None  # cannot tell which build a call asks for: leave the factory alone
    proxies: Dict[Any, _JitModuleProxy] = {}

    def wrapper(*args, **kwargs):
        if st.disabled or bypassing() or sig is None:
            return factory(*args, **kwargs)
        try:
            b = sig.bind(*args, **kwargs)
        except TypeError:
            return factory(*args, **kwargs)
        b.apply_defaults()
        live = [r for r in routes if r.factory_ok(b.arguments)]
        if not live:
            return factory(*args, **kwargs)
        try:
            key = (args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in proxies:
            return proxies[key]
        p = _JitModuleProxy(st, lambda: factory(*args, **kwargs), live)
        if key is not None:
            proxies[key] = p
        return p

    functools.update_wrapper(wrapper, factory)
    wrapper.__astra_original__ = factory  # type: ignore[attr-defined]
    wrapper.__astra_op__ = st.name  # type: ignore[attr-defined]
    return wrapper


# ---------------------------------------------------------------------- import hook
class _ExecHook:
    """A meta-path finder that never finds anything itself: for watched modules it has the
    other finders find them and calls the patcher once the module body ran."""

    def __init__(self, patcher: Patcher):
        self.patcher = patcher
        self._busy = threading.local()

    def _after(self, module) -> None:
        try:
            self.patcher.on_module_executed(module)
        except Exception:  # never break an import
            log.exception("astra-sglang: patching %s after import failed", module.__name__)

    def find_spec(self, fullname, path=None, target=None):
        if not self.patcher.watches(fullname) or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            return spec_with_post_exec(self, fullname, path, target, self._after, owner="patcher")
        finally:
            self._busy.name = None


# ---------------------------------------------------------------------- building backends
def cache_root() -> Path:
    """patch/ under the one cache root ($ASTRA_CACHE_DIR; $ASTRA_SGLANG_CACHE read as a deprecated alias)."""
    from astra_sglang.build import cache_root as root

    return root("patch")


def kernel_source(op: str, candidate: Optional[Path] = None) -> Path:
    from astra_sglang.registry import op_dir

    src = Path(candidate) if candidate else op_dir(op) / "kernel.cu"
    if not src.exists():
        what = f"candidate {src}" if candidate else f"kernels/{op}/kernel.cu"
        raise AstraError(f"{what} not found: nothing to patch {op} with")
    return src


def build_kernel(op: str, candidate: Optional[Path] = None, arch: Optional[str] = None) -> Path:
    """nvcc-build (cached) kernels/<op>/kernel.cu or a candidate with the flags check and bench build it
    with (astra_sglang.build.kernel_flags: the op's production variant's profile); the cache key
    covers source, flags and nvcc version."""
    import os

    from astra_sglang.build import build_shared, detect_arch, first_error_line, kernel_flags, parse_arch
    from astra_sglang.registry import get_op

    from .config import ENV_ARCH

    src = kernel_source(op, candidate)
    a = parse_arch(arch or os.environ.get(ENV_ARCH) or "") if (arch or os.environ.get(ENV_ARCH)) else detect_arch()
    flags = kernel_flags(get_op(op), a)
    res = build_shared(src, [], flags, cache_root() / op, f"{op}:{src.resolve()}")
    if not res.ok:
        raise AstraError(f"{src} does not compile for {a.sm}: {first_error_line(res.log)}")
    return res.library


def build_kernels(ops: Sequence[str], candidates: Optional[Mapping[str, Path]] = None, arch: Optional[str] = None,
                  progress: Optional[Callable[[str, Any, float], None]] = None) -> Dict[str, Any]:
    """build_kernel for several ops, their nvcc runs side by side (one per core, at most 8): built one after another,
    the 19 default ops took 115 s of a patched server's start on an H200 node (2026-11-28). op -> its library, or the
    AstraError that stopped it; progress(op, that, seconds) as each is known, in `ops` order."""
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    cands = dict(candidates or {})

    def one(op: str):
        t0 = time.perf_counter()
        try:
            return build_kernel(op, cands.get(op), arch), time.perf_counter() - t0
        except AstraError as e:
            return e, time.perf_counter() - t0

    out: Dict[str, Any] = {}
    if not ops:
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(ops)))) as pool:
        for op, (res, dt) in zip(ops, pool.map(one, ops)):
            out[op] = res
            if progress:
                progress(op, res, dt)
    return out
