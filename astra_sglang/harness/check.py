"""`astra-sglang check`: does a kernel compute the op? An oracle that is hard to fool.

The oracle is the op's torch reference evaluated in fp64 *and* the extracted production
kernel (numerics.py has the error metric and the tolerance rule). What else is checked, on
fresh random inputs every time (several distributions, never zeros):
- outputs are poisoned with a NaN sentinel before each run; an element still holding it was
  never written;
- every ABI buffer sits inside a larger allocation with guard bytes before and after it
  (guards.py): changed guard bytes mean a write outside the buffer;
- inputs are compared after the run: a kernel may only write its outputs;
- each (shape, dtype) runs at least twice in the *same buffers* with fresh inputs, so a
  kernel that caches results keyed by pointer, or detects a repeat, fails on the re-run;
- the candidate runs the way bench runs it (graphcheck.py): captured in a CUDA graph, back to
  back over several input sets, replayed on the same pointers with fresh inputs; and on a
  non-default stream right behind queued work that writes its inputs (a kernel that ignores
  the stream reads stale inputs);
- shapes: edge shapes (1 token, unaligned hidden sizes, the largest), the paper's shapes and
  a sample of the corpus (cases.py); dtypes per the workspace (fp16, bf16, fp32);
- the candidate source passes the static checks (static_checks.py) before it is built.

Everything that touches the GPU runs in a worker subprocess (worker.py) with a timeout: a
compile error, crash, illegal address, hang or NaN is a failed check with its reason.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..errors import AstraError
from ..spec import Shape
from .cases import production_skips, select_shapes, workspace_dtypes
from ..build.workspace import open_workspace
from .checkjob import DEFAULT_TIMEOUT, MAX_FAILURES, run_check
from .results import CheckResult
from .sanitize import sanitize_run


GRAPH_SETS = 4  # input sets the in-graph check rotates over


def check_candidate(
    op: str,
    workspace: Any,
    candidate: Optional[Union[str, Path]],
    *,
    shapes: Union[str, Sequence[Shape]] = "check",
    dtypes: Optional[Sequence[str]] = None,
    seed: Optional[int] = None,
    timeout: float = DEFAULT_TIMEOUT,
    total_timeout: float = 3600.0,
    sanitize: bool = False,
    progress: Optional[Callable[[str], None]] = None,
    max_failures: int = MAX_FAILURES,
    graph_sets: int = GRAPH_SETS,
    static: bool = True,
) -> CheckResult:
    """Check `candidate` (a .cu behind the op's ABI; None = the production baseline) in `workspace`.

    `timeout` is the longest the worker may go without progress (a hang); `total_timeout` caps
    the whole run. Never raises for anything the candidate does; raises AstraError for
    usage errors (unknown op, missing workspace, bad dtype/shape selector). static=False skips the
    static checks (tests use it to show what the dynamic checks catch on their own)."""
    from ..build import first_error_line
    from ..registry import get_op
    from ..static_checks import errors as static_errors
    from ..static_checks import scan_file, summarize


    t0 = time.monotonic()
    say = progress or (lambda s: None)
    spec = get_op(op)
    ws = open_workspace(op, workspace)
    shape_list = select_shapes(spec, shapes)
    dts = workspace_dtypes(spec, ws.manifest, dtypes)
    seed = int(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    res = CheckResult(False, "", op=op, candidate=str(candidate) if candidate else None, variant=ws.variant,
                      shapes=[s.key() for s in shape_list], dtypes=dts, seed=seed)

    def done(stage: str) -> CheckResult:
        res.stage = stage
        res.seconds = time.monotonic() - t0
        return res

    from .installed import describe_production, verify_installed

    res.production = describe_production(ws)
    prod_ref = verify_installed(ws) if ws.installed else ""  # no sglang / a broken fact: one error: line
    cand_path = Path(candidate) if candidate else None
    if cand_path is not None:
        if not cand_path.exists():
            raise AstraError(f"candidate {cand_path} does not exist")
        res.candidate_sha256 = hashlib.sha256(cand_path.read_bytes()).hexdigest()
        findings = scan_file(cand_path, ws.include_dirs) if static else []
        res.static = [f.to_dict() for f in findings]
        if static_errors(findings):
            res.reason = summarize(findings) or "static check failed"
            res.failures = [f"static check: {f.one_line()}" for f in static_errors(findings)]
            return done("static")
    # arguments and the static scan above need no GPU; everything below does (one error: line each, exit 2)
    from ..preconditions import require

    require("gpu", "cuda_torch")
    if not prod_ref:
        say("building the production baseline")
        pb = ws.build()
        if not pb.ok:
            res.reason = f"the production baseline does not compile: {first_error_line(pb.log)}"
            res.failures = [res.reason]
            res.log_tail = pb.log[-4000:]
            return done("build")
        prod_ref = f"lib:{pb.library}"
    else:
        say(f"production: {res.production}")
    cb = None
    if cand_path is not None:
        say(f"building {cand_path.name}")
        cb = ws.build(cand_path)
        if not cb.ok:
            res.reason = f"compile error: {first_error_line(cb.log)}"
            res.failures = [res.reason]
            res.log_tail = cb.log[-4000:]
            return done("build")
    skip = production_skips(spec, ws.variant, shape_list, dts)
    prod_attrs = ws.attrs
    run = run_check(spec, prod_ref, f"lib:{cb.library}" if cb else None, shape_list, dts, seed=seed,
                    timeout=timeout, total_timeout=total_timeout, prod_attrs=prod_attrs, skip=skip,
                    max_failures=max_failures, graph_sets=graph_sets, progress=say)
    res.ok, res.reason, res.failures, res.details, res.notes, res.device = (
        run.ok, run.reason, run.failures, run.details, run.notes, run.device)
    res.worker_status = run.worker.status
    res.log_tail = run.worker.stderr_tail[-2000:]
    if not run.ok or not sanitize:
        return done("run")
    for tool in ("memcheck", "racecheck"):
        say(f"compute-sanitizer {tool}")
        if cb is None and prod_ref.startswith("installed:"):
            res.notes.append(f"compute-sanitizer {tool}: not run on SGLang's installed callable")
            continue
        sres = sanitize_run(spec, ws, f"lib:{cb.library}" if cb else prod_ref, tool, dts, seed,
                            prod_attrs=None if cb else prod_attrs, timeout=max(timeout, 300.0), skip=skip, progress=say)
        res.notes.append(f"compute-sanitizer {tool}: {sres['summary']}")
        if not sres["ok"]:
            res.ok = False
            res.reason = f"compute-sanitizer {tool}: {sres['reason']}"
            res.failures.insert(0, res.reason)
            res.log_tail = sres.get("log", "")[-4000:]
            return done("sanitize")
    return done("done")
