"""What the loop needs from whoever compiles, checks and times candidates.

Two implementations: `GpuExecutor` (gpu_executor.py) calls astra_sglang.harness (check / bench)
on the extracted workspace; `StandinExecutor` (standin.py) compiles C candidates with the host
compiler and checks/times them on the CPU, so the loop runs offline in CI.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..harness.stats import paired_noise

Dims = Tuple[int, ...]


class ExecutorError(Exception):
    """A tool the executor relies on is unavailable (no ncu, profiler not permitted, ...)."""


def numel(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def shape_key(dims: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in dims)


def parse_shape(text: str) -> Dims:
    parts = str(text).strip().lower().replace("×", "x").replace(",", "x").split("x")
    return tuple(int(p) for p in parts if p.strip())


@dataclass
class ExtraTests:
    """Shapes checked on top of the mandatory suite (never instead of it): the timed shapes and the
    testing agent's. Every shape runs every distribution of the op's spec."""

    shapes: List[Dims] = field(default_factory=list)

    def merged(self, shapes: Sequence[Dims]) -> "ExtraTests":
        return ExtraTests(list(dict.fromkeys(list(self.shapes) + [tuple(x) for x in shapes])))


@dataclass
class CompileResult:
    ok: bool
    error: str = ""  # the first error line, for the log and the terminal
    log: str = ""  # the compiler's output (truncated), fed back to the coding agent
    seconds: float = 0.0


@dataclass
class CheckResult:
    ok: bool
    reason: str  # why it failed, or what passed ("48 cases passed")
    cases: int = 0
    detail: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Timing:
    """One (shape, dtype) of a production-vs-candidate interleaved timing run, µs per call: chained
    (back-to-back calls) and, where bench measured it, in context (between a producer and a consumer
    GEMM, marginal time). `timing_basis` says which one the speedup uses."""

    shape: Dims
    dtype: str
    baseline_us: float
    candidate_us: float
    baseline_spread: float  # relative spread (e.g. 0.02 = 2 %)
    candidate_spread: float
    pct_ceiling: Optional[float] = None  # candidate's % of the copy ceiling
    baseline_pct_ceiling: Optional[float] = None
    context_base_us: Optional[float] = None
    context_cand_us: Optional[float] = None
    context_spread_us: Optional[float] = None  # absolute spread of the in-context times
    timing_basis: str = "chained"
    # bench's in-context bound on the row (BenchRow.headroom: production over a touch kernel in the op's place, which
    # no kernel there beats); None where bench timed no floor or the floor was within its spread of zero
    context_headroom: Optional[float] = None
    # bench's paired 95% interval of the per-call time saved in context (BenchRow.context_diff_ci_us); None before it
    context_diff_ci_us: Optional[List[float]] = None

    @property
    def basis(self) -> str:
        ok = (self.timing_basis == "in-context" and (self.context_base_us or 0) > 0
              and (self.context_cand_us or 0) > 0)
        return "in-context" if ok else "chained"

    @property
    def speedup(self) -> float:
        if self.basis == "in-context":
            return self.context_base_us / self.context_cand_us
        return self.baseline_us / self.candidate_us if self.candidate_us > 0 else float("nan")

    @property
    def attainable(self) -> Optional[float]:
        """The most any candidate could gain in context on this row (bench's headroom), on in-context rows."""
        return self.context_headroom if self.basis == "in-context" and self.context_headroom else None

    @property
    def noise(self) -> bool:
        """True when the difference is not resolved: in context bench's paired interval where the row has one, else
        smaller than the measured spread."""
        if self.basis == "in-context":
            if self.context_diff_ci_us:  # bench's rule (BenchRow.set_context)
                return paired_noise(self.context_diff_ci_us, self.speedup)
            return abs(self.context_base_us - self.context_cand_us) <= (self.context_spread_us or 0.0)
        return abs(self.speedup - 1.0) <= max(self.baseline_spread, self.candidate_spread)

    def to_json(self) -> Dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None or not k.startswith("context_")}
        d["shape"] = shape_key(self.shape)
        d["speedup"] = round(self.speedup, 4)
        d["noise"] = self.noise
        d["timing_basis"] = self.basis
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Timing":
        return cls(
            shape=parse_shape(d["shape"]),
            dtype=d["dtype"],
            baseline_us=float(d["baseline_us"]),
            candidate_us=float(d["candidate_us"]),
            baseline_spread=float(d["baseline_spread"]),
            candidate_spread=float(d["candidate_spread"]),
            pct_ceiling=d.get("pct_ceiling"),
            baseline_pct_ceiling=d.get("baseline_pct_ceiling"),
            context_base_us=d.get("context_base_us"),
            context_cand_us=d.get("context_cand_us"),
            context_spread_us=d.get("context_spread_us"),
            timing_basis=d.get("timing_basis") or "chained",
            context_headroom=d.get("context_headroom"),
        )


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return float("nan")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass
class BenchResult:
    ok: bool
    reason: str = ""
    timings: List[Timing] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)  # device, copy ceiling, launch floor, ...
    refused: List[str] = field(default_factory=list)  # rows bench refused as impossible, with the reason

    @property
    def geomean(self) -> float:
        return geomean([t.speedup for t in self.timings])

    @property
    def median_spread(self) -> float:
        spreads = [max(t.baseline_spread, t.candidate_spread) for t in self.timings]
        return statistics.median(spreads) if spreads else 0.0


