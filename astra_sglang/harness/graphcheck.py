"""The candidate checked the way it is timed, so that it cannot tell a check from a timing run.

- `refill` + `judge_sets`: write fresh values into every input set in place (same pointers, outputs
  poisoned), replay a captured graph, compare every output and in-place side effect of every set
  with the fp64 reference (in-place ops: the op applied as many times as the graph calls it on that
  set). bench runs this on the very graph it timed, after the timed replays; check on a graph of
  the candidate back to back over several sets, twice, with fresh inputs on the same pointers.
- `stream_honesty`: the candidate launched on a non-default stream right behind queued work that
  writes its inputs, with no device-wide synchronize in between: a kernel that ignores its stream
  (default stream, a stream of its own) reads stale inputs and fails.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..spec import OpSpec
from .cases import case_seed
from .inputs import from_prod_abi, make_case_inputs, to_prod_abi
from .numerics import (BASELINE_SLACK, SHORT_DTYPE, bitwise_changed, canonical_outputs, count_poison, dtype_name,
                       poison_, rel_err, tolerance)
from .oracle import references

STALL_CYCLES = 50_000_000  # queued work ahead of the candidate in the stream test (~25 ms)


# Sets the timed-graph re-check judges at most. Tiny ops rotate up to MAX_SETS (16384) sets; making fresh inputs and
# an fp64 reference for each, one by one in Python, took ~25 s a row for moe_align (H200, 2026-11-27), so the
# decode bench never finished in a session. Fresh values go into these sets only, spread over the whole rotation
# (the first and the last included): a kernel that caches or skips work still leaves them wrong.
CHECK_SETS = 512


def checked_sets(n_sets: int, limit: int = CHECK_SETS) -> List[int]:
    """Indices of the sets the timed-graph re-check refills and judges: all of them up to `limit`, else `limit`
    evenly spread, 0 and n_sets - 1 among them."""
    if n_sets <= limit:
        return list(range(n_sets))
    return sorted({round(i * (n_sets - 1) / (limit - 1)) for i in range(limit)})


def calls_per_set(n_calls: int, n_sets: int) -> List[int]:
    """How often a graph of n_calls calls over sets i % n_sets calls each set."""
    return [len(range(j, n_calls, n_sets)) for j in range(n_sets)]


def _roles(spec: OpSpec) -> Dict[str, str]:
    return {a.name: a.role for a in spec.abi if a.ctype == "ptr"}


def fresh_inputs(spec: OpSpec, dims, dtype: str, dist: str, seeds: Sequence[int], device: str = "cuda") -> List[Dict[str, Any]]:
    return [make_case_inputs(spec, dims, dtype, dist, sd, device) for sd in seeds]


def refill(spec: OpSpec, sets: Sequence[Dict[str, Any]], prod_sets: Optional[Sequence[Dict[str, Any]]],
           fresh: Sequence[Dict[str, Any]], prod_attrs: Optional[Dict[str, Any]]) -> None:
    """fresh[j] into set j in place (same pointers); outputs poisoned. prod_sets: production's views of the
    same sets (converted copies of the inputs that differ, e.g. base-2 lse), refilled alike."""
    roles = _roles(spec)
    for j, s in enumerate(sets):
        t = fresh[j]
        for n, role in roles.items():
            if role in ("in", "inout"):
                s[n].copy_(t[n])
            else:
                poison_(s[n])
        if prod_sets is not None and prod_attrs:
            conv = to_prod_abi(spec, t, prod_attrs)
            for n, role in roles.items():
                p = prod_sets[j][n]
                if p is not s[n]:
                    p.copy_(conv[n]) if role in ("in", "inout") else poison_(p)


def set_references(spec: OpSpec, fresh: Sequence[Dict[str, Any]], dims, repeats: Sequence[int],
                   prod_attrs: Optional[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(candidate's, production's) fp64 references per set; in-place ops applied repeats[j] times."""
    scalars = spec.scalars(tuple(dims))
    return [references(spec, t, dims, scalars, prod_attrs, repeats[j]) for j, t in enumerate(fresh)]


def _flat(ts: Sequence[Any]):
    import torch

    return torch.cat([t.reshape(-1) for t in ts])


