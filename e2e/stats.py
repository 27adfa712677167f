"""The e2e driver's logic, without a server: A/B schedule, per-run metrics, confidence
intervals, greedy-token parity, the Markdown report and the plot.

Everything here is plain data in, plain data out (numpy only), so CI tests it on a CPU.

Terms
- arm: "A" (baseline, unpatched) or "B" (patched).
- run: one pass of one workload against one arm (all its prompts, at its concurrency).
- round: one A run and one B run, in ABBA order across rounds so that a slow drift
  (clocks, thermals, the allocator warming) affects both arms alike.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from astra_sglang.figures import save_figure

ARMS = ("A", "B")


# --------------------------------------------------------------------------- schedule

def ab_schedule(rounds: int, warmup: int = 1, first: str = "A") -> List[Tuple[int, str]]:
    """Interleaved order of (round, arm). Warm-up runs get round -1 (discarded by the stats).

    Round r runs AB when r is even and BA when odd (ABBA...), so each arm is first in
    half the rounds and sits at the same mean position in time.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    a, b = (first, "B" if first == "A" else "A")
    order: List[Tuple[int, str]] = []
    for _ in range(warmup):
        order += [(-1, a), (-1, b)]
    for r in range(rounds):
        order += [(r, a), (r, b)] if r % 2 == 0 else [(r, b), (r, a)]
    return order


def calibrated_schedule(rounds: int, warmup: int = 1) -> List[Tuple[int, str]]:
    """(round, arm) for arms A, B and A2 (a second unpatched server, the A/A control): round r runs them rotated by
    r, so over every three rounds each arm takes each position once."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    arms = ("A", "B", "A2")
    order = [(-1, x) for _ in range(warmup) for x in arms]
    for r in range(rounds):
        order += [(r, arms[(i + r) % 3]) for i in range(3)]
    return order


def aa_runs(runs: Sequence["Run"]) -> List["Run"]:
    """A against A2 as an A/B of their own (A2 relabelled B), for the A/A control of a calibrated run."""
    return [r if r.arm == "A" else replace(r, arm="B") for r in runs if r.arm in ("A", "A2")]


# --------------------------------------------------------------------------- records

@dataclass
class RequestResult:
    """One streamed request, as the client saw it. Times are seconds (perf_counter)."""

    prompt_id: int
    t_start: float
    t_first: Optional[float]           # first chunk carrying output tokens
    t_end: float
    chunk_times: List[float]           # arrival of each chunk that carried tokens
    chunk_tokens: List[int]            # cumulative completion tokens after each such chunk
    output_ids: List[int]
    prompt_len: int = 0
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_first is not None and len(self.output_ids) > 0

    @property
    def n_out(self) -> int:
        return len(self.output_ids)

    @property
    def ttft(self) -> float:
        return self.t_first - self.t_start

    @property
    def latency(self) -> float:
        return self.t_end - self.t_start

    @property
    def tpot(self) -> Optional[float]:
        """Mean time per output token after the first (None with a single token)."""
        if self.n_out < 2:
            return None
        return (self.chunk_times[-1] - self.t_first) / (self.n_out - 1)

    def itls(self) -> List[float]:
        """Inter-token latencies: each gap between chunks, spread over the tokens it carried."""
        out = []
        for i in range(1, len(self.chunk_times)):
            k = self.chunk_tokens[i] - self.chunk_tokens[i - 1]
            if k <= 0:
                continue
            gap = self.chunk_times[i] - self.chunk_times[i - 1]
            out += [gap / k] * k
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RequestResult":
        return cls(**d)


@dataclass
class Run:
    workload: str
    arm: str
    round: int
    results: List[RequestResult]
    t_begin: float = 0.0
    t_finish: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "arm": self.arm, "round": self.round, "t_begin": self.t_begin,
                "t_finish": self.t_finish, "extra": self.extra, "results": [r.to_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, d: dict) -> "Run":
        return cls(d["workload"], d["arm"], d["round"], [RequestResult.from_dict(r) for r in d["results"]],
                   d.get("t_begin", 0.0), d.get("t_finish", 0.0), d.get("extra", {}))


# --------------------------------------------------------------------------- per-run metrics

METRICS = {
    # name: (label, unit, higher_is_better)
    "output_throughput": ("output throughput", "tok/s", True),
    "request_throughput": ("request throughput", "req/s", True),
    "ttft_mean": ("TTFT mean", "ms", False),
    "ttft_median": ("TTFT median", "ms", False),
    "ttft_p99": ("TTFT p99", "ms", False),
    "tpot_mean": ("TPOT mean", "ms", False),
    "tpot_median": ("TPOT median", "ms", False),
    "itl_mean": ("ITL mean", "ms", False),
    "itl_p10": ("ITL p10", "ms", False),  # the fastest steps: moves with a cost every decode step pays, not with stalls
    "itl_median": ("ITL median", "ms", False),
    "itl_p99": ("ITL p99", "ms", False),
    "latency_mean": ("E2E latency mean", "ms", False),
}
MS_METRICS = {k for k, v in METRICS.items() if v[1] == "ms"}


def run_metrics(run: Run) -> Dict[str, float]:
    """Aggregate one run. Throughput uses the run's wall span (first send .. last byte)."""
    ok = [r for r in run.results if r.ok]
    m: Dict[str, float] = {"n_ok": float(len(ok)), "n_failed": float(len(run.results) - len(ok))}
    if not ok:
        return m
    t0 = min(r.t_start for r in ok)
    t1 = max(r.t_end for r in ok)
    span = max(t1 - t0, 1e-9)
    m["duration_s"] = span
    m["output_tokens"] = float(sum(r.n_out for r in ok))
    m["output_throughput"] = m["output_tokens"] / span
    m["request_throughput"] = len(ok) / span
    ttft = np.array([r.ttft for r in ok]) * 1e3
    m["ttft_mean"], m["ttft_median"] = float(ttft.mean()), float(np.median(ttft))
    m["ttft_p99"] = float(np.percentile(ttft, 99))
    tpot = np.array([r.tpot for r in ok if r.tpot is not None]) * 1e3
    if tpot.size:
        m["tpot_mean"], m["tpot_median"] = float(tpot.mean()), float(np.median(tpot))
    itl = np.array([x for r in ok for x in r.itls()]) * 1e3
    if itl.size:
        m["itl_mean"], m["itl_median"] = float(itl.mean()), float(np.median(itl))
        m["itl_p10"], m["itl_p99"] = (float(v) for v in np.percentile(itl, [10, 99]))
    m["latency_mean"] = float(np.mean([r.latency for r in ok]) * 1e3)
    return m


