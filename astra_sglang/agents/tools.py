"""The agents' function tools, each written once: a function over the round's context
(`RunContextWrapper[RoundContext]`, the SDK's own context pattern) whose docstring is what the
model reads. Each returns text and never raises for a bad call: a failure is an answer
("error: ...", "unavailable: ..."), so one bad call cannot end the round; only a spent budget or an
interruption goes through.

`sdk_tools` turns them into the SDK's FunctionTools when an agent is built: strictness of the
JSON schema depends on the provider (strict for OpenAI, plain for servers without strict
JSON-schema support), so `function_tool` is applied there, not at import.
"""
from __future__ import annotations

import functools
import hashlib
import json
import traceback
from typing import Callable, Dict, List, Sequence

from .budget import BudgetExhausted
from .context import RoundContext
from .executor import Dims, ExecutorError, ExtraTests, numel, parse_shape, shape_key
from .report import roofline_table, timing_table

try:  # the SDK is optional at import; function_tool resolves this annotation when an agent is built
    from agents import RunContextWrapper
except ImportError:  # pragma: no cover - without the SDK no agent is ever built
    RunContextWrapper = None

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
PROFILER_TOOLS = {"ncu"}  # withheld before --profile-from-round

TOOLS: Dict[str, Callable[..., str]] = {}


def tools_for(role: str, profiling: bool) -> List[str]:
    return [n for n in ROLE_TOOLS[role] if profiling or n not in PROFILER_TOOLS]


def _clip(text: str, limit: int = MAX_TOOL_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters cut)"


def tool(fn: Callable[..., str]) -> Callable[..., str]:
    """Register `fn` as a tool; a failure inside it becomes the answer."""

    @functools.wraps(fn)
    def answer(ctx, *args, **kwargs) -> str:
        try:
            return _clip(fn(ctx, *args, **kwargs))
        except ExecutorError as e:
            return f"unavailable: {e}"
        except (BudgetExhausted, KeyboardInterrupt):
            raise
        except Exception as e:  # a tool failure is an answer, not a crash
            return f"error: {type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=2))[-800:]

    TOOLS[fn.__name__] = answer
    return answer


def sdk_tools(names: Sequence[str], strict: bool) -> list:
    """The SDK FunctionTools for `names`."""
    from agents import function_tool

    return [function_tool(TOOLS[n], strict_mode=strict) for n in names]


# -- testing -------------------------------------------------------------------------------------------
@tool
def list_tests(ctx: RunContextWrapper[RoundContext]) -> str:
    """List the mandatory correctness suite, the timing suite, and the tests added so far."""
    c = ctx.context
    run, ex = c.run, c.run.executor
    return "\n".join([
        f"mandatory correctness suite (always run): {ex.check_suite(False)}",
        f"final re-verification: {ex.check_suite(True)}",
        f"timing suite: {', '.join(shape_key(s) for s in run.cfg.bench_shapes)} x {', '.join(run.cfg.bench_dtypes)}",
        f"every shape runs the distributions {', '.join(run.spec.distributions)}",
        f"shape dimensions: {' x '.join(run.spec.dim_names)}",
        f"shapes added so far: {', '.join(shape_key(s) for s in run.extra.shapes) or 'none'}",
        f"you may still add {max(0, run.cfg.max_tests_per_round - c.tests_added)} shapes this round",
    ])


