"""What the agents' tools act on, in two layers the orchestrator fills:

  Run           what lasts the whole run: the op, the executor, the settings, the rounds so far,
                the tests the testing agent added, the log
  RoundContext  one round: the run, which kernel is under study, which file the coding agent
                writes, whether Nsight Compute metrics are given

The tools (tools.py) receive the RoundContext through the SDK's RunContextWrapper (the object
passed as `Runner.run(..., context=...)`). This module imports neither the tools, the agents nor
the orchestrator: context -> tools -> roles -> orchestrator -> cli.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .executor import Dims, ExtraTests
from .report import rounds_table
from .runlog import RunLog

# Nsight Compute metrics are given from this round on (--profile-from-round). No GPU ablation
# chose it: it follows CuTeGen's staged refinement (profiling once the kernel's structure has
# settled) and splits the default 5-round run into two structural rounds judged on correctness
# and time, then three refinement rounds with metrics. 0 gives them from the production kernel on.
DEFAULT_PROFILE_FROM_ROUND = 3


@dataclass
class OptimizeConfig:
    rounds: int
    mode: str = "multi"  # "multi" | "single"
    bench_shapes: List[Dims] = field(default_factory=list)
    bench_dtypes: List[str] = field(default_factory=list)
    max_fix_attempts: int = 2
    max_tests_per_round: int = 8
    max_turns: int = 12
    trace: bool = False
    price: Optional[tuple] = None
    profile_from_round: int = DEFAULT_PROFILE_FROM_ROUND
    beam: int = 1  # how many of the best correct kernels serve as parents (1: one evolving kernel)


def ranked(records: Dict[int, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Correct, timed kernels, best first: highest geomean speedup; ties go to the earlier round."""
    ok = [r for r in records.values() if r.get("correct") and r.get("geomean") is not None]
    return sorted(ok, key=lambda r: (-r["geomean"], r["round"]))


def best_of(records: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """The best correct kernel so far; round 0 (production) is 1.0."""
    return ranked(records)[0]


def choose_parent(records: Dict[int, Dict[str, Any]], beam: int) -> Dict[str, Any]:
    """The kernel a round starts from. beam 1: the best. beam N: among the N best, the one used as a
    parent least often (a new entrant first), ties to the better one, so each of N lineages advances."""
    top = ranked(records)[:max(1, beam)]
    if len(top) == 1:
        return top[0]
    uses = {r["round"]: 0 for r in top}
    for rec in records.values():
        if rec.get("parent") in uses:
            uses[rec["parent"]] += 1
    return min(top, key=lambda r: uses[r["round"]])  # min keeps the first (better) one on ties


@dataclass
class Run:
    spec: Any
    executor: Any
    cfg: OptimizeConfig
    run_dir: Path
    log: RunLog
    say: Callable[[str], None] = print
    records: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    extra: ExtraTests = field(default_factory=ExtraTests)
    run_id: str = ""

    def record_of(self, r: Optional[int]) -> Optional[Dict[str, Any]]:
        return None if r is None else self.records.get(int(r))

    def best(self) -> Dict[str, Any]:
        return best_of(self.records)

    def source(self, rec: Dict[str, Any]) -> Path:
        return self.run_dir / rec["file"]

    def candidate_path(self, r: int, suffix: str = "") -> Path:
        return self.run_dir / "candidates" / f"r{r:02d}{suffix}{self.executor.source_suffix}"

    def log_table(self) -> str:
        recs = [self.records[k] for k in sorted(self.records)]
        best = self.best()["round"] if 0 in self.records else None
        return rounds_table(recs, best) if recs else "no rounds yet"

    def suite(self) -> ExtraTests:
        """What a check adds to the executor's mandatory suite: the timed shapes and the agents' tests."""
        return ExtraTests(list(self.cfg.bench_shapes)).merged(self.extra.shapes)

    def seed(self, r: int, k: int) -> int:
        return int(hashlib.sha256(f"{self.run_id}:{r}:{k}".encode()).hexdigest()[:8], 16)


@dataclass
class RoundContext:
    run: Run
    round: int
    parent: Optional[int] = None  # the round this one starts from
    profiling: bool = True  # Nsight Compute metrics given in this round
    role: str = ""  # the agent running now
    subject: Optional[Path] = None  # the kernel bench/ncu/roofline look at
    subject_round: Optional[int] = None
    target: Optional[Path] = None  # the file write_candidate writes
    written: bool = False
    tests_added: int = 0  # shapes added this round (--max-tests per round)

    def study(self, subject: Optional[Path], subject_round: Optional[int]) -> None:
        """Point the profiling tools at a kernel; nothing is written in this step."""
        self.subject, self.subject_round, self.target = subject, subject_round, None

    def write_to(self, target: Path) -> None:
        self.target, self.written = target, False
