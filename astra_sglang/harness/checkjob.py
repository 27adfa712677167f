"""The check job: the worker side (every case of every shape×dtype, in the worker process) and
run_check, which runs it in a worker on implementation references (lib:/path.so, py:file:fn)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..spec import OpSpec, Shape
from .cases import BIG_CASE_ELEMENTS, case_plan, case_seed
from .guards import GUARD_BYTES, GuardedSet
from .impl import Impl
from .oracle import FatalCaseError, run_case

DEFAULT_TIMEOUT = 60.0  # seconds without progress before a run counts as hung
MAX_FAILURES = 5


# ------------------------------------------------------------------------------------------
# the worker's side


@dataclass
class CheckContext:
    """What every case of one check job shares: the kernels, the device, the plan's knobs."""

    spec: OpSpec
    cand: Impl
    prod: Impl
    device: str
    guard: int = GUARD_BYTES
    seed: int = 0
    big: int = BIG_CASE_ELEMENTS
    first_dist_only: bool = False
    baseline_only: bool = False
    prod_attrs: Dict[str, Any] = field(default_factory=dict)
    max_failures: int = MAX_FAILURES
    graph_sets: int = 0  # input sets for the in-graph check (0: not run)
    emit: Callable[..., None] = lambda *a, **k: None


@dataclass
class CheckTally:
    """Details, failures and notes gathered so far (appended to case by case)."""

    details: List[Dict[str, Any]] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def add(self, d: List[Dict[str, Any]], f: List[str], n: List[str]) -> None:
        self.details += d
        self.failures += f
        self.notes += n

    def result(self, **extra: Any) -> Dict[str, Any]:
        return {"ok": not self.failures, "reason": self.failures[0] if self.failures else "", "failures": self.failures,
                "details": self.details, "notes": self.notes, **extra}


def check_shape_dtype(ctx: CheckContext, dims, dtype: str, tally: CheckTally,
                      reference_only: bool = False) -> Optional[Dict[str, Any]]:
    """All runs of one shape×dtype; appends to `tally`. Returns a final result dict when the job must
    stop (a fatal CUDA error, or max_failures failures), else None. reference_only: production does not take
    the shape; the candidate alone runs, judged against the fp64 reference at its dtype's floor."""
    import torch

    spec, device = ctx.spec, ctx.device
    protos = spec.make_inputs(dims, dtype, torch.Generator(device=device).manual_seed(1), spec.distributions[0]
                              if spec.distributions else "normal", device=device)
    bufs_p = GuardedSet(spec, protos, device, ctx.guard)
    bufs_c = bufs_p if ctx.baseline_only else GuardedSet(spec, protos, device, ctx.guard)
    del protos
    plan = case_plan(spec, dims, dtype, ctx.big)
    if ctx.first_dist_only:
        plan = plan[:2]
    for dist, run in plan:
        stop, failed = _record(ctx, tally, lambda: run_case(
            spec, ctx.cand, ctx.prod, bufs_c, bufs_p, dims, dtype, dist, case_seed(ctx.seed, dims, dtype, dist, run),
            device, run_index=run, baseline_only=ctx.baseline_only, prod_attrs=ctx.prod_attrs,
            stage=lambda m: ctx.emit("stage", msg=m), reference_only=reference_only))
        if stop or failed:
            return stop  # one failure per shape×dtype is enough; go on to the next
    if ctx.graph_sets and device.startswith("cuda") and not ctx.baseline_only:
        from .graphcheck import check_as_timed

        del bufs_c, bufs_p
        return _record(ctx, tally, lambda: check_as_timed(ctx, dims, dtype, reference_only))[0]
    return None


def _record(ctx: CheckContext, tally: CheckTally, case) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """Run one case (`case()` -> details, failures, notes) into the tally and emit it. Returns (the
    final result when the job must stop: a fatal CUDA error or max_failures reached, else None; the
    case's failures)."""
    try:
        d, f, n = case()
    except FatalCaseError as e:
        tally.failures.append(str(e))
        ctx.emit("case", details=[], failures=[str(e)], notes=[])
        return tally.result(ok=False, fatal=True), [str(e)]
    tally.add(d, f, n)
    ctx.emit("case", details=d, failures=f, notes=n)
    return (tally.result(ok=False) if len(tally.failures) >= ctx.max_failures else None), f


