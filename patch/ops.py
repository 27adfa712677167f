"""One patched op in one process: its backend, torch custom op, self-check and counters.

The replacement of every SGLang callable of an op ends in `OpState.execute`, which

1. self-checks the astra kernel against SGLang's original on the first call of each
   (dtype, shape class) (ASTRA_SGLANG_SELF_CHECK: first | always | off): up to
   `check_rows` token rows (half from the start, half from the end) are run through the
   original on copies, the astra kernel runs on the real tensors, and every output and
   in-place side effect is compared on those rows under the op's tolerance rule (the
   `check` module's: err vs fp64 <= max(k * production's err, dtype floor)). A mismatch
   restores the original's result, disables the op in this process and says so on stderr;
2. launches the kernel on the caller's current stream, counting the call (and, while a
   CUDA graph is being captured, that it was captured);
3. never self-checks while a graph is captured (no host sync there): an unchecked shape
   class met during capture is served by the original, which is what gets captured.

The op is also a torch custom op, astra_sglang::<op> (mutating its outputs, schema from
the spec's ABI, a fake impl), so torch.compile traces it as one opaque node; eager calls
skip the dispatcher and run `execute` directly.
"""
from __future__ import annotations

import logging
import operator
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from astra_sglang.errors import AstraError

from .adapters import TORCH_DTYPES, OpAdapter, abi_layout, torch_schema
from .config import fault_drill
from .counters import CounterFile, process_rank

log = logging.getLogger("astra_sglang.patch")

LIB_NS = "astra_sglang"
DEFAULT_CHECK_ROWS = 256

_tls = threading.local()


def bypassing() -> bool:
    """True while SGLang's originals must run unpatched (inside a self-check)."""
    return getattr(_tls, "bypass", 0) > 0


class _Bypass:
    def __enter__(self):
        _tls.bypass = getattr(_tls, "bypass", 0) + 1

    def __exit__(self, *exc):
        _tls.bypass -= 1


def is_tracing(t) -> bool:
    """A fake or meta tensor (tracing outside torch.compile): emit the custom op, do not run."""
    return type(t).__name__ == "FakeTensor" or t.is_meta


# ---------------------------------------------------------------------- backends
class KernelError(AstraError):
    pass


class KernelBackend:
    """An astra-ABI shared library (kernels/<op>/kernel.cu or a candidate) via ctypes."""

    devices: FrozenSet[str] = frozenset({"cuda"})

    def __init__(self, spec, lib_path, source: str = ""):
        import torch

        from astra_sglang.build.loader import KernelLib

        self.lib = KernelLib(lib_path, spec)
        self.name = f"kernel {source or lib_path}"
        self.dtypes = frozenset(spec.dtypes)
        # the current stream's handle as an int: torch's own raw-stream getter (what inductor launches with) skips
        # building a torch.cuda.Stream object on every eager call; looked up once, not per launch
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def launch(self, views: Dict[str, Any], dims: Tuple[int, ...], dtype: str, scalars: Dict[str, Any]) -> None:
        import torch

        dev = views[next(iter(views))].device
        cur = torch.cuda.current_device()
        idx = cur if dev.index is None else dev.index
        raw = self._raw_stream
        stream = raw(idx) if raw is not None else torch.cuda.current_stream(idx).cuda_stream
        if idx != cur:
            with torch.cuda.device(idx):
                rc = self.lib(views, dims, dtype, scalars, stream=stream)
        else:
            rc = self.lib(views, dims, dtype, scalars, stream=stream)
        if rc != 0:
            raise KernelError(f"{self.name} returned cudaError {rc}")


class TorchBackend:
    """A torch implementation of the ABI: fn(views, dims, scalars) writes the outputs.

    For CPU stand-ins (tests) and for reference runs; never the served kernel on a GPU
    unless asked for explicitly.
    """

    def __init__(self, name: str, fn: Callable[..., None], devices=("cpu",), dtypes=("fp32", "fp16", "bf16")):
        self.name = name
        self.fn = fn
        self.devices = frozenset(devices)
        self.dtypes = frozenset(dtypes)

    def launch(self, views, dims, dtype, scalars) -> None:
        self.fn(views, dims, scalars)