@tool
def add_tests(ctx: RunContextWrapper[RoundContext], shapes: List[str], distributions: List[str], reason: str) -> str:
    """Add tests to the correctness suite (added to it, never replacing it). Each is first run on the
    production kernel and rejected if that fails.

    Args:
        shapes: shapes like "7x1001" (dimensions in the op's order; see list_tests).
        distributions: value distributions by name; the oracle already runs every one the op knows
            (see list_tests) on every shape, so this only confirms coverage; may be empty.
        reason: what bug these tests would catch.
    """
    c = ctx.context
    run, spec, ex = c.run, c.run.spec, c.run.executor
    notes: List[str] = []
    room = run.cfg.max_tests_per_round - c.tests_added
    mandatory = set(ex.mandatory_shapes(False)) | set(run.suite().shapes)
    new_shapes: List[Dims] = []
    for s in shapes or []:
        try:
            dims = parse_shape(s)
        except ValueError:
            notes.append(f"rejected {s!r}: not a shape like {shape_key(run.cfg.bench_shapes[0])}")
            continue
        problem = spec.dims_problem(dims)
        if problem:
            notes.append(f"rejected {s!r}: a shape is {' x '.join(spec.dim_names)}: {problem}")
        elif dims in mandatory or dims in new_shapes:
            notes.append(f"skipped {shape_key(dims)}: already in the suite")
        elif numel(dims) > ex.max_test_elems():
            notes.append(f"rejected {shape_key(dims)}: larger than the largest shape the oracle checks")
        elif len(new_shapes) >= room:
            notes.append(f"rejected {shape_key(dims)}: at most {run.cfg.max_tests_per_round} shapes per round")
        else:
            new_shapes.append(dims)
    for d in distributions or []:  # the oracle runs every distribution the spec knows on every shape
        notes.append(f"distribution {d!r}: " + ("already run on every shape" if d in spec.distributions else
                                                 f"unknown (every shape runs {', '.join(spec.distributions)})"))
    if not new_shapes:
        return "nothing added. " + "; ".join(notes)
    # A test the production kernel fails is not a valid test.
    seed = run.seed(c.round, 100 + c.tests_added)
    if not ex.check_tests_on_baseline(ExtraTests(new_shapes), seed).ok:
        keep: List[Dims] = []
        for dims in new_shapes:
            one = ex.check_tests_on_baseline(ExtraTests([dims]), seed)
            if one.ok:
                keep.append(dims)
            else:
                notes.append(f"rejected {shape_key(dims)}: the production kernel fails it ({one.reason})")
        new_shapes = keep
    if new_shapes:
        run.extra = run.extra.merged(new_shapes)
        c.tests_added += len(new_shapes)
        run.log.append({"event": "tests_added", "round": c.round, "role": c.role,
                        "shapes": [shape_key(s) for s in new_shapes], "reason": reason})
        run.say(f"    tests + {', '.join(shape_key(s) for s in new_shapes)}")
    added = ", ".join(shape_key(s) for s in new_shapes) or "nothing"
    return f"added: {added}." + (" " + "; ".join(notes) if notes else "")


# -- reading ---------------------------------------------------------------------------------------------
@tool
def read_source(ctx: RunContextWrapper[RoundContext], which: str) -> str:
    """Read a kernel source.

    Args:
        which: "current" (the kernel this step starts from or studies), "baseline" (production),
            "best", "candidate" (the file written in this round), "round:N", or an include path
            of the workspace such as "csrc/elementwise/activation.cuh" (or "cute/tensor.hpp" where
            CuTe is on the include path).
    """
    c = ctx.context
    run = c.run
    w = (which or "current").strip()
    if w == "current":
        parent = run.record_of(c.parent)
        path = c.subject or (run.source(parent) if parent else None)
    elif w == "candidate":
        path = c.target if c.target and c.target.exists() else None
        if path is None:
            return "no candidate has been written in this round yet"
    elif w == "baseline":
        path = run.source(run.records[0]) if 0 in run.records else run.candidate_path(0)
    elif w == "best":
        path = run.source(run.best())
    elif w.startswith("round:"):
        rec = run.record_of(int(w.split(":", 1)[1]))
        if rec is None or not rec.get("file"):
            return f"no source for round {w.split(':', 1)[1]} in the log"
        path = run.source(rec)
    else:
        return run.executor.read_include(w)
    if path is None or not path.exists():
        return f"no source for {w!r}"
    return path.read_text()