def run_check_job(job: Dict[str, Any]) -> Dict[str, Any]:
    """Worker entry (mode 'check'). Emits a 'case' event per case; returns the result dict."""
    import torch

    from ..registry import get_op
    from .worker import emit

    spec = get_op(job["op"])
    device = job.get("device", "cuda")
    dev_name = "cpu"
    if device.startswith("cuda"):
        torch.cuda.init()
        dev_name = torch.cuda.get_device_name()
    emit("stage", msg=f"loading kernels on {dev_name}")
    prod = Impl(job["prod"], spec)
    baseline_only = not job.get("cand")
    ctx = CheckContext(
        spec, prod if baseline_only else Impl(job["cand"], spec), prod, device,
        guard=int(job.get("guard_bytes", GUARD_BYTES)), seed=int(job.get("seed", 0)),
        big=int(job.get("big_case_elements", BIG_CASE_ELEMENTS)), first_dist_only=bool(job.get("first_dist_only", False)),
        baseline_only=baseline_only, prod_attrs=job.get("prod_attrs") or {},
        max_failures=int(job.get("max_failures", MAX_FAILURES)), graph_sets=int(job.get("graph_sets", 0)), emit=emit)
    tally = CheckTally()
    skip = job.get("skip", {})  # "AxB dtype" -> why production does not take it
    for dims in job["shapes"]:
        dims = tuple(int(x) for x in dims)
        for dtype in job["dtypes"]:
            key = f"{'x'.join(map(str, dims))} {dtype}"
            if key in skip and baseline_only:
                tally.notes.append(f"{key}: skipped ({skip[key]})")
                continue
            if key in skip:  # astra may still serve the shape: the fp64 reference alone judges the candidate
                tally.notes.append(f"{key}: {skip[key]}; the candidate is judged against the fp64 reference alone")
            try:
                out = check_shape_dtype(ctx, dims, dtype, tally, reference_only=key in skip)
            except torch.cuda.OutOfMemoryError as e:  # the harness's memory, not the candidate's fault
                msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else "out of memory"
                tally.notes.append(f"{key}: not checked: the harness ran out of GPU memory ({msg})")
                emit("case", details=[], failures=[], notes=[tally.notes[-1]])
                out = None
            if out is not None:  # fatal (the CUDA context may be gone: touch nothing) or too many failures
                out["device"] = dev_name
                return out
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    if not tally.failures and not any(d.get("cand_err") is not None or d.get("prod_err") is not None
                                      for d in tally.details):
        # every case was skipped (production refused them all in baseline mode, or the harness ran out of memory):
        # a check that compared nothing has not passed
        tally.failures.append("nothing was compared: " + (tally.notes[0] if tally.notes else "no case ran"))
    return tally.result(device=dev_name)


# ------------------------------------------------------------------------------------------
# the caller's side


@dataclass
class CheckRun:
    """What one check worker run said."""

    ok: bool
    reason: str
    failures: List[str]
    details: List[Dict[str, Any]]
    notes: List[str]
    device: str
    worker: Any  # the WorkerResult

    def __iter__(self) -> Iterator[Any]:
        # older callers unpack the 7-tuple run_check returned before (agents/standin.py)
        return iter((self.ok, self.reason, self.failures, self.details, self.notes, self.device, self.worker))


def run_check(
    spec: OpSpec,
    prod: str,
    cand: Optional[str],
    shapes: Sequence[Shape],
    dtypes: Sequence[str],
    *,
    seed: int = 0,
    device: str = "cuda",
    timeout: float = DEFAULT_TIMEOUT,
    total_timeout: float = 3600.0,
    prod_attrs: Optional[Dict[str, Any]] = None,
    guard_bytes: int = GUARD_BYTES,
    skip: Optional[Dict[str, str]] = None,
    argv: Optional[Sequence[str]] = None,
    env: Optional[Dict[str, str]] = None,
    first_dist_only: bool = False,
    max_failures: int = MAX_FAILURES,
    graph_sets: int = 0,
    progress: Optional[Callable[[str], None]] = None,
) -> CheckRun:
    """Run the check job in a worker on implementation references (lib:... / py:...)."""
    from .worker import run_worker

    job = {
        "mode": "check", "op": spec.name, "prod": prod, "cand": cand, "device": device,
        "shapes": [list(s.dims) for s in shapes], "dtypes": list(dtypes), "seed": seed,
        "prod_attrs": prod_attrs or {}, "guard_bytes": guard_bytes, "skip": skip or {},
        "first_dist_only": first_dist_only, "max_failures": max_failures, "graph_sets": graph_sets,
    }
    wr = run_worker(job, argv=argv, timeout=timeout, total_timeout=total_timeout, env=env, progress=progress)
    tally = CheckTally()
    for ev in wr.events:
        if ev.get("event") == "case":
            tally.add(ev.get("details", []), ev.get("failures", []), ev.get("notes", []))
    p = wr.payload or {}
    if wr.status in ("ok", "failed") and p:
        failures = list(p.get("failures", tally.failures))
        reason = p.get("reason", "") or (failures[0] if failures else "")
        return CheckRun(bool(p.get("ok")) and not failures, reason, failures, list(p.get("details", tally.details)),
                        list(p.get("notes", tally.notes)), p.get("device", ""), wr)
    # timeout / crash / worker error: the candidate failed, and we say how
    who = "candidate" if cand else "production baseline"
    reason = wr.reason
    if "candidate on" not in wr.stage and "production on" not in wr.stage and cand:
        reason = f"{who}: {reason}"
    return CheckRun(False, reason, [reason] + tally.failures, tally.details, tally.notes, "", wr)


