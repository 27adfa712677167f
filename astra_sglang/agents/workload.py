"""Workload-aware prompts: each timed shape's regime, measured from the run, and the strategies that
fit it.

  latency-bound    production's time is within LATENCY_X of the graph launch floor: the launch and
                   one trip to memory, not the bytes, set the time (decode shapes)
  bandwidth-bound  production moves its bytes at >= BANDWIDTH_PCT of the measured copy ceiling
                   (prefill shapes)
  in between       neither

The regime compares production's chained time with the launch floor and its bandwidth with the copy
ceiling, all three measured the same way (back-to-back calls in a CUDA graph). The prompt shows the
in-context time too where bench measured one (`context_*` in its rows: the op between a producer and
a consumer GEMM, what serving sees), and which basis the speedup uses.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

from .executor import Timing

LATENCY_X = 4.0  # within 4x the launch floor: an empty kernel's cost plus about one DRAM round trip
BANDWIDTH_PCT = 70.0  # the copy kernel itself reaches ~90%; 70% leaves little beyond vectors and ILP

STRATEGIES = (
    "Strategies by regime (the workload table gives each timed shape's):\n"
    "- latency-bound (time near the launch floor; decode shapes): the fixed cost dominates, not the bytes. "
    "Shorten the dependent chain: one wave (grid <= SM count), each thread issues all its loads before any "
    "math, no grid-stride loop, no shared-memory staging or block-wide barrier unless the op needs a "
    "reduction, no second pass. Programmatic dependent launch (wait for the previous grid only before the "
    "first dependent read) overlaps the launch with the neighbour kernel. Judge these shapes by the "
    "in-context time: chained speedups on them overstate what serving sees (a kernel overlapping its own "
    "previous call gains nothing between GEMMs). Where the timing table has an `attainable` column (bench timed "
    "a do-nothing kernel in the same place), that is the most any kernel can reach on the row: near 1.0x no "
    "rewrite of this kernel pays, only removing its launch (fusing it into a neighbour) does.\n"
    "- bandwidth-bound (high % of the copy ceiling; prefill shapes): bytes dominate. 16-byte vector loads and "
    "stores, fully coalesced; enough bytes in flight per SM (unroll, several independent vectors per thread); "
    "read each input once; streaming cache hints for data touched once. Above ~90% of the ceiling little "
    "is left: do not trade correctness or small-shape time for it.\n"
    "- in between: both matter. Check waves and tails (grid vs SM count), occupancy, vector width, loads in "
    "flight; this is where tiling and data-movement layout pay.\n"
    "CuTe (where the language notes say its headers are on the include path) helps when the layout of data "
    "movement is the problem: 2-D tiles, a row reduction spread over threads, shared-memory staging, "
    "vectorized or asynchronous copies (TiledCopy, cp.async/TMA) with the layout algebra checking the "
    "indexing. It does not make an elementwise kernel on latency-bound shapes faster (a plain vectorized "
    "loop compiles to the same code) and it costs compile time per candidate."
)


@dataclass
class ShapeRegime:
    shape: str
    dtype: str
    regime: str  # "latency-bound" | "bandwidth-bound" | "in between" | "unknown"
    why: str
    basis: str  # what the speedup uses: "in-context" | "chained"
    prod_chained_us: float
    cand_chained_us: float
    prod_context_us: Optional[float]
    cand_context_us: Optional[float]
    prod_pct_ceiling: Optional[float]
    speedup: float

    def to_json(self) -> Dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def classify(t: Timing, launch_floor_us: Optional[float]) -> ShapeRegime:
    """The regime of one timed (shape, dtype), from production's numbers."""
    pct = t.baseline_pct_ceiling
    if launch_floor_us and t.baseline_us <= LATENCY_X * launch_floor_us:
        regime, why = "latency-bound", f"{t.baseline_us / launch_floor_us:.1f}x the {launch_floor_us:.2f} µs launch floor"
    elif pct is not None and pct >= BANDWIDTH_PCT:
        regime, why = "bandwidth-bound", f"{pct:.0f}% of the copy ceiling"
    elif pct is not None or launch_floor_us:
        parts = []
        if launch_floor_us:
            parts.append(f"{t.baseline_us / launch_floor_us:.1f}x the launch floor")
        if pct is not None:
            parts.append(f"{pct:.0f}% of the copy ceiling")
        regime, why = "in between", ", ".join(parts)
    else:
        regime, why = "unknown", "this executor measured neither a launch floor nor a copy ceiling"
    return ShapeRegime(
        shape="x".join(map(str, t.shape)), dtype=t.dtype, regime=regime, why=why, basis=t.basis,
        prod_chained_us=t.baseline_us, cand_chained_us=t.candidate_us, prod_context_us=t.context_base_us,
        cand_context_us=t.context_cand_us, prod_pct_ceiling=pct, speedup=t.speedup)


def regimes(timings: Sequence[Any], info: Optional[Dict[str, Any]]) -> List[ShapeRegime]:
    floor = (info or {}).get("launch_floor_us") or None
    return [classify(t if isinstance(t, Timing) else Timing.from_json(t), floor) for t in timings]


def _us(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.2f}"


def workload_table(regs: Sequence[ShapeRegime], subject: str = "current kernel") -> str:
    """The per-shape table the planning agent reads."""
    if not regs:
        return "(no timings yet)"
    lines = [f"| shape | dtype | regime (production) | production µs in-context / chained | {subject} µs "
             "in-context / chained | speedup (basis) |", "|---|---|---|---|---|---|"]
    for r in regs:
        lines.append(f"| {r.shape} | {r.dtype} | {r.regime}: {r.why} | {_us(r.prod_context_us)} / "
                     f"{_us(r.prod_chained_us)} | {_us(r.cand_context_us)} / {_us(r.cand_chained_us)} | "
                     f"{r.speedup:.3f}x ({r.basis}) |")
    counts: Dict[str, int] = {}
    for r in regs:
        counts[r.regime] = counts.get(r.regime, 0) + 1
    lines.append("")
    lines.append("Regimes: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + "." + (
        "" if any(r.prod_context_us is not None for r in regs) else
        " In-context times were not measured by this bench: the chained times are the basis."))
    return "\n".join(lines)


def summary(regs: Sequence[ShapeRegime]) -> List[Dict[str, Any]]:
    """What the log keeps of the prompt's workload table."""
    return [{"shape": r.shape, "dtype": r.dtype, "regime": r.regime, "basis": r.basis} for r in regs]