def judge_sets(spec: OpSpec, who: str, sets: Sequence[Dict[str, Any]], fresh: Sequence[Dict[str, Any]],
               refs: Sequence[Tuple[Dict[str, Any], Dict[str, Any]]], dtype: str, prod_attrs: Optional[Dict[str, Any]],
               label: str, prod_errs: Optional[Dict[str, float]] = None,
               dims=None, repeats: Optional[Sequence[int]] = None,
               alone: bool = False) -> Tuple[List[str], Dict[str, float]]:
    """Compare what a replay left in every set with the references of the inputs refill() wrote (special
    values are the eager check's business: these cases draw the first, finite, distribution). All sets
    of one output are compared at once (one error over their concatenation); a failing set is named.

    who == "production": judged against the fp64 reference alone (BASELINE_SLACK floors); returns its
    error per output, which the candidate's tolerance then uses (same inputs). Returns (failures, errors).

    alone: production does not take the case (no prod_errs): the candidate is held to the spec's `alone` bound, as
    the eager check holds it (numerics.tolerance).

    repeats: calls per set of the replayed graph. An in-place output that went through more than one call
    is judged by its normwise error: each call rounds to the buffer's dtype, so kernel and reference
    take different rounding walks, and the elementwise error of elements the walk leaves near zero
    grows without bound (on the H200, SGLang's own rope failed the elementwise rule after 63 calls at
    0.0038 normwise). A wrong number of calls or skipped rows still shows normwise."""
    roles = _roles(spec)
    n = len(sets)

    def where(j: int) -> str:
        return f"{label}, input set {j + 1} of {n}"

    for j, s in enumerate(sets):
        conv = to_prod_abi(spec, fresh[j], prod_attrs) if who == "production" else fresh[j]
        for name, role in roles.items():
            if role == "in":
                k = bitwise_changed(s[name], conv[name])
                if k:
                    return [f"{where(j)}: {who} modified its input {name} ({k} elements changed)"], {}
            elif role == "out":
                k = count_poison(s[name])
                if k:
                    return [f"{where(j)}: {who} never wrote {k} of {s[name].numel()} elements of {name} "
                            f"(poison left)"], {}
    outs = [canonical_outputs(spec, from_prod_abi(spec, s, prod_attrs) if who == "production" else
                              {name: s[name] for name, r in roles.items() if r in ("out", "inout")}, dims or ())
            for s in sets]
    errs: Dict[str, float] = {}
    walked = bool(repeats) and max(repeats) > 1
    for name in refs[0][0]:
        pick = 1 if who == "production" else 0
        got = _flat([o[name] for o in outs])
        # a walked inout (a chain of calls) and a spec judged normwise (tolerance.metric) take the normwise error
        key = "norm" if (walked and roles.get(name) == "inout") or spec.tolerance.metric == "norm" else "err"
        e = rel_err(got, _flat([r[pick][name] for r in refs]))
        e = dict(e, err=e[key])
        errs[name] = e["err"]
        short = SHORT_DTYPE.get(dtype_name(outs[0][name]), dtype)
        if who == "production":
            tol = BASELINE_SLACK * tolerance(spec, short, None)
        else:
            tol = tolerance(spec, short, (prod_errs or {}).get(name), alone=alone)
        if e["nan"] or not e["err"] <= tol:
            bad = next((j for j in range(n) if rel_err(outs[j][name], refs[j][pick][name])[key] > tol), 0)
            if e["nan"]:
                return [f"{where(bad)}: {who}'s {name} has NaN where the reference is finite"], errs
            what = "normwise error" if key == "norm" else "error"
            return [f"{where(bad)}: {who}'s {name} {what} {e['err']:.3g} > tolerance {tol:.3g}"
                    + ("" if who == "production" else
                       f" (production {(prod_errs or {}).get(name, float('nan')):.3g})")], errs
    return [], errs


def run_production_eager(spec: OpSpec, prod, bufs, dims, dtype: str, fresh: Sequence[Dict[str, Any]],
                         refs, prod_attrs: Optional[Dict[str, Any]], label: str,
                         reference_only: bool = False) -> Tuple[List[str], Dict[str, float], str]:
    """Production's errors on `fresh` (one eager call per set in one guarded buffer set, outputs kept):
    the tolerance the candidate's graph replay is judged with. Returns (failures, errors, refused). Where production
    does not take the shape (reference_only, or an error code: `refused` says which) there are no errors, so the
    candidate is held to the spec's `alone` bound (else its dtype's floor)."""
    import torch

    if reference_only:
        return [], {}, ""
    scalars = spec.scalars(tuple(dims))
    kept = []
    for t in fresh:
        bufs.load(to_prod_abi(spec, t, prod_attrs))
        rc = prod(bufs.views, dims, dtype, scalars)
        torch.cuda.synchronize()
        if rc:
            return [], {}, (f"{label}: production returned cudaError {rc}; the candidate is judged against the fp64 "
                            "reference alone")
        kept.append({n: v.clone() for n, v in bufs.views.items()})
    return (*judge_sets(spec, "production", kept, fresh, refs, dtype, prod_attrs, label, dims=dims), "")