# ---------------------------------------------------------------------- custom op registry
_LIB = None
_DEFINED: Set[str] = set()
_IMPL: Dict[str, "OpState"] = {}


def _ensure_custom_op(state: "OpState") -> None:
    """Define astra_sglang::<op> once per process; its impl dispatches to the live state."""
    global _LIB
    import torch

    name = state.spec.name
    _IMPL[name] = state
    if name in _DEFINED:
        return
    if _LIB is None:
        _LIB = torch.library.Library(LIB_NS, "FRAGMENT")
    lay = state.layout
    _LIB.define(name + torch_schema(state.spec))
    names = list(lay.tensors) + [n for n, _ in lay.scalars]

    def impl(*args):
        st = _IMPL[name]
        canon = dict(zip(names, args))
        st.run_canonical(canon, original=None)

    _LIB.impl(name, impl, "CompositeExplicitAutograd")

    def fake(*args):
        return None

    torch.library.register_fake(f"{LIB_NS}::{name}", fake, lib=_LIB)
    _DEFINED.add(name)


def custom_op(name: str):
    import torch

    return getattr(getattr(torch.ops, LIB_NS), name)


# ---------------------------------------------------------------------- the op's state
@dataclass
class CheckResult:
    ok: bool
    detail: str
    errors: Dict[str, Tuple[float, float, float]] = field(default_factory=dict)  # name -> (err, prod_err, tol)


