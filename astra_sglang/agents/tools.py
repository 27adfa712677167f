"""The agents' function tools. Each returns text for the model and never raises: a failure is
an answer ("error: ..."), so one bad call cannot end the round.

The tools act on the orchestrator's state through `ToolBox`: which kernel is under study (the
profiling subject), which file the coding agent writes, and the extra tests.
"""
from __future__ import annotations

import hashlib
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

from .executor import ExecutorError, parse_shape, shape_key
from .report import roofline_table, timing_table

if TYPE_CHECKING:  # pragma: no cover
    from .orchestrator import Optimizer

MAX_SOURCE_BYTES = 256 * 1024
MAX_TOOL_TEXT = 40000
MAX_BENCH_SHAPES = 8

# Which tools each role holds; the single agent holds them all.
ROLE_TOOLS: Dict[str, List[str]] = {
    "testing": ["list_tests", "add_tests", "read_source"],
    "profiling": ["bench", "ncu", "roofline", "read_source"],
    "planning": ["read_log", "roofline", "read_source"],
    "coding": ["read_source", "write_candidate"],
}
ROLE_TOOLS["single"] = list(dict.fromkeys(n for names in ROLE_TOOLS.values() for n in names))


def _clip(text: str, limit: int = MAX_TOOL_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters cut)"


class ToolBox:
    def __init__(self, opt: "Optimizer") -> None:
        self.opt = opt
        self.subject: Optional[Path] = None  # kernel that bench/ncu/roofline look at
        self.subject_round: Optional[int] = None
        self.target: Optional[Path] = None  # file write_candidate writes
        self.written = False
        self.role = ""
        self.added_this_round = 0

    def _guard(self, fn: Callable[[], str]) -> str:
        try:
            return _clip(fn())
        except ExecutorError as e:
            return f"unavailable: {e}"
        except Exception as e:  # a tool failure is an answer, not a crash
            if isinstance(e, KeyboardInterrupt):
                raise
            from .budget import BudgetExhausted

            if isinstance(e, BudgetExhausted):
                raise
            return f"error: {type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=2))[-800:]

    # -- testing -------------------------------------------------------------------------------------
    def list_tests(self) -> str:
        def go() -> str:
            o, ex = self.opt, self.opt.executor
            extra = o.extra
            return "\n".join([
                f"mandatory correctness suite (always run): {ex.check_suite(False)}",
                f"final re-verification: {ex.check_suite(True)}",
                f"timing suite: {', '.join(shape_key(s) for s in o.cfg.bench_shapes)} x {', '.join(o.cfg.bench_dtypes)}",
                f"every shape runs the distributions {', '.join(o.spec.distributions)}",
                f"shape dimensions: {' x '.join(o.spec.dim_names)}",
                f"shapes added so far: {', '.join(shape_key(s) for s in extra.shapes) or 'none'}",
                f"you may still add {max(0, o.cfg.max_tests_per_round - self.added_this_round)} shapes this round",
            ])
        return self._guard(go)

    def add_tests(self, shapes: Sequence[str], distributions: Sequence[str], reason: str) -> str:
        return self._guard(lambda: self.opt.add_tests(list(shapes or []), list(distributions or []), reason, self))

    # -- reading -------------------------------------------------------------------------------------
    def read_source(self, which: str) -> str:
        return self._guard(lambda: self.opt.read_source(which, self))

    def read_log(self) -> str:
        return self._guard(self.opt.log_table)

    # -- coding --------------------------------------------------------------------------------------
    def write_candidate(self, source: str) -> str:
        def go() -> str:
            if self.target is None:
                return "error: no candidate is being written in this step"
            text = source or ""
            if not text.strip():
                return "error: empty source; write the complete file"
            if len(text.encode()) > MAX_SOURCE_BYTES:
                return f"error: the source is over {MAX_SOURCE_BYTES // 1024} KiB"
            sym = self.opt.spec.symbol
            if sym not in text:
                return f"error: the file must define the ABI entry point {sym} (the whole file, not a diff)"
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.target.write_text(text if text.endswith("\n") else text + "\n")
            self.written = True
            sha = hashlib.sha256(self.target.read_bytes()).hexdigest()[:12]
            return (f"wrote {self.target.name} ({text.count(chr(10)) + 1} lines, sha256 {sha}); the orchestrator "
                    "compiles, checks and times it when you finish")
        return self._guard(go)

    # -- profiling -----------------------------------------------------------------------------------
    def _need_subject(self) -> Path:
        if self.subject is None:
            raise ExecutorError("no kernel is under study in this step")
        return self.subject

    def bench(self, shapes: Sequence[str]) -> str:
        def go() -> str:
            subject = self._need_subject()
            dims = [parse_shape(s) for s in (shapes or [])][:MAX_BENCH_SHAPES] or list(self.opt.cfg.bench_shapes)
            for d in dims:
                if len(d) != len(self.opt.spec.dim_names) or min(d) <= 0:
                    return f"error: shape {shape_key(d)} is not {' x '.join(self.opt.spec.dim_names)}"
            res = self.opt.executor.bench(subject, dims, self.opt.cfg.bench_dtypes)
            if not res.ok:
                return f"bench failed: {res.reason}"
            head = f"kernel: round {self.subject_round}; geomean speedup over production {res.geomean:.3f}x"
            return head + "\n" + timing_table(res.timings)
        return self._guard(go)

    def ncu(self, shape: str, dtype: str) -> str:
        def go() -> str:
            import json

            subject = self._need_subject()
            dims = parse_shape(shape)
            if len(dims) != len(self.opt.spec.dim_names):
                return f"error: shape {shape!r} is not {' x '.join(self.opt.spec.dim_names)}"
            metrics = self.opt.executor.ncu(subject, dims, dtype or self.opt.cfg.bench_dtypes[0])
            return json.dumps(metrics, indent=1, default=str)
        return self._guard(go)

    def roofline(self) -> str:
        def go() -> str:
            rec = self.opt.record_of(self.subject_round)
            if rec is None or not rec.get("timings"):
                return "no timings for the kernel under study yet"
            return roofline_table(self.opt.spec, rec["timings"])
        return self._guard(go)


