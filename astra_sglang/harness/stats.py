"""Timing statistics (pure Python, no numpy), the one geomean of the project.

- each implementation is timed as R replays of a CUDA graph; the per-call time of a replay
  is its time over the calls in it; we report the median over replays;
- spread = (p90 - p10) / median over the replays: the relative width of the middle 80%;
- a candidate/production difference smaller than the larger of the two spreads is noise; in context, where the two
  are timed in the same replay rounds, a row is noise when the 95% confidence interval of the median of their paired
  per-round differences contains 0 (distribution-free, order statistics): that interval narrows with more replays,
  the spread does not;
- geomean = geometric mean of the per-shape speedups (production time / candidate time).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence, Tuple


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not xs:
        raise ValueError("percentile of no samples")
    s = sorted(xs)
    if len(s) == 1:
        return float(s[0])
    pos = (len(s) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def median(xs: Sequence[float]) -> float:
    return percentile(xs, 50.0)


def spread(xs: Sequence[float]) -> float:
    """(p90 - p10) / median: 0.02 means the middle 80% of replays lie within 2% of each other."""
    m = median(xs)
    if m <= 0:
        return 0.0
    return (percentile(xs, 90.0) - percentile(xs, 10.0)) / m


def geomean(xs: Iterable[float]) -> Optional[float]:
    v = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not v:
        return None
    return math.exp(sum(math.log(x) for x in v) / len(v))


def is_noise(prod_us: float, prod_spread: float, cand_us: float, cand_spread: float) -> bool:
    """True when the two medians differ by less than the larger measured spread."""
    if prod_us <= 0:
        return False
    return abs(cand_us - prod_us) / prod_us < max(prod_spread, cand_spread)


def pct_of_ceiling(bytes_moved: int, us: float, ceiling_gbps: float) -> Optional[float]:
    if not us or not ceiling_gbps:
        return None
    return 100.0 * (bytes_moved / (us * 1e-6)) / (ceiling_gbps * 1e9)


def marginal(with_op: Sequence[float], without: Sequence[float]) -> dict:
    """The op's marginal time from interleaved replays: per replay r, with_op[r] - without[r] (the graph
    with the op minus the same graph without it, replayed next to each other). Returns the median and
    the spread in the samples' unit (p90 - p10 of the differences: a difference can be near zero, so a
    relative spread would mean nothing)."""
    n = min(len(with_op), len(without))
    if not n:
        raise ValueError("marginal time of no samples")
    d = [with_op[i] - without[i] for i in range(n)]
    return {"median": median(d), "spread": percentile(d, 90.0) - percentile(d, 10.0), "samples": d}


def median_ci(xs: Sequence[float], conf: float = 0.95) -> Optional[Tuple[float, float]]:
    """A distribution-free confidence interval of the median of xs (the order statistics x_(k), x_(n+1-k), k the
    largest with P(Binomial(n, 1/2) <= k - 1) <= (1 - conf) / 2), coverage at least `conf`. None for too few samples
    (fewer than 6 at 95%). With 8 samples it is [min, max] (99.2%); it narrows as 1/sqrt(n)."""
    n = len(xs)
    alpha = (1.0 - conf) / 2.0
    k, tail = 0, 0.0
    for j in range(n // 2 + 1):   # tail = P(B <= j)
        tail += math.comb(n, j) / (1 << n)   # exact integers: 2.0 ** n overflows a float from n = 1024
        if tail > alpha:
            break
        k = j + 1
    if k < 1:
        return None
    s = sorted(xs)
    return float(s[k - 1]), float(s[n - k])


def paired_ci(a: Sequence[float], b: Sequence[float], conf: float = 0.95) -> Optional[Tuple[float, float]]:
    """median_ci of the per-round differences a[r] - b[r] (two series timed in the same replay rounds), or None."""
    n = min(len(a), len(b))
    return median_ci([a[i] - b[i] for i in range(n)], conf) if n else None


def paired_noise(ci: Sequence[float], speedup: float) -> bool:
    """The in-context noise rule on a paired interval of the time saved (paired_ci, production - candidate): not
    resolved while it holds 0, or where it disagrees in sign with the speedup (a ratio of medians: with jittery
    neighbours the two can)."""
    return ci[0] <= 0.0 <= ci[1] or (ci[0] > 0.0) != (speedup > 1.0)
