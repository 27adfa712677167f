"""bench's verdict rules (pure): which time a row's speedup uses, and which numbers are impossible.

- Basis: decode shapes (<= DECODE_MAX_TOKENS tokens) use the in-context time (the op between a
  producer and a consumer GEMM, marginal time) when it was measured; larger shapes use the chained
  time (back-to-back calls, L2-cold). Chained calls of one kernel let a kernel overlap its *own*
  previous call (PDL), which a model's graph never does: serving sees the in-context number.
- Impossible: achieved bytes/s above the measured copy ceiling by more than the measured spread
  (of the row and of the ceiling) plus COPY_CEILING_MARGIN, or a chained per-call time under the
  graph launch floor by more than the spread. The margin is measured, not a guess: the SM copy
  kernel moves bytes 1:1 read:write, and on the H200 (2026-11-23) the shipped silu_and_mul, 2:1
  read:write, reached 4237 GB/s against a 4115 GB/s copy ceiling (103%) at 1024x14336 with a 0.5%
  spread; a kernel skipping work while captured showed 316%. A pure read stream is faster than a 1:1 copy: the
  measured read ceiling (an SM read kernel), where given, is the bound when it is higher (on the H200 a decode GEMV's
  weight stream reached 4575 GB/s against a 4095 GB/s copy ceiling, 112%). Either fails the implementation with that reason. Only L2-cold chained times
  are judged (in context the inputs come L2-hot from the producer, and L2-warm runs beat DRAM).
"""
from __future__ import annotations

from typing import Optional, Sequence

DECODE_MAX_TOKENS = 256
COPY_CEILING_MARGIN = 0.10  # how far above the 1:1 copy ceiling a kernel of another read:write mix may go
IN_CONTEXT = "in-context"
CHAINED = "chained"


def timing_basis(dims: Sequence[int], has_context: bool) -> str:
    return IN_CONTEXT if has_context and dims and int(dims[0]) <= DECODE_MAX_TOKENS else CHAINED


def achieved_gbps(bytes_moved: int, us: float) -> Optional[float]:
    return bytes_moved / (us * 1e3) if us and us > 0 else None


def impossible(who: str, us: float, spread: float, bytes_moved: int, ceiling_gbps: float, ceiling_spread: float,
               floor_us: float, floor_spread: float = 0.0, read_ceiling_gbps: Optional[float] = None) -> str:
    """'' when the time is possible, else the reason (one line)."""
    if us is None or us <= 0:
        return f"{who}: non-positive time per call ({us})"
    bw = achieved_gbps(bytes_moved, us)
    slack = max(spread or 0.0, ceiling_spread or 0.0)
    copy_bound = ceiling_gbps * (1.0 + COPY_CEILING_MARGIN + slack) if ceiling_gbps else 0.0
    read_bound = read_ceiling_gbps * (1.0 + slack) if read_ceiling_gbps else 0.0
    if bw and ceiling_gbps and bw > max(copy_bound, read_bound):
        read = f" and the measured read ceiling {read_ceiling_gbps:.0f} GB/s" if read_ceiling_gbps else ""
        return (f"{who}: impossible number: {bw:.0f} GB/s achieved ({bytes_moved} bytes in {us:.3f} µs) is above the "
                f"measured copy ceiling {ceiling_gbps:.0f} GB/s by more than the measured spread ({100 * slack:.1f}%) "
                f"and the {100 * COPY_CEILING_MARGIN:.0f}% read:write-mix margin{read}")
    fslack = max(spread or 0.0, floor_spread or 0.0)
    if floor_us and us < floor_us * (1.0 - fslack):
        return (f"{who}: impossible number: {us:.3f} µs per call is under the graph launch floor "
                f"{floor_us:.3f} µs (an empty kernel) by more than the measured spread ({100 * fslack:.1f}%)")
    return ""
