"""Live-SGLang patching: the astra kernels in every process of an SGLang runtime.

Python API (Liger-Kernel style), before building an SGLang Engine:

    from astra_sglang.patch import apply_astra_kernels
    apply_astra_kernels(ops=["silu_and_mul", "fused_add_rmsnorm"])   # or ops=None: all
    engine = sglang.Engine(model_path=...)      # its scheduler processes activate too

Servers: `astra-sglang patch --serve -- <sglang launch_server args>`; see patch/README.md.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from astra_sglang.errors import AstraError
from astra_sglang.files import write_whole

from . import config as _cfg
from .counters import read_counters, totals

log = logging.getLogger("astra_sglang.patch")

STARTUP_DIR = Path(__file__).resolve().parent / "_startup"

_ACTIVE = None  # the process's Patcher


def patchable_ops() -> List[str]:
    """Ops whose folder holds a patch adapter (kernels/<op>/adapter.py); `astra-sglang ops`
    lists the others with what they lack."""
    from astra_sglang.registry import has_part, op_names

    return [o for o in op_names() if has_part(o, "adapter")]


def active_patcher():
    return _ACTIVE


def load_plan(path: Optional[Path]):
    from .discover import Discovery

    if path and Path(path).exists():
        return Discovery.from_json(Path(path).read_text())
    return None


def discovery_cached(specs, refresh: bool = False):
    """Discovery over the installed SGLang, cached on disk by SGLang version and location."""
    from .apply import cache_root
    from .discover import Discovery, cache_key, discover_for_specs, find_package_dir

    if find_package_dir("sglang") is None:
        return None
    path = cache_root() / "discovery" / f"{cache_key(specs)}.json"
    if path.exists() and not refresh:
        try:
            return Discovery.from_json(path.read_text())
        except (ValueError, KeyError, TypeError):
            pass
    disc = discover_for_specs(specs)
    write_whole(path, disc.to_json())
    return disc


def apply_astra_kernels(
    ops: Optional[Sequence[str]] = None,
    *,
    candidates: Optional[Mapping[str, Union[str, Path]]] = None,
    libs: Optional[Mapping[str, Union[str, Path]]] = None,
    backends: Optional[Mapping[str, Any]] = None,
    targets: Optional[Mapping[str, Sequence[str]]] = None,
    self_check: str = "first",
    check_rows: Optional[int] = None,
    counter_dir: Optional[Union[str, Path]] = None,
    plan: Any = None,
    propagate: bool = True,
    strict: bool = True,
):
    """Patch the astra kernels into this process (and, with propagate, into the SGLang
    processes it starts). Returns the Patcher, or None when ASTRA_SGLANG_DISABLE is set.

    ops: op names (default: every patchable op). candidates: op -> .cu replacing
    kernels/<op>/kernel.cu. libs: op -> prebuilt .so. backends: op -> backend object
    (tests: a CPU stand-in; see ops.TorchBackend). targets: op -> extra "module:function"
    callables to replace besides the spec's `replaces` (your own wrappers). self_check: first | always | off.
    plan: a Discovery (or its JSON path) naming JIT factories; None: discovered (cached);
    False: no JIT factories.
    strict: raise when an op cannot be patched (else: say so and go on without it).
    """
    global _ACTIVE
    from astra_sglang.registry import get_op

    from .adapters import adapter_mismatch, get_adapter
    from .apply import Patcher, build_kernels
    from .counters import CounterFile, default_dir
    from .ops import DEFAULT_CHECK_ROWS, KernelBackend, OpState

    if _cfg.disabled():
        log.warning("astra-sglang: %s is set: not patching anything", _cfg.ENV_DISABLE)
        return None
    if self_check not in _cfg.SELF_CHECK_MODES:
        raise AstraError(f"self_check={self_check!r}: use one of {', '.join(_cfg.SELF_CHECK_MODES)}")
    known = patchable_ops()
    names = list(ops) if ops is not None else known
    bad = [o for o in names if o not in known]
    if bad:
        from astra_sglang.registry import op_part

        for o in bad:
            op_part(o, "adapter")  # an op without an adapter: the error names the missing file
        raise AstraError(f"cannot patch {', '.join(bad)}: patchable ops are {', '.join(known)}")
    if _ACTIVE is not None:
        revert_astra_kernels()

    candidates = {k: Path(v) for k, v in (candidates or {}).items()}
    libs = {k: Path(v) for k, v in (libs or {}).items()}
    backends = dict(backends or {})
    rows = int(check_rows or os.environ.get("ASTRA_SGLANG_CHECK_ROWS") or DEFAULT_CHECK_ROWS)
    cdir = Path(counter_dir) if counter_dir else Path(os.environ.get(_cfg.ENV_COUNTER_DIR) or default_dir())

    specs = {}
    built: Dict[str, Path] = {}
    problems: Dict[str, str] = {}
    for op in names:
        why = adapter_mismatch(get_op(op), get_adapter(op))
        if why:
            problems[op] = why
    # every kernel this process still needs, built side by side
    fresh = build_kernels([o for o in names if o not in problems and o not in backends and not libs.get(o)],
                          candidates)
    for op in names:
        if op in problems:
            continue
        spec = get_op(op)
        if op not in backends:
            lib = libs.get(op) or fresh[op]
            if isinstance(lib, AstraError):
                problems[op] = str(lib)
                continue
            try:
                built[op] = Path(lib)
                backends[op] = KernelBackend(spec, lib, str(candidates.get(op) or f"kernels/{op}/kernel.cu"))
            except AstraError as e:
                problems[op] = str(e)
                continue
        specs[op] = spec
    if problems:
        msg = "; ".join(f"{o}: {w}" for o, w in problems.items())
        if strict:
            raise AstraError(f"cannot patch {msg}")
        log.error("astra-sglang: NOT patching %s", msg)
    counters = CounterFile(cdir, list(names))
    for op, why in problems.items():
        counters.set_status(op, state="unavailable", reason=why)
    states = {op: OpState(specs[op], get_adapter(op), backends[op], counters, self_check, rows,
                          tuple((targets or {}).get(op, ()))) for op in specs}

    if plan is False:
        disc = None
    elif isinstance(plan, (str, Path)):
        disc = load_plan(Path(plan))
    elif plan is not None:
        disc = plan
    else:
        try:
            disc = discovery_cached(list(specs.values()))
        except AstraError as e:
            disc = None
            log.info("astra-sglang: no discovery (%s): JIT factories are not wrapped", e)
    factories = []
    if disc is not None:
        factories = [(s.op, s.module, s.local_name, s.info().get("cuda_file", ""))
                     for s in disc.sites if s.kind == "jit_factory" and s.op in states]
    patcher = Patcher(states, factories).activate()
    for op, st in states.items():
        counters.set_status(op, state="patched", backend=st.backend.name, self_check=self_check)
    _ACTIVE = patcher
    if propagate:
        exported = plan if isinstance(plan, (str, Path)) else None
        if exported is None and disc is not None:  # the processes SGLang spawns load this plan, not scan SGLang again
            exported = cdir / f"plan.{os.getpid()}.json"   # cdir may be shared (the default): one file a patcher
            write_whole(exported, disc.to_json())
        _export_env(list(states), built, candidates, self_check, cdir, exported)
    log.info("astra-sglang: patched %s in pid %d", ", ".join(states) or "nothing", os.getpid())
    return patcher


def _export_env(ops, built, candidates, self_check, cdir, plan) -> None:
    """So that SGLang processes started from here (spawn or fork) activate the same patch."""
    os.environ[_cfg.ENV_OPS] = ",".join(ops) if ops else "none"
    if built:
        os.environ[_cfg.ENV_LIBS] = _cfg.format_pairs(built)
    if candidates:
        os.environ[_cfg.ENV_CANDIDATES] = _cfg.format_pairs(candidates)
    os.environ[_cfg.ENV_SELF_CHECK] = self_check
    os.environ[_cfg.ENV_COUNTER_DIR] = str(cdir)
    if plan:
        os.environ[_cfg.ENV_PLAN] = str(plan)
    else:  # an earlier apply's plan must not reach this one's children
        os.environ.pop(_cfg.ENV_PLAN, None)
    pp = os.environ.get("PYTHONPATH", "")
    if str(STARTUP_DIR) not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR)] + ([pp] if pp else []))


def revert_astra_kernels() -> None:
    """Undo apply_astra_kernels() in this process."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.revert()
    _ACTIVE = None


def counters(directory: Optional[Union[str, Path]] = None) -> Dict[str, Dict[str, int]]:
    """Per-op counters summed over every process writing to `directory`
    (default: $ASTRA_SGLANG_COUNTER_DIR, else this process's default directory)."""
    if directory is None and _ACTIVE is not None:
        st = next(iter(_ACTIVE.states.values()), None)
        if st is not None:
            directory = st.counters.dir
    return totals(Path(directory) if directory else None)


__all__ = [
    "apply_astra_kernels",
    "revert_astra_kernels",
    "active_patcher",
    "counters",
    "read_counters",
    "totals",
    "patchable_ops",
]