def request_samples(runs: Iterable[Run], metric: str) -> np.ndarray:
    """Per-request (or per-token for ITL) samples of a metric, pooled over runs, in ms."""
    vals: List[float] = []
    for run in runs:
        for r in run.results:
            if not r.ok:
                continue
            if metric.startswith("ttft"):
                vals.append(r.ttft * 1e3)
            elif metric.startswith("tpot") and r.tpot is not None:
                vals.append(r.tpot * 1e3)
            elif metric.startswith("itl"):
                vals += [x * 1e3 for x in r.itls()]
            elif metric.startswith("latency"):
                vals.append(r.latency * 1e3)
    return np.asarray(vals, dtype=float)


# --------------------------------------------------------------------------- statistics

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularized incomplete beta (Lentz; Numerical Recipes)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t (bisection on the CDF; exact to ~1e-10)."""
    if not 0.0 < q < 1.0:
        raise ValueError("q must be in (0, 1)")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def t_interval(x: Sequence[float], conf: float = 0.95) -> Tuple[float, float, float]:
    """Mean and t-based confidence interval of the mean. (mean, lo, hi); nan bounds for n < 2."""
    x = np.asarray(x, dtype=float)
    mean = float(x.mean()) if x.size else float("nan")
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = t_ppf(0.5 + conf / 2.0, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def bootstrap_ratio_ci(a_rounds: Sequence[np.ndarray], b_rounds: Sequence[np.ndarray], stat=np.median,
                       n_boot: int = 2000, conf: float = 0.95, seed: int = 0) -> Tuple[float, float, float]:
    """stat(B)/stat(A) - 1 over the pooled samples, with a percentile bootstrap CI that resamples whole paired
    rounds (round r of A with round r of B), never single requests. Requests of one round share its host state: on
    a host-bound server the rounds drifted by up to 25% within one arm while each round's requests agreed to a few
    percent (H200, 2026-11-27), so requests resampled one by one gave intervals of +-1% around differences the next
    server start reversed. One round: no interval (nan)."""
    a_rounds = [np.asarray(x, float) for x in a_rounds]
    b_rounds = [np.asarray(x, float) for x in b_rounds]
    if len(a_rounds) != len(b_rounds):
        raise ValueError("paired rounds: A and B need the same number")
    if not a_rounds or not sum(x.size for x in a_rounds) or not sum(x.size for x in b_rounds):
        return float("nan"), float("nan"), float("nan")
    point = float(stat(np.concatenate(b_rounds)) / stat(np.concatenate(a_rounds)) - 1.0)
    n = len(a_rounds)
    if n < 2:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    cache: Dict[Tuple[int, ...], float] = {}   # few rounds: few distinct multisets (35 for 4 rounds)
    ratios = np.empty(n_boot)
    for k, idx in enumerate(rng.integers(0, n, size=(n_boot, n))):
        key = tuple(sorted(idx))
        if key not in cache:
            sa = np.concatenate([a_rounds[i] for i in key])
            sb = np.concatenate([b_rounds[i] for i in key])
            cache[key] = float(stat(sb) / stat(sa) - 1.0) if sa.size and sb.size else float("nan")
        ratios[k] = cache[key]
    ratios = ratios[~np.isnan(ratios)]
    if not ratios.size:
        return point, float("nan"), float("nan")
    lo, hi = np.percentile(ratios, [50 * (1 - conf), 100 - 50 * (1 - conf)])
    return point, float(lo), float(hi)


@dataclass
class Comparison:
    metric: str
    a_mean: float
    b_mean: float
    rel_change: float          # mean over rounds of (B_r / A_r - 1), paired by round
    rel_lo: float              # t-based CI of that mean (df = rounds - 1)
    rel_hi: float
    boot_point: float          # request-level: median(B) / median(A) - 1 (per-request metrics only), rounds
                               # resampled for its interval
    boot_lo: float
    boot_hi: float
    n_rounds: int

    @property
    def better(self) -> Optional[bool]:
        """True/False when the run-level CI excludes 0 (B better/worse), None when inconclusive."""
        if math.isnan(self.rel_lo):
            return None
        hib = METRICS.get(self.metric, ("", "", False))[2]
        if self.rel_lo > 0:
            return hib
        if self.rel_hi < 0:
            return not hib
        return None


def compare_arms(runs: Sequence[Run], workload: str, conf: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> Dict[str, Comparison]:
    """A vs B for one workload: run-level paired t CI and request-level bootstrap CI per metric."""
    by = {arm: {r.round: r for r in runs if r.workload == workload and r.arm == arm and r.round >= 0} for arm in ARMS}
    per = {arm: {rnd: run_metrics(r) for rnd, r in by[arm].items()} for arm in ARMS}
    rounds = sorted(set(per["A"]) & set(per["B"]))
    out: Dict[str, Comparison] = {}
    for metric in METRICS:
        pairs = [(per["A"][r][metric], per["B"][r][metric]) for r in rounds
                 if metric in per["A"][r] and metric in per["B"][r]]
        if not pairs:
            continue
        a = np.array([p[0] for p in pairs])
        b = np.array([p[1] for p in pairs])
        rel = b / a - 1.0
        mean, lo, hi = t_interval(rel, conf)
        bp = blo = bhi = float("nan")
        if metric in MS_METRICS:
            sa = [request_samples([by["A"][r]], metric) for r in rounds]
            sb = [request_samples([by["B"][r]], metric) for r in rounds]
            stat = _PERCENTILE_STATS.get(metric[-3:], np.median if metric.endswith("median") else np.mean)
            bp, blo, bhi = bootstrap_ratio_ci(sa, sb, stat, n_boot, conf, seed)
        out[metric] = Comparison(metric, float(a.mean()), float(b.mean()), mean, lo, hi, bp, blo, bhi, len(pairs))
    return out


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99))


def _p10(x: np.ndarray) -> float:
    return float(np.percentile(x, 10))


_PERCENTILE_STATS = {"p99": _p99, "p10": _p10}


# --------------------------------------------------------------------------- parity

def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first differing token (length difference counts); None when identical."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


@dataclass
class Parity:
    label: str
    n_compared: int
    n_identical: int
    divergence: List[int]       # first divergence position of each differing prompt
    mean_len: float

    @property
    def identical_frac(self) -> float:
        return self.n_identical / self.n_compared if self.n_compared else float("nan")

    def summary(self) -> str:
        if not self.n_compared:
            return f"{self.label}: nothing to compare"
        s = f"{self.label}: {self.n_identical}/{self.n_compared} identical"
        if self.divergence:
            d = np.array(self.divergence)
            s += (f"; first divergence at token min {d.min()}, median {np.median(d):.0f}, max {d.max()} "
                  f"(of ~{self.mean_len:.0f})")
        return s


def parity(runs_x: Sequence[Run], runs_y: Sequence[Run], label: str) -> Parity:
    """Compare greedy outputs prompt by prompt between two sets of runs (same prompts).

    Pairs run i of x with run i of y (sorted by round); within a pair, prompt_id matches.
    """
    xs = sorted(runs_x, key=lambda r: r.round)
    ys = sorted(runs_y, key=lambda r: r.round)
    n = same = 0
    div: List[int] = []
    lens: List[int] = []
    for rx, ry in zip(xs, ys):
        by = {r.prompt_id: r for r in ry.results if r.ok}
        for r in rx.results:
            o = by.get(r.prompt_id)
            if not r.ok or o is None:
                continue
            n += 1
            lens.append(len(r.output_ids))
            d = first_divergence(r.output_ids, o.output_ids)
            if d is None:
                same += 1
            else:
                div.append(d)
    return Parity(label, n, same, div, float(np.mean(lens)) if lens else 0.0)


def workload_parity(runs: Sequence[Run], workload: str) -> Dict[str, Parity]:
    """A vs B (same round), plus each arm against itself across rounds: the noise floor of
    greedy decoding under different batch compositions, which A vs B must be judged against."""
    w = [r for r in runs if r.workload == workload and r.round >= 0]
    A = [r for r in w if r.arm == "A"]
    B = [r for r in w if r.arm == "B"]
    out = {"A vs B": parity(A, B, "A vs B (same round)")}
    As, Bs = sorted(A, key=lambda r: r.round), sorted(B, key=lambda r: r.round)
    if len(As) > 1:
        out["A vs A"] = parity(As[:-1], As[1:], "A vs A (next round)")
    if len(Bs) > 1:
        out["B vs B"] = parity(Bs[:-1], Bs[1:], "B vs B (next round)")
    return out


# --------------------------------------------------------------------------- report

def _fmt(v: float, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if unit == "tok/s" or unit == "req/s":
        return f"{v:,.1f}"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"


def _pct(v: float) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:+.2f}%"


def summarize(runs: Sequence[Run], conf: float = 0.95, n_boot: int = 2000, seed: int = 0) -> dict:
    workloads = sorted({r.workload for r in runs}, key=lambda w: [r.workload for r in runs].index(w))
    out = {"workloads": {}}
    for w in workloads:
        cmp_ = compare_arms(runs, w, conf, n_boot, seed)
        par = workload_parity(runs, w)
        per_run = [{"arm": r.arm, "round": r.round, **run_metrics(r)} for r in runs if r.workload == w]
        out["workloads"][w] = {"comparisons": {k: asdict(v) for k, v in cmp_.items()},
                               "parity": {k: {**asdict(v), "identical_frac": v.identical_frac,
                                              "summary": v.summary()} for k, v in par.items()},
                               "runs": per_run}
    return out


def rounds_for(cm: Optional[dict], target: float = 0.02) -> str:
    """A sentence when a metric's rounds interval is wider than ±target: about how many rounds would bring it there
    (a t-interval narrows as 1/sqrt(rounds)). A host-bound server's rounds drift: the DeepSeek-shaped A/B at
    concurrency 8 had ±25% over 4 rounds (H200, 2026-11-27)."""
    if not cm or cm.get("n_rounds", 0) < 2 or math.isnan(cm["rel_lo"]):
        return ""
    half = (cm["rel_hi"] - cm["rel_lo"]) / 2
    if half <= target:
        return ""
    n = cm["n_rounds"]
    need = math.ceil(n * (half / target) ** 2 - 1e-9)
    return (f"Output throughput's interval is ±{half * 100:.1f}% over {n} rounds: the rounds vary that much. About "
            f"{need} rounds would bring it to ±{target * 100:.0f}% (`--rounds`), if the variation stays the same.")


def arm_spread(runs: Sequence[dict], metric: str = "output_throughput", ratio: float = 2.0,
               least: float = 0.03) -> str:
    """A sentence when one arm's measured rounds vary much more than the other's (coefficient of variation at least
    `ratio` times the other's, and above `least`): that arm is unstable on this setup, and its Δ moves with it. The
    MoE model at batch 1 read 506-668 tok/s in arm B over 12 rounds while arm A held 468-548 (H200, 2026-11-27):
    a faster GPU step can leave a server host-bound, where host jitter shows."""
    cv = {}
    for arm in ARMS:
        vals = [r[metric] for r in runs if r.get("arm") == arm and r.get("round", 0) >= 0 and metric in r]
        if len(vals) < 3 or not np.mean(vals):
            return ""
        cv[arm] = float(np.std(vals, ddof=1) / np.mean(vals))
    hi, lo = ("B", "A") if cv["B"] >= cv["A"] else ("A", "B")
    if cv[hi] < least or cv[hi] < ratio * max(cv[lo], 1e-12):
        return ""
    return (f"Arm {hi}'s rounds vary {cv[hi] / max(cv[lo], 1e-12):.1f}× as much as arm {lo}'s ({METRICS[metric][0]} "
            f"CV {cv[hi] * 100:.1f}% against {cv[lo] * 100:.1f}%): arm {hi} is unstable on this setup, and the Δ "
            f"moves with it. A host-bound server shows host jitter (`--server-profile` tells).")


def noise_floor(lo: float, hi: float) -> Tuple[float, bool]:
    """(floor, biased) an A/A interval [lo, hi] sets for a Δ: its half-width; where it excludes 0 (the arms differ by
    a steady offset), its far edge instead. The step A/B (step_stats) and the served one judge alike."""
    biased = lo > 0 or hi < 0
    return (max(abs(lo), abs(hi)) if biased else (hi - lo) / 2), biased


def resolved(delta: float, lo: float, hi: float, floor: Optional[float]) -> bool:
    """A Δ is resolved when its interval excludes 0 and it exceeds the floor (None: no A/A to judge by)."""
    return (lo > 0 or hi < 0) and (floor is None or abs(delta) > floor)


def judged(metric: str, delta: float, lo: float, hi: float, floor: Optional[float]) -> str:
    """The verdict of a served Δ against an A/A's floor: "resolved: B better" / "resolved: B worse" / "not resolved"
    (better as the metric counts it: higher throughput, lower latency)."""
    if not resolved(delta, lo, hi, floor):
        return "not resolved"
    return "resolved: B " + ("better" if (delta > 0) == METRICS[metric][2] else "worse")


def ab_parity(workload: dict) -> str:
    """A summarized workload's same-round A vs B greedy-token parity line ('' when it has none)."""
    same = [p for p in workload.get("parity", {}).values() if p.get("label", "").startswith("A vs B")]
    return same[0].get("summary", "") if same else ""


FLOOR_METRICS = ("output_throughput", "tpot_mean", "itl_median", "ttft_mean")


def floor_markdown(ab: dict, aa: dict, metrics: Sequence[str] = FLOOR_METRICS) -> str:
    """The A/B's rounds Δ against the floor its A/A sets (as `e2e --step` does): the A/A's CI half-width, or its far
    edge where that CI excludes 0 (the servers differ by a steady offset). Resolved: the A/B's CI excludes 0 and
    |Δ| exceeds the floor."""
    lines = ["| workload | metric | A/B Δ (rounds) | A/A Δ | floor | verdict |", "|---|---|---:|---:|---:|---|"]
    for w, d in ab.get("workloads", {}).items():
        for m in metrics:
            c, f = d["comparisons"].get(m), aa.get("workloads", {}).get(w, {}).get("comparisons", {}).get(m)
            if not c or not f or any(math.isnan(v) for v in (c["rel_lo"], c["rel_hi"], f["rel_lo"], f["rel_hi"])):
                continue
            floor, biased = noise_floor(f["rel_lo"], f["rel_hi"])
            verdict = judged(m, c["rel_change"], c["rel_lo"], c["rel_hi"], floor)
            lines.append(f"| {w} | {METRICS[m][0]} | {_pct(c['rel_change'])} [{_pct(c['rel_lo'])}, "
                         f"{_pct(c['rel_hi'])}] | {_pct(f['rel_change'])} [{_pct(f['rel_lo'])}, {_pct(f['rel_hi'])}]"
                         f"{' (offset)' if biased else ''} | {floor * 100:.2f}% | {verdict} |")
    return "\n".join(lines) + "\n"


def report_markdown(summary: dict, meta: Optional[dict] = None, conf: float = 0.95) -> str:
    lines: List[str] = []
    meta = meta or {}
    if meta:
        lines.append("| | |\n|---|---|")
        for k, v in meta.items():
            lines.append(f"| {k} | {v} |")
        lines.append("")
    c = int(round(conf * 100))
    for w, d in summary["workloads"].items():
        lines.append(f"### {w}\n")
        lines.append(f"A = baseline (unpatched), B = patched. Δ = B/A − 1, mean over paired rounds with a "
                     f"{c}% t-interval; request-level Δ = ratio of medians (means for *mean* metrics) over every "
                     f"request, with a {c}% bootstrap interval that resamples whole rounds (a round's requests share "
                     f"its host state). The verdict reads the rounds. A gap between servers that stays the same "
                     f"every round shows in neither interval: an `--aa` run on the same setup measures it.\n")
        lines.append("| metric | A | B | Δ (rounds) | " + f"{c}% CI" + " | Δ (requests) | " + f"{c}% CI" + " | verdict |")
        lines.append("|---|---:|---:|---:|---|---:|---|---|")
        for m, cm in d["comparisons"].items():
            label, unit, _ = METRICS[m]
            comp = Comparison(**cm)
            verdict = {True: "B better", False: "B worse", None: "no significant difference"}[comp.better]
            boot_ci = "—" if math.isnan(cm["boot_lo"]) else f"[{_pct(cm['boot_lo'])}, {_pct(cm['boot_hi'])}]"
            lines.append(f"| {label} ({unit}) | {_fmt(cm['a_mean'], unit)} | {_fmt(cm['b_mean'], unit)} | "
                         f"{_pct(cm['rel_change'])} | [{_pct(cm['rel_lo'])}, {_pct(cm['rel_hi'])}] | "
                         f"{_pct(cm['boot_point'])} | {boot_ci} | {verdict} |")
        lines.append("")
        more = rounds_for(d["comparisons"].get("output_throughput"))
        if more:
            lines.append(more + "\n")
        shaky = arm_spread(d.get("runs", []))
        if shaky:
            lines.append(shaky + "\n")
        lines.append("Parity (greedy, temperature 0):\n")
        for p in d["parity"].values():
            lines.append(f"- {p['summary']}")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict, path: str, metrics: Sequence[str] = ("output_throughput", "ttft_median", "tpot_median",
                                                             "itl_median")) -> Optional[str]:
    """Per workload and metric: each run's value for A and B (dots, by round) and the means."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    wls = list(summary["workloads"])
    fig, axes = plt.subplots(len(wls), len(metrics), figsize=(3.4 * len(metrics), 3.0 * len(wls)), squeeze=False)
    for i, w in enumerate(wls):
        runs = [r for r in summary["workloads"][w]["runs"] if r["round"] >= 0]
        comps = summary["workloads"][w]["comparisons"]
        for j, m in enumerate(metrics):
            ax = axes[i][j]
            label, unit, _ = METRICS[m]
            for k, arm in enumerate(ARMS):
                vals = [r[m] for r in runs if r["arm"] == arm and m in r]
                xs = np.full(len(vals), k) + np.linspace(-0.12, 0.12, max(len(vals), 1))[:len(vals)]
                ax.scatter(xs, vals, s=18, color=("tab:gray", "tab:blue")[k], zorder=3)
                if vals:
                    ax.hlines(np.mean(vals), k - 0.25, k + 0.25, color="k", lw=1.5)
            ax.set_xticks([0, 1], ["A base", "B patched"])
            title = f"{w}: {label}"
            if m in comps:
                cm = comps[m]
                title += f"\nΔ {_pct(cm['rel_change'])} [{_pct(cm['rel_lo'])}, {_pct(cm['rel_hi'])}]"
            ax.set_title(title, fontsize=8)
            ax.set_ylabel(unit, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xlim(-0.6, 1.6)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path