def check_as_timed(ctx, dims, dtype: str, reference_only: bool = False) -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    """check's in-graph and stream cases for one shape×dtype (ctx: checkjob.CheckContext). Returns
    (details, failures, notes) like oracle.run_case. reference_only (production does not take the shape), or
    production refusing it at run time: the candidate's replay is held to the spec's `alone` bound (else the floor)."""
    import torch

    from .guards import GuardedSet
    from .timer import graph_of

    spec, n_sets = ctx.spec, max(2, ctx.graph_sets)
    dist = spec.distributions[0] if spec.distributions else "normal"
    skey = "x".join(map(str, dims))
    scalars = spec.scalars(tuple(dims))
    proto = make_case_inputs(spec, dims, dtype, dist, case_seed(ctx.seed, dims, dtype, "graph-proto"), "cuda")
    bufs = [GuardedSet(spec, proto, "cuda", ctx.guard) for _ in range(n_sets)]
    pbuf = GuardedSet(spec, proto, "cuda", ctx.guard)
    del proto
    sets = [b.views for b in bufs]
    details: List[Dict[str, Any]] = []
    notes: List[str] = []

    def call(i: int) -> None:
        rc = ctx.cand(sets[i % n_sets], dims, dtype, scalars)
        if rc:
            raise RuntimeError(f"candidate returned cudaError {rc}")

    ctx.emit("stage", msg=f"candidate captured in a CUDA graph on {skey} {dtype} ({n_sets} input sets)")
    try:
        refill(spec, sets, None, fresh_inputs(spec, dims, dtype, dist, [case_seed(ctx.seed, dims, dtype, "graph-warm", j)
                                                                   for j in range(n_sets)]), None)
        g = graph_of(call, n_sets)
    except RuntimeError as e:
        return [], [f"{skey} {dtype} in a CUDA graph: candidate could not be captured/run: {str(e).splitlines()[0]}"], []
    for rnd in range(2):
        label = f"{skey} {dtype} {dist} in a CUDA graph, back to back" + (", replayed with fresh inputs" if rnd else "")
        fresh = fresh_inputs(spec, dims, dtype, dist, [case_seed(ctx.seed, dims, dtype, "graph", rnd, j)
                                                       for j in range(n_sets)])
        refs = set_references(spec, fresh, dims, [1] * n_sets, ctx.prod_attrs)
        f, perrs, refused = run_production_eager(spec, ctx.prod, pbuf, dims, dtype, fresh, refs, ctx.prod_attrs,
                                                 label, reference_only)
        if refused:
            notes.append(refused)
        if f:
            return details, [], notes + [f"{f[0]} (in-graph case skipped)"]
        refill(spec, sets, None, fresh, None)
        for b in bufs:
            b.fill_guards()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        f = guard_failures(bufs, label)
        if not f:
            f, _ = judge_sets(spec, "candidate", sets, fresh, refs, dtype, None, label, perrs, dims=dims,
                              alone=reference_only or bool(refused))
        details.append({"shape": skey, "dtype": dtype, "dist": dist, "run": f"graph-{rnd}", "tensor": "*",
                        "cand_err": None, "prod_err": None, "tol": None, "ok": not f})
        if f:
            return details, f, notes
    del g
    f = stream_honesty(ctx, bufs[0], pbuf, dims, dtype, dist, reference_only)
    details.append({"shape": skey, "dtype": dtype, "dist": dist, "run": "stream", "tensor": "*",
                    "cand_err": None, "prod_err": None, "tol": None, "ok": not f})
    return details, f, notes


def guard_failures(bufs, label: str) -> List[str]:
    for j, b in enumerate(bufs):
        for name, (before, after) in b.guard_damage().items():
            where = " and ".join(w for w, n in (("before the start", before), ("past the end", after)) if n)
            return [f"{label}, input set {j + 1}: candidate wrote outside {name}: {before + after} guard bytes "
                    f"changed {where}"]
    return []


def stream_honesty(ctx, buf, pbuf, dims, dtype: str, dist: str, reference_only: bool = False) -> List[str]:
    """The candidate on a fresh non-default stream, queued right behind a long kernel and the copy of
    its fresh inputs into its buffers; no device-wide synchronize between them and the launch. Where production
    does not take the shape (reference_only, or an error code) the spec's `alone` bound judges the candidate."""
    import torch

    spec = ctx.spec
    skey = "x".join(map(str, dims))
    label = f"{skey} {dtype} {dist} on a non-default stream behind queued work that writes its inputs"
    fresh = make_case_inputs(spec, dims, dtype, dist, case_seed(ctx.seed, dims, dtype, "stream"), "cuda")
    refs = set_references(spec, [fresh], dims, [1], ctx.prod_attrs)
    f, perrs, refused = run_production_eager(spec, ctx.prod, pbuf, dims, dtype, [fresh], refs, ctx.prod_attrs, label,
                                             reference_only)
    if f:
        return []
    roles = _roles(spec)
    for n, role in roles.items():  # stale inputs (another draw) and poisoned outputs, settled before the test
        if role == "out":
            poison_(buf.views[n])
    torch.cuda.synchronize()
    s = torch.cuda.Stream()  # torch's streams are non-blocking: the legacy default stream does not wait on them
    scalars = spec.scalars(tuple(dims))
    with torch.cuda.stream(s):
        torch.cuda._sleep(STALL_CYCLES)
        for n, role in roles.items():
            if role in ("in", "inout"):
                buf.views[n].copy_(fresh[n], non_blocking=True)
        rc = ctx.cand(buf.views, dims, dtype, scalars)
    s.synchronize()
    torch.cuda.synchronize()
    if rc:
        return [f"{label}: candidate returned cudaError {rc}"]
    f, _ = judge_sets(spec, "candidate", [buf.views], [fresh], refs, dtype, None, label, perrs, dims=dims,
                      alone=reference_only or bool(refused))
    if f:
        return [f[0].replace(", input set 1 of 1", "") + " (stale inputs read: does the kernel ignore its stream argument?)"]
    return []