class Executor:
    """Interface the orchestrator and the tools call. Every method returns a result for a bad
    candidate (never raises for one); ExecutorError is for a missing or refused tool."""

    name = "executor"
    source_suffix = ".cu"
    # True when bench() itself re-checks the candidate on fresh inputs after timing; otherwise the
    # orchestrator runs a second check after bench.
    bench_rechecks = False

    def __init__(self, spec) -> None:
        self.spec = spec

    # -- what the loop optimizes -------------------------------------------------------------
    def baseline_source(self) -> str:
        raise NotImplementedError

    def describe(self) -> Dict[str, Any]:
        """Facts for the log and the agents' prompts (device, variant, flags, ...)."""
        return {"executor": self.name, "op": self.spec.name}

    def default_bench_shapes(self) -> List[Dims]:
        return [s.dims for s in self.spec.shapes("paper")]

    def default_bench_dtypes(self) -> List[str]:
        return ["fp16", "bf16"]

    def check_suite(self, full: bool) -> str:
        """One line saying what the mandatory check covers (for the agents)."""
        raise NotImplementedError

    def mandatory_shapes(self, full: bool) -> List[Dims]:
        raise NotImplementedError

    def max_test_elems(self) -> int:
        """The largest shape (in elements) a test may add: the largest the op's suite has."""
        return max(numel(s.dims) for s in list(self.spec.corpus) + list(self.spec.edge_shapes))

    def signature(self) -> str:
        return self.spec.c_signature()

    def read_include(self, rel: str) -> str:
        raise ExecutorError(f"{self.name} has no include files to read")

    def language_notes(self) -> str:
        """What a candidate must look like: language, entry point, forbidden things."""
        raise NotImplementedError

    # -- the three operations ------------------------------------------------------------------
    def compile(self, source: Path) -> CompileResult:
        raise NotImplementedError

    def check(self, source: Path, extra: ExtraTests, seed: int, full: bool = False) -> CheckResult:
        """Mandatory suite (full=True: the whole corpus and edge shapes) plus `extra`, on fresh
        inputs drawn from `seed`."""
        raise NotImplementedError

    def check_tests_on_baseline(self, extra: ExtraTests, seed: int) -> CheckResult:
        """Run only `extra` against the production kernel: a test it fails is not a valid test."""
        raise NotImplementedError

    def bench(self, source: Path, shapes: Sequence[Dims], dtypes: Sequence[str]) -> BenchResult:
        """Production and candidate timed interleaved in one run."""
        raise NotImplementedError

    def ncu(self, source: Path, shape: Dims, dtype: str) -> Dict[str, Any]:
        raise ExecutorError(f"{self.name} has no profiler")