@tool
def read_log(ctx: RunContextWrapper[RoundContext]) -> str:
    """The optimization log: every round's parent, change, compile/correctness result and speedup."""
    return ctx.context.run.log_table()


# -- coding ------------------------------------------------------------------------------------------------
@tool
def write_candidate(ctx: RunContextWrapper[RoundContext], source: str) -> str:
    """Write the complete new candidate kernel file (the whole file, not a diff).

    Args:
        source: the full source text, defining the op's ABI entry point.
    """
    c = ctx.context
    if c.target is None:
        return "error: no candidate is being written in this step"
    text = source or ""
    if not text.strip():
        return "error: empty source; write the complete file"
    if len(text.encode()) > MAX_SOURCE_BYTES:
        return f"error: the source is over {MAX_SOURCE_BYTES // 1024} KiB"
    sym = c.run.spec.symbol
    if sym not in text:
        return f"error: the file must define the ABI entry point {sym} (the whole file, not a diff)"
    c.target.parent.mkdir(parents=True, exist_ok=True)
    c.target.write_text(text if text.endswith("\n") else text + "\n")
    c.written = True
    sha = hashlib.sha256(c.target.read_bytes()).hexdigest()[:12]
    return (f"wrote {c.target.name} ({text.count(chr(10)) + 1} lines, sha256 {sha}); the orchestrator "
            "compiles, checks and times it when you finish")


# -- profiling ---------------------------------------------------------------------------------------------
def _subject(c: RoundContext):
    if c.subject is None:
        raise ExecutorError("no kernel is under study in this step")
    return c.subject


@tool
def bench(ctx: RunContextWrapper[RoundContext], shapes: List[str]) -> str:
    """Time the kernel under study against production (interleaved, L2-cold CUDA graph on the GPU).

    Args:
        shapes: shapes like "64x8192" (at most 8); empty for the timing suite.
    """
    c = ctx.context
    run = c.run
    subject = _subject(c)
    dims = [parse_shape(s) for s in (shapes or [])][:MAX_BENCH_SHAPES] or list(run.cfg.bench_shapes)
    for d in dims:
        problem = run.spec.dims_problem(d)
        if problem:
            return f"error: shape {shape_key(d)} is not {' x '.join(run.spec.dim_names)}: {problem}"
    res = run.executor.bench(subject, dims, run.cfg.bench_dtypes)
    if not res.ok:
        return f"bench failed: {res.reason}"
    head = f"kernel: round {c.subject_round}; geomean speedup over production {res.geomean:.3f}x"
    return head + "\n" + timing_table(res.timings)


@tool
def ncu(ctx: RunContextWrapper[RoundContext], shape: str, dtype: str) -> str:
    """Nsight Compute metrics of the kernel under study for one shape: duration, DRAM throughput,
    occupancy, registers, spills, top warp-stall reasons.

    Args:
        shape: a shape like "64x8192".
        dtype: "fp16", "bf16" or "fp32".
    """
    c = ctx.context
    run = c.run
    if not c.profiling:
        return (f"withheld: Nsight Compute metrics are given from round {run.cfg.profile_from_round} on "
                "(--profile-from-round); work from bench and roofline")
    subject = _subject(c)
    dims = parse_shape(shape)
    if len(dims) != len(run.spec.dim_names):
        return f"error: shape {shape!r} is not {' x '.join(run.spec.dim_names)}"
    metrics = run.executor.ncu(subject, dims, dtype or run.cfg.bench_dtypes[0])
    return json.dumps(metrics, indent=1, default=str)


@tool
def roofline(ctx: RunContextWrapper[RoundContext]) -> str:
    """Bytes moved, achieved bandwidth and % of the measured copy ceiling per shape for the kernel
    under study, with the production kernel's for comparison."""
    c = ctx.context
    rec = c.run.record_of(c.subject_round)
    if rec is None or not rec.get("timings"):
        return "no timings for the kernel under study yet"
    return roofline_table(c.run.spec, rec["timings"])