class OpState:
    def __init__(self, spec, adapter: OpAdapter, backend, counters: CounterFile, self_check: str = "first",
                 check_rows: int = DEFAULT_CHECK_ROWS, targets: Tuple[str, ...] = ()):
        self.spec = spec
        # the SGLang callables ("module:function") this op replaces
        self.targets: Tuple[str, ...] = tuple(dict.fromkeys(tuple(spec.replaces) + tuple(targets)))
        self.adapter = adapter
        self.layout = abi_layout(spec)
        self.backend = backend
        self.counters = counters
        self.mode = self_check
        self.check_rows = max(2, int(check_rows))
        self.checked: Set[Tuple[Any, ...]] = set()
        self.disabled: Optional[str] = None
        self.captured = False  # astra's kernel went into a CUDA graph (a later disable cannot take it out)
        self.default_original: Optional[Callable[[Dict[str, Any]], Any]] = None
        self.last_check: Optional[CheckResult] = None
        self.last_fallback = ""  # why SGLang's original last served a call (validate names it)
        import torch

        # torch dtype -> ABI dtype name, for the dtypes both the spec and the backend take
        self._dtypes = {getattr(torch, t): n for t, n in TORCH_DTYPES.items()
                        if n in spec.dtypes and n in backend.dtypes}
        # the dims after the token count that name a self-check class (adapter.token_derived left out)
        # (an itemgetter: shape_class runs on every eager call in --self-check first)
        cd = tuple(i for i, n in enumerate(spec.dim_names) if i and n not in adapter.token_derived)
        self._class_of = ((lambda dims: ()) if not cd else
                          (lambda dims, g=operator.itemgetter(cd[0]): (g(dims),)) if len(cd) == 1 else
                          operator.itemgetter(*cd))
        _ensure_custom_op(self)

    @property
    def name(self) -> str:
        return self.spec.name

    # ------------------------------------------------------------ support
    def prepare(self, canon: Dict[str, Any]):
        """Allocate optional outputs; -> (views, dims, dtype) or a reason to fall back.
        On the hot path of every eager call: keep it lean."""
        import torch

        ad = self.adapter
        for n, mk in ad.alloc.items():
            if canon.get(n) is None:
                canon[n] = mk(canon)
        tensors = self.layout.tensors
        Tensor = torch.Tensor
        for n in tensors:
            if not isinstance(canon.get(n), Tensor):
                return f"{n} is not a tensor"
        data = canon[ad.data]
        ddt = data.dtype
        dt = self._dtypes.get(ddt)
        if dt is None:
            return f"dtype {ddt} not supported"
        for n in ad.same_dtype:
            if canon[n].dtype is not ddt:
                return f"{n} is {canon[n].dtype}, {ad.data} is {ddt}"
        for n in ad.fp32:
            if canon[n].dtype is not torch.float32:
                return f"{n} is {canon[n].dtype}, not float32"
        dev = data.device
        for n in tensors:
            if canon[n].device != dev:
                return f"{n} on {canon[n].device}, {ad.data} on {dev}"
        if dev.type not in self.backend.devices and dev.type != "meta":
            return f"device {dev.type} (the {self.backend.name} runs on {', '.join(sorted(self.backend.devices))})"
        res = ad.normalize(canon)
        if isinstance(res, str):
            return res
        views, dims = res
        if 0 in dims and self.spec.dims_problem(dims):  # a size dim of 0 (spec.zero_dims may be 0); `0 in dims` is rare
            return "empty tensor"
        kept = ad.kept_by_sglang(dims)
        if kept:
            return kept
        for n, _ in self.layout.scalars:
            views[n] = canon[n]
        return views, dims, dt

    def scalars(self, canon: Dict[str, Any]) -> Dict[str, Any]:
        return {n: (float(canon[n]) if ct == "f64" else int(canon[n])) for n, ct in self.layout.scalars}

    def emit(self, canon: Dict[str, Any]) -> None:
        """torch.compile path: one opaque custom-op node."""
        args = [canon[n] for n in self.layout.tensors] + [canon[n] for n, _ in self.layout.scalars]
        custom_op(self.name)(*args)

    # ------------------------------------------------------------ execution
    def fallback(self, reason: str) -> None:
        self.counters.bump(self.name, "fallbacks")
        self.last_fallback = reason or (f"op disabled: {self.disabled}" if self.disabled else "")
        if reason and reason not in _seen_reasons.setdefault(self.name, set()) and len(_seen_reasons[self.name]) < 20:
            _seen_reasons[self.name].add(reason)
            log.info("astra-sglang %s: SGLang's original serves a call: %s", self.name, reason)

    def run_canonical(self, canon: Dict[str, Any], original: Optional[Callable[[Dict[str, Any]], Any]]) -> None:
        """Entry of the custom op's impl (compiled graphs): prepare, then execute."""
        orig = original or self.default_original
        prep = self.prepare(canon)
        if isinstance(prep, str) or self.disabled:
            if orig is None:
                raise AstraError(f"astra-sglang {self.name}: {prep if isinstance(prep, str) else self.disabled}, "
                                 "and no original to fall back to")
            self.fallback(prep if isinstance(prep, str) else "op disabled")
            with _Bypass():
                orig(canon)
            return
        views, dims, dt = prep
        self.execute(views, dims, dt, orig)

    def shape_class(self, dims: Tuple[int, ...], dt: str) -> Tuple[Any, ...]:
        """What one self-check vouches for: the dtype, the token count's power-of-two bucket, the other dims."""
        return (dt, 1 << max(0, (dims[0] - 1).bit_length()), *self._class_of(dims))

    def execute(self, views: Dict[str, Any], dims: Tuple[int, ...], dt: str,
                original: Optional[Callable[[Dict[str, Any]], Any]]) -> None:
        import torch

        mode = self.mode
        cls = self.shape_class(dims, dt) if mode != "off" else None
        dev = views[self.adapter.data].device
        capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
        need_check = original is not None and (mode == "always" or (mode == "first" and cls not in self.checked))
        if need_check and capturing:
            # no host sync inside a capture: the original is captured for this class
            self.fallback(f"shape class {cls} not yet self-checked when a CUDA graph was captured")
            with _Bypass():
                original(views)
            return
        if need_check:
            self._checked_launch(views, dims, dt, cls, original)
            return
        self._launch(views, dims, dt, original, capturing)

    def _launch(self, views, dims, dt, original, capturing: bool) -> None:
        try:
            self.backend.launch(views, dims, dt, self.scalars(views))
        except KernelError as e:
            self.disable(str(e))
            if original is None:
                raise
            with _Bypass():
                original(views)
            return
        self.counters.bump(self.name, "calls")
        self.counters.record_shape(self.name, dims, dt, capturing)  # shape telemetry: --shapes FILE
        if capturing:
            self.captured = True
            self.counters.bump(self.name, "captured")

    # ------------------------------------------------------------ self-check
    def _rows(self, t: int) -> Optional[Any]:
        if t <= self.check_rows:
            return None
        import torch

        h = self.check_rows // 2
        return torch.cat([torch.arange(0, h), torch.arange(t - h, t)])

    def _sample(self, views: Dict[str, Any], idx) -> Dict[str, Any]:
        import torch

        out = {}
        for n, v in views.items():
            if not hasattr(v, "clone"):
                out[n] = v
            elif n in self.adapter.slot_indexed:
                continue  # below: only the rows the sampled tokens address
            elif n in self.adapter.read_only:
                out[n] = v  # never written: read in place, not copied
            elif idx is not None and n in self.adapter.rowwise:
                out[n] = v.index_select(0, idx.to(v.device))
            else:
                out[n] = v.clone()
        slots = self.adapter.slot_indexed
        for cache, index in slots.items():
            out[cache] = views[cache].index_select(0, out[index])
        for index in set(slots.values()):
            loc = out[index]
            out[index] = torch.arange(loc.numel(), dtype=loc.dtype, device=loc.device)
        return out

    def _slots(self, views: Dict[str, Any], idx) -> Dict[str, Any]:
        """index name -> the cache rows the (sampled) tokens address, in the real cache."""
        return {index: (views[index] if idx is None else views[index].index_select(0, idx.to(views[index].device)))
                for index in set(self.adapter.slot_indexed.values())}

    def _checked_launch(self, views, dims, dt, cls, original) -> None:
        # rows are sampled only from ops whose tensors are indexed by token; the others (moe_align: every
        # output depends on every id) are checked whole, so the dims the check uses are the call's own
        idx = self._rows(dims[0]) if self.adapter.rowwise else None
        pristine = self._sample(views, idx)  # inputs, before anything runs
        ro = self.adapter.read_only
        expected = {n: (v.clone() if hasattr(v, "clone") and n not in ro else v) for n, v in pristine.items()}
        inout = [n for n in self.layout.mutated if n in self._inputs_read()]
        slots = self.adapter.slot_indexed
        # to restore in-place args on a mismatch (a slot-indexed cache: the rows the call writes)
        full_snapshot = {n: views[n].clone() for n in inout if n not in slots}
        cache_rows = {n: views[slots[n]] for n in inout if n in slots}
        cache_snapshot = {n: views[n].index_select(0, loc) for n, loc in cache_rows.items()}
        sampled_slots = self._slots(views, idx)
        with _Bypass():
            original(expected)
        try:
            self.backend.launch(views, dims, dt, self.scalars(views))
        except KernelError as e:
            self.disable(str(e))
            with _Bypass():
                original(views)
            return
        self.counters.bump(self.name, "calls")
        self.counters.record_shape(self.name, dims, dt, False)
        self.counters.note_rank()
        if fault_drill(self.name, process_rank()):
            for n in self.layout.mutated:      # ASTRA_SGLANG_FAULT_DRILL: a wrong kernel, simulated
                if n in slots:                 # a pool cache: only the rows this call writes
                    views[n][views[slots[n]]] += 1
                else:
                    views[n].add_(1)
        got = {n: (views[n].index_select(0, sampled_slots[slots[n]]) if n in slots
                   else views[n].index_select(0, idx.to(views[n].device)) if idx is not None and n in self.adapter.rowwise
                   else views[n]) for n in self.layout.mutated}
        sdims = (len(idx),) + tuple(dims[1:]) if idx is not None else tuple(dims)
        res = compare(self.spec, pristine, expected, got, sdims, self.layout.mutated)
        self.last_check = res
        if res.ok:
            self.checked.add(cls)
            self.counters.bump(self.name, "checks_passed")
            log.info("astra-sglang %s: self-check passed for %s (%s)", self.name, cls, res.detail)
            return
        self.counters.bump(self.name, "checks_failed")
        # serve the original's result for this call: restore in-place args, rerun the original
        for n, snap in full_snapshot.items():
            views[n].copy_(snap)
        for n, snap in cache_snapshot.items():
            views[n].index_copy_(0, cache_rows[n], snap)
        with _Bypass():
            original(views)
        self.disable(f"self-check mismatch on {dt} {tuple(dims)}: {res.detail}")

    def _inputs_read(self) -> Set[str]:
        return {a.name for a in self.spec.abi if a.ctype == "ptr" and a.role in ("in", "inout")}

    def disable(self, reason: str) -> None:
        if self.disabled:
            return
        self.disabled = reason
        self.counters.set_status(self.name, state="disabled", reason=reason)
        rank = process_rank()
        msg = (f"astra-sglang: PATCH DISABLED for {self.name} in pid {_pid()}{f' ({rank})' if rank else ''}: {reason}. "
               f"SGLang's original kernel serves {self.name} from now on.")
        if self.captured:   # graphs cannot be edited: say what still runs astra's kernel
            msg += (" CUDA graphs captured before this keep astra's kernel for the shapes they hold (each of those "
                    "shape classes passed its own self-check); restart the server without the op to drop them too.")
        if log.hasHandlers():
            log.error(msg)
        print("\n" + "!" * 100 + "\n" + msg + "\n" + "!" * 100, file=sys.stderr, flush=True)