def sdk_tools(box: ToolBox, names: Sequence[str], strict: bool) -> list:
    """SDK FunctionTools for `names`, bound to `box`."""
    from agents import function_tool

    def list_tests() -> str:
        """List the mandatory correctness suite, the timing suite, and the tests added so far."""
        return box.list_tests()

    def add_tests(shapes: List[str], distributions: List[str], reason: str) -> str:
        """Add tests to the correctness suite (added to it, never replacing it). Each is first run on the
        production kernel and rejected if that fails.

        Args:
            shapes: shapes like "7x1001" (dimensions in the op's order; see list_tests).
            distributions: value distributions by name; the oracle already runs every one the op knows
                (see list_tests) on every shape, so this only confirms coverage; may be empty.
            reason: what bug these tests would catch.
        """
        return box.add_tests(shapes, distributions, reason)

    def read_source(which: str) -> str:
        """Read a kernel source.

        Args:
            which: "current" (the kernel this step starts from or studies), "baseline" (production),
                "best", "candidate" (the file written in this round), "round:N", or an include path
                of the workspace such as "csrc/elementwise/activation.cuh".
        """
        return box.read_source(which)

    def read_log() -> str:
        """The optimization log: every round's parent, change, compile/correctness result and speedup."""
        return box.read_log()

    def write_candidate(source: str) -> str:
        """Write the complete new candidate kernel file (the whole file, not a diff).

        Args:
            source: the full source text, defining the op's ABI entry point.
        """
        return box.write_candidate(source)

    def bench(shapes: List[str]) -> str:
        """Time the kernel under study against production (interleaved, L2-cold CUDA graph on the GPU).

        Args:
            shapes: shapes like "64x8192" (at most 8); empty for the timing suite.
        """
        return box.bench(shapes)

    def ncu(shape: str, dtype: str) -> str:
        """Nsight Compute metrics of the kernel under study for one shape: duration, DRAM throughput,
        occupancy, registers, spills, top warp-stall reasons.

        Args:
            shape: a shape like "64x8192".
            dtype: "fp16", "bf16" or "fp32".
        """
        return box.ncu(shape, dtype)

    def roofline() -> str:
        """Bytes moved, achieved bandwidth and % of the measured copy ceiling per shape for the kernel
        under study, with the production kernel's for comparison."""
        return box.roofline()

    fns = {f.__name__: f for f in (list_tests, add_tests, read_source, read_log, write_candidate, bench, ncu,
                                   roofline)}
    return [function_tool(fns[n], strict_mode=strict) for n in names]
