"""Environment variables that steer patching inside SGLang's processes.

The CLI (`astra-sglang patch --serve`) sets them for the server; every SGLang process
(spawned or forked) inherits them and activates the patch from SGLang's plugin entry
point or from the start-up hook (patch/_startup/sitecustomize.py). The Python API
takes the same settings as arguments.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from astra_sglang.errors import AstraError

# Turns everything off: no hook installs anything, apply_astra_kernels() is a no-op.
ENV_DISABLE = "ASTRA_SGLANG_DISABLE"
# Which ops to patch in server processes: "silu_and_mul,fused_add_rmsnorm", "all" or "none".
# Unset means the hooks stay inert (installing astra-sglang changes nothing by itself).
ENV_OPS = "ASTRA_SGLANG_OPS"
# Candidate kernels: "op=/path/a.cu;op2=/path/b.cu" (replace kernels/<op>/kernel.cu).
ENV_CANDIDATES = "ASTRA_SGLANG_CANDIDATES"
# Prebuilt libraries: "op=/path/a.so;..." (the CLI builds once and passes these down,
# so N TP workers do not run nvcc N times).
ENV_LIBS = "ASTRA_SGLANG_LIBS"
# Where each process writes its counters (<dir>/<pid>.cnt + <pid>.json).
ENV_COUNTER_DIR = "ASTRA_SGLANG_COUNTER_DIR"
# Self-check policy: "first" (once per op, dtype and shape class; default), "always", "off".
ENV_SELF_CHECK = "ASTRA_SGLANG_SELF_CHECK"
# Target arch for builds when nvidia-smi is not usable (e.g. "sm_90").
ENV_ARCH = "ASTRA_SGLANG_ARCH"
# Discovery plan (JSON written by the CLI): JIT factories to wrap, sites to expect.
ENV_PLAN = "ASTRA_SGLANG_PLAN"

# Test flag, for fault drills only: "op[@RANK][,op2[@RANK]]" makes the self-check of each named op
# fail in the processes of that rank ("TP1"; every process without @RANK) by corrupting the astra
# kernel's output after it ran, so the whole failure path runs for real: the mismatch is found,
# SGLang's original serves that call and the op is disabled in that process, loudly.
ENV_FAULT_DRILL = "ASTRA_SGLANG_FAULT_DRILL"

SELF_CHECK_MODES = ("first", "always", "off")


def fault_drill(op: str, rank: Optional[str], environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ENV_FAULT_DRILL asks `op`'s self-check to fail in a process of `rank` ("TP1 EP1")."""
    text = (environ if environ is not None else os.environ).get(ENV_FAULT_DRILL, "")
    ranks = (rank or "").split()
    for item in text.replace(";", ",").split(","):
        name, _, want = item.strip().partition("@")
        if name == op and (not want or want.strip() in ranks):
            return True
    return False


def disabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    v = (environ if environ is not None else os.environ).get(ENV_DISABLE, "")
    return v.strip().lower() not in ("", "0", "false", "no", "off")


def default_ops(known: List[str]) -> List[str]:
    """What 'all' patches: every patchable op whose adapter does not say why it stays off by default
    (DEFAULT_OFF in kernels/<op>/adapter.py: slower in context, or not yet measured there). Such an
    op is still patched when named."""
    from astra_sglang.registry import op_part

    return [o for o in known if not getattr(op_part(o, "adapter"), "DEFAULT_OFF", "")]


def parse_ops(text: Optional[str], known: List[str], default: Optional[List[str]] = None) -> List[str]:
    """'a,b' / 'all' / 'all,c' / 'all,-d' / 'none' -> list of op names (validated against `known`). 'all' is
    `default` (the ops patched unless named: see patch.default_ops) when given, else every known op; 'all,c' adds
    c, an op that is off by default, to them; '-d' takes d out (a step A/B of everything but one op)."""
    if text is None:
        return []
    t = text.strip()
    if t.lower() in ("", "none"):
        return []
    ops = [p.strip() for p in t.split(",") if p.strip()]
    everything = [o for o in ops if o.lower() == "all"]
    drop = {o[1:].strip() for o in ops if o.startswith("-")}
    ops = [o for o in ops if o.lower() != "all" and not o.startswith("-")]
    bad = [o for o in ops + sorted(drop) if o not in known]
    if bad:
        raise AstraError(f"unknown op(s) {', '.join(bad)}; known ops: {', '.join(known)}")
    if everything:
        ops = list(known if default is None else default) + ops
    return [o for o in dict.fromkeys(ops) if o not in drop]


def parse_pairs(text: Optional[str], what: str) -> Dict[str, Path]:
    """'op=/path;op2=/path2' (';' or ',' separated) -> {op: Path}."""
    out: Dict[str, Path] = {}
    if not text:
        return out
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise AstraError(f"bad {what} {part!r}: give it as op=PATH")
        op, path = part.split("=", 1)
        out[op.strip()] = Path(path.strip()).expanduser()
    return out


def format_pairs(pairs: Mapping[str, Path]) -> str:
    return ";".join(f"{k}={v}" for k, v in pairs.items())


@dataclass
class PatchConfig:
    """Everything apply() needs; from the environment or from the Python API."""

    ops: List[str]
    candidates: Dict[str, Path] = field(default_factory=dict)
    libs: Dict[str, Path] = field(default_factory=dict)
    self_check: str = "first"
    counter_dir: Optional[Path] = None
    plan: Optional[Path] = None

    @classmethod
    def from_env(cls, known: List[str], environ: Optional[Mapping[str, str]] = None) -> "PatchConfig":
        env = environ if environ is not None else os.environ
        mode = env.get(ENV_SELF_CHECK, "first").strip().lower() or "first"
        if mode not in SELF_CHECK_MODES:
            raise AstraError(f"{ENV_SELF_CHECK}={mode!r}: use one of {', '.join(SELF_CHECK_MODES)}")
        cdir = env.get(ENV_COUNTER_DIR)
        plan = env.get(ENV_PLAN)
        return cls(
            ops=parse_ops(env.get(ENV_OPS), known, default_ops(known)),
            candidates=parse_pairs(env.get(ENV_CANDIDATES), "candidate"),
            libs=parse_pairs(env.get(ENV_LIBS), "library"),
            self_check=mode,
            counter_dir=Path(cdir) if cdir else None,
            plan=Path(plan) if plan else None,
        )