_seen_reasons: Dict[str, Set[str]] = {}


def _pid() -> int:
    import os

    return os.getpid()


def compare(spec, inputs: Dict[str, Any], expected: Dict[str, Any], got: Dict[str, Any], dims, names) -> CheckResult:
    """The check's tolerance rule on every output: err(got) <= max(k * err(expected), floor)."""
    from astra_sglang.harness.numerics import SHORT_DTYPE, dtype_name, judged, nonfinite_mismatch, rel_err, tolerance

    from astra_sglang.harness.numerics import canonical_outputs

    ref = spec.reference(inputs, tuple(dims), {n: v for n, v in inputs.items() if not hasattr(v, "clone")})
    names = [n for n in names if n in ref]   # scratch the reference does not define (moe_align's cumsum) is not compared
    got = canonical_outputs(spec, {n: got[n] for n in names}, dims)
    expected = {**expected, **canonical_outputs(spec, {n: expected[n] for n in names}, dims)}
    errors: Dict[str, Tuple[float, float, float]] = {}
    bad: List[str] = []
    for n in names:
        g = got[n].reshape(ref[n].shape) if got[n].numel() == ref[n].numel() else got[n]
        e = expected[n].reshape(ref[n].shape) if expected[n].numel() == ref[n].numel() else expected[n]
        r_got = judged(spec, rel_err(g, ref[n]))
        r_prod = judged(spec, rel_err(e, ref[n]))
        tol = tolerance(spec, SHORT_DTYPE.get(dtype_name(g), dtype_name(g)), r_prod)
        nf = nonfinite_mismatch(g, ref[n], e)
        errors[n] = (r_got, r_prod, tol)
        if not (r_got <= tol) or nf:
            why = f"{n}: err {r_got:.3g} > tol {tol:.3g} (production {r_prod:.3g})"
            if nf:
                why += f", {nf} special-value mismatches"
            bad.append(why)
    if bad:
        return CheckResult(False, "; ".join(bad), errors)
    detail = ", ".join(f"{n} err {v[0]:.2g} <= {v[2]:.2g}" for n, v in errors.items())
    return CheckResult(True, detail, errors)
