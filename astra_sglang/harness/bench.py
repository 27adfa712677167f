"""`astra-sglang bench`: how fast is a kernel, against the production kernel, measured properly.

Method (DESIGN.md, Timing):
- each implementation is captured as a CUDA graph of N back-to-back calls over rotating input
  sets totalling more than 4× the L2 (every call L2-cold, no launch gaps between calls); the
  graph is replayed R times, each replay timed with CUDA events; per-call time = replay / N;
- production and candidate are captured on the same input sets and replayed interleaved
  (P C, C P, P C, ...), so clock or thermal drift hits both alike;
- median and spread ((p90 - p10) / median) over replays; a difference smaller than the larger
  spread is reported as noise; speedup per shape and the geometric mean;
- the copy ceiling is measured once per GPU with an SM copy kernel (a graph's y.copy_(x)
  becomes a copy-engine memcpy node, which is slower) and cached on disk; % of ceiling uses
  the spec's bytes moved; the graph launch floor is an empty kernel's per-call time in a graph;
- in-place outputs (inout) are restored from a pristine copy before every replay, outside the
  timed region; production variants with their own convention (FlashInfer's base-2 lse) get
  converted copies of the inputs, made once, outside it too;
- decode rows are also timed in context (a producer GEMM -> op -> consumer GEMM graph beside the GEMMs
  alone), and so is the touch kernel (waits for the producer, reads one byte), PDL-launched and plainly:
  the lower marginal time is the floor no kernel in that place beats, and production's time over it the
  most a candidate can gain;
- L2-warm timing (one input set, repeated) is an option;
- after timing, the candidate is re-checked on fresh inputs in the very buffers it was timed
  on (catches results cached by pointer or warm-up detection).
"""
from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..build.cache import cache_root
from ..build.workspace import open_workspace
from ..errors import AstraError
from ..spec import Shape
from .cases import (case_seed, default_bench_shapes, default_dtypes, not_served, production_skips, select_shapes,
                    workspace_dtypes)
from .guards import GuardedSet
from .impl import Impl
from .installed import bitwise_mismatches, resolve_installed
from .inputs import make_case_inputs, to_prod_abi
from .oracle import FatalCaseError, run_case
from .results import BenchReport, BenchRow
from .rules import DECODE_MAX_TOKENS
from .timer import (CONTEXT_K, DEFAULT_REPLAYS, MEM_CAP_BYTES, Helpers, Neighbours, build_helpers, ceiling_key,
                    graph_of, load_cached_ceiling, measure_ceiling, measure_launch_floor, plan_calls,
                    plan_context_calls, plan_sets, store_ceiling, time_graphs)


def _set_bytes(tensors: Dict[str, Any], names: Sequence[str]) -> int:
    return sum(tensors[n].numel() * tensors[n].element_size() for n in names)


def run_bench_job(job: Dict[str, Any]) -> Dict[str, Any]:
    """Worker entry (mode 'bench')."""
    import torch

    from ..registry import get_op
    from .worker import emit

    spec = get_op(job["op"])
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    dev_name = props.name
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or job.get("l2_bytes") or (50 << 20))
    uuid = str(getattr(props, "uuid", ""))
    emit("stage", msg=f"device {dev_name}: {props.multi_processor_count} SMs, L2 {l2_bytes >> 20} MiB")
    helpers = Helpers(job["helper_lib"])
    gemm = None
    if job.get("neighbour_linear"):  # --neighbours astra: the GEMMs a patched server runs around the op
        from .neighbour_gemm import AstraLinear

        gemm = AstraLinear(job["neighbour_linear"])
    norm = None
    if job.get("neighbour_norm"):  # a site whose output serving runs through astra's norm first (Site.norm_after)
        from .neighbour_gemm import AstraRMSNorm

        norm = AstraRMSNorm(job["neighbour_norm"])
    key = ceiling_key(dev_name, uuid, torch.version.cuda or "")
    cached = load_cached_ceiling(Path(job["ceiling_cache"]), key) if not job.get("remeasure") else None
    if cached:
        ceiling, source = cached, "cached"
    else:
        emit("stage", msg="measuring the copy ceiling (SM copy kernel)")
        ceiling, source = measure_ceiling(helpers), "measured"
        store_ceiling(Path(job["ceiling_cache"]), key, ceiling)
    emit("stage", msg="measuring the graph launch floor")
    floor_us, floor_spread = measure_launch_floor(helpers, with_spread=True)
    gbps = float(ceiling["gbps"])
    prod = Impl(job["prod"], spec)
    cand = Impl(job["cand"], spec) if job.get("cand") else None
    inst = Impl(f"installed:{job['installed']}", spec) if job.get("installed") else None
    replays = int(job.get("replays", DEFAULT_REPLAYS))
    l2 = job.get("l2", "cold")
    seed = int(job.get("seed", 0))
    prod_attrs = job.get("prod_attrs") or {}
    skip = job.get("skip", {})
    ptr_names = [a.name for a in spec.abi if a.ctype == "ptr"]
    inout = [a.name for a in spec.abi if a.ctype == "ptr" and a.role == "inout"]
    rows: List[Dict[str, Any]] = []
    notes: List[str] = []
    recheck = {"ok": True, "reason": "", "cases": 0, "failures": []}
    for shape in job["shapes"]:
        dims = tuple(int(x) for x in shape["dims"])
        skey = "x".join(map(str, dims))
        for dtype in job["dtypes"]:
            if f"{skey} {dtype}" in skip:
                notes.append(f"{skey} {dtype}: skipped ({skip[f'{skey} {dtype}']})")
                continue
            emit("stage", msg=f"timing {skey} {dtype}")
            dist = spec.distributions[0] if spec.distributions else "normal"
            first = make_case_inputs(spec, dims, dtype, dist, case_seed(seed, dims, dtype, "bench", 0), "cuda")
            sb = _set_bytes(first, ptr_names)
            n_sets, cap_note = plan_sets(sb, l2_bytes, l2, int(job.get("mem_cap", MEM_CAP_BYTES)))
            # set 0 lives in guarded buffers: the re-check after timing reuses exactly these pointers
            gset = GuardedSet(spec, first, "cuda")
            gset.load(first)
            sets = [gset.views]
            for i in range(1, n_sets):
                t = make_case_inputs(spec, dims, dtype, dist, case_seed(seed, dims, dtype, "bench", i), "cuda")
                sets.append({n: t[n] for n in ptr_names})
            # production takes its variant's convention (e.g. base-2 lse): converted copies of the
            # inputs that differ, made once here, outside the timed region; outputs are shared
            prod_sets = [{n: to_prod_abi(spec, s, prod_attrs)[n] for n in ptr_names} for s in sets]
            pristine = [{n: s[n].clone() for n in inout} for s in sets] if inout else []
            scalars = spec.scalars(dims)
            bm = int(spec.bytes_moved(dims, dtype))
            est = max(floor_us, bm / (gbps * 1e3)) if gbps else floor_us
            n_calls = plan_calls(est, n_sets)
            impls = ([("production", prod)] + ([("candidate", cand)] if cand else [])
                     + ([("installed", inst)] if inst else []))
            graphs = []
            row_note = cap_note
            failed, who_failed = "", ""
            for who, impl in impls:
                def call(i: int, impl=impl, who=who) -> None:
                    rc = impl((prod_sets if who == "production" else sets)[i % n_sets], dims, dtype, scalars)
                    if rc:
                        raise RuntimeError(f"{who} returned cudaError {rc}")
                try:
                    graphs.append(graph_of(call, n_calls, warm=n_sets))
                except RuntimeError as e:
                    failed = f"{skey} {dtype}: {who} could not be captured/run: {str(e).splitlines()[0]}"
                    who_failed = who
                    break
            if who_failed == "installed":  # SGLang's own callable: say so, time the rest
                notes.append(failed)
                impls = impls[:len(graphs)]
                failed = ""
            # production is an installed callable that returns its outputs: the copies into the ABI buffers
            # are the binding's, not SGLang's; timed alone in the same rotation and taken out below. An extracted
            # launcher's work that serving does not do at these dims (spec.launcher_only) likewise
            if failed:
                bind = None
            elif job.get("prod_binding"):
                bind = prod.binding
            else:
                bind = spec.launcher_only(dims) if spec.launcher_only else None
            if bind is not None:
                graphs.append(graph_of(lambda i: bind(prod_sets[i % n_sets]), n_calls))
            if failed:
                if who_failed == "production":
                    notes.append(failed)
                    continue
                recheck.update(ok=False, reason=recheck["reason"] or failed)
                recheck["failures"].append(failed)
                emit("row", row=None, failure=failed)
                continue

            dst = [s[n] for s in sets for n in inout]
            src = [p[n] for p in pristine for n in inout]
            converted = [(s, ps) for s, ps in zip(sets, prod_sets) if any(ps[n] is not s[n] for n in inout)]

            def restore(j: int) -> None:
                copy_all(dst, src)
                for s, ps in converted:
                    conv = to_prod_abi(spec, {**s}, prod_attrs)
                    for n in inout:
                        if ps[n] is not s[n]:
                            ps[n].copy_(conv[n])

            ms = time_graphs(graphs, replays, restore if inout else None)
            bind_us = None
            if bind is not None:
                bsamples = [m * 1e3 / n_calls for m in ms.pop()]
                graphs.pop()
                bind_us = sorted(bsamples)[len(bsamples) // 2]
            per_call = {who: [m * 1e3 / n_calls for m in series] for (who, _), series in zip(impls, ms)}
            if bind_us is not None:  # per replay: production minus its binding copies of the same replay
                per_call["production"] = [max(p - b, 1e-3) for p, b in zip(per_call["production"], bsamples)]
            row = BenchRow.make(skey, dtype, per_call["production"], per_call.get("candidate"), bm, gbps,
                                calls_per_replay=n_calls, input_sets=n_sets, replays=replays,
                                tags=list(shape.get("tags", [])), note=row_note)
            row.prod_binding_us = bind_us
            if "installed" in per_call:
                row.set_installed(per_call["installed"], bitwise_mismatches(
                    spec, prod, inst, dims, dtype, dist, case_seed(seed, dims, dtype, "bits"), prod_attrs))
            if job.get("context", True):
                emit("stage", msg=f"timing {skey} {dtype} in context (producer GEMM -> op -> consumer GEMM)")
                sites = serving_sites(spec, dims) if job.get("sites") else ()
                ctx_note = time_in_context(spec, row, sets, prod_sets, impls, dims, dtype, scalars, est, gbps, replays,
                                           restore if inout else None, job.get("consumer_width"), helpers,
                                           job.get("producer_k"), gemm, sites, norm)
                if ctx_note:
                    notes.append(f"{skey} {dtype}: {ctx_note}")
            refused = []
            if job.get("recheck", True):
                emit("stage", msg=f"{skey} {dtype}: the timed graphs replayed on fresh inputs in the same buffers")
                refused += verify_timed_graphs(spec, graphs, impls, sets, prod_sets, gset, dims, dtype, dist, seed,
                                               n_calls, prod_attrs)
            if row.context_failed:
                refused.append(f"{skey} {dtype}: {row.context_failed}")
            if l2 == "cold":
                refused += refuse_impossible(row, gbps, float(ceiling.get("spread") or 0.0), floor_us, floor_spread,
                                             ceiling.get("read_gbps"))
            if refused:
                row.failed = refused[0]
                recheck["failures"] += refused
                recheck.update(ok=False, reason=recheck["reason"] or refused[0])
            recheck["timed_graphs"] = recheck.get("timed_graphs", 0) + (len(impls) if job.get("recheck", True) else 0)
            rows.append(row.__dict__)
            emit("row", row=row.__dict__)
            del graphs
            # re-check on fresh inputs in the buffers the candidate was just timed on
            if job.get("recheck", True):
                emit("stage", msg=f"re-check {skey} {dtype} after timing")
                try:
                    bufs_p = GuardedSet(spec, first, "cuda")
                    d, f, n = run_case(spec, cand or prod, prod, gset, gset if cand is None else bufs_p, dims, dtype, dist,
                                       case_seed(seed, dims, dtype, "recheck"), "cuda", run_index=1,
                                       label=f"{skey} {dtype} re-check after timing", baseline_only=cand is None,
                                       prod_attrs=prod_attrs)
                    del bufs_p
                except FatalCaseError as e:
                    f, n = [str(e)], []
                    recheck["cases"] += 1
                    recheck["failures"] += f
                    recheck.update(ok=False, reason=recheck["reason"] or f[0])
                    return _bench_result(rows, notes, recheck, dev_name, props, l2_bytes, gbps, source, floor_us,
                         ceiling.get("read_gbps"))
                recheck["cases"] += 1
                notes += n
                if f:
                    recheck["failures"] += f
                    recheck.update(ok=False, reason=recheck["reason"] or f[0])
                # the parent's partial JSON keeps the re-checks so far: a run cut by its deadline still says
                emit("recheck", recheck=recheck, failures=f)
            # dropped, not del'd: the timed closures above name them (pyflakes reads a del as undefining them)
            sets = prod_sets = pristine = gset = first = None
            torch.cuda.empty_cache()
    return _bench_result(rows, notes, recheck, dev_name, props, l2_bytes, gbps, source, floor_us,
                         ceiling.get("read_gbps"))


def serving_sites(spec, dims) -> Tuple[Any, ...]:
    """The GEMM pairs serving runs this row between (spec.context_sites), for the rows judged in context (decode);
    () for prefill rows (they keep the one pair) and for ops without sites."""
    if spec.context_sites is None or int(dims[0]) > DECODE_MAX_TOKENS:
        return ()
    return tuple(spec.context_sites(dims))


def sites_need_norm(spec, dims_list: Sequence[Sequence[int]]) -> bool:
    """Whether a row's serving site runs astra's norm after or before the op (sites.Site.norm_after, norm_before):
    bench then builds it."""
    return any(s.norm_after or s.norm_before for dims in dims_list for s in serving_sites(spec, dims))


def time_in_context(spec, row: BenchRow, sets, prod_sets, impls, dims, dtype: str, scalars, est_us: float, gbps: float,
                    replays: int, before, consumer_width: Optional[int] = None,
                    helpers: Optional[Helpers] = None, producer_k: Optional[int] = None, gemm: Any = None,
                    sites: Sequence[Any] = (), norm: Any = None) -> str:
    """Time each implementation between a producer and a consumer GEMM (timer.Neighbours; `gemm`: astra's linear
    where the patched server runs it, neighbour_gemm.py) on input set 0,
    beside the neighbours alone, interleaved; record marginal times and the basis on `row`. With `helpers`, the
    touch kernel is timed in the same place too, PDL-launched and plainly: the lower is the in-context floor no
    kernel there can beat, so production's time over it is the most any candidate could gain (`BenchRow.headroom`).
    `sites` (sites.Site, from spec.context_sites): the GEMM pairs serving runs the row between, each timed so, the row
    recording their mean and each on its own (`row.context_sites`); none: the one pair of `producer_k` and
    `consumer_width`. A site with norm_after puts `norm` (astra's rmsnorm) between the op and the consumer GEMM, one
    with norm_before between the producer GEMM and the op, one with both on each side.
    Returns a note when it could not be measured ('' otherwise)."""
    import torch

    from .rules import timing_basis

    places = ([(s.producer_k, s.consumer_width, s.norm_after, s.norm_before) for s in sites]
              or [(int(producer_k or CONTEXT_K), consumer_width, False, False)])
    timed = []
    for k, ck, norm_after, norm_before in places:
        if (norm_after or norm_before) and norm is None:
            return "in-context timing not measured: the site runs astra's norm beside the op, and none was built"
        t = time_at_site(spec, sets, prod_sets, impls, dims, dtype, scalars, est_us, gbps, replays, before, k, ck,
                         helpers, gemm, norm if norm_after or norm_before else None, norm_before, norm_after)
        if isinstance(t, str):
            return t
        timed.append(t)
    site = combine_sites(timed)
    row.context_gemms = site["gemms"]
    if site["floor"] is not None:
        row.set_context_floor(*site["floor"])
    marg = site["marg"]
    if row.prod_binding_us is not None:  # the binding's copies (timed alone, chained) are not SGLang's
        marg["production"] = {**marg["production"],
                              "median": max(marg["production"]["median"] - row.prod_binding_us, 1e-3),
                              "samples": [x - row.prod_binding_us for x in marg["production"].get("samples", [])]}
    row.set_context(marg["production"], marg.get("candidate"), site["neighbours_us"], timing_basis(dims, True))
    if "installed" in marg:
        row.context_installed_us = marg["installed"]["median"]
    row.context_failed = site["failed"]
    if sites:
        row.context_sites = [{**s.as_dict(), **site_times(t)} for s, t in zip(sites, timed)]
    torch.cuda.synchronize()
    return unmeasurable_context(row) or site["floor_note"]


def time_at_site(spec, sets, prod_sets, impls, dims, dtype: str, scalars, est_us: float, gbps: float, replays: int,
                 before, k: int, consumer_k: Optional[int], helpers: Optional[Helpers], gemm: Any,
                 norm: Any = None, norm_before: bool = False, norm_after: Optional[bool] = None) -> Any:
    """One place of time_in_context: the producer GEMM of inner size `k`, the consumer of width `consumer_k` (after
    `norm` where given, or before the op with `norm_before`, or both with `norm_after` too: timer.Neighbours). Returns
    {"gemms", "marg": who -> stats.marginal, "neighbours_us", "floor": (marginal, launch) or None, "failed",
    "floor_note"}, or a note (str) when it could not be measured."""
    import torch

    from .stats import marginal

    try:
        nb = Neighbours(spec, sets[0], k=k, consumer_k=consumer_k, gemm=gemm, norm=norm, norm_before=norm_before,
                        norm_after=norm_after)
    except (RuntimeError, ValueError, IndexError) as e:
        return f"in-context timing not measured ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    n = plan_context_calls(nb.gemm_bytes, est_us, gbps)

    def alone(i: int) -> None:
        nb.produce(sets[0], i)
        nb.consume(sets[0])

    graphs = [graph_of(alone, n)]
    for who, impl in impls:
        t = prod_sets[0] if who == "production" else sets[0]

        def triple(i: int, impl=impl, t=t, who=who) -> None:
            nb.produce(t, i)
            rc = impl(t, dims, dtype, scalars)
            if rc:
                raise RuntimeError(f"{who} returned cudaError {rc}")
            nb.consume(t)

        try:
            graphs.append(graph_of(triple, n))
        except RuntimeError as e:
            return f"in-context timing not measured: {who} could not be captured/run: {str(e).splitlines()[0]}"
    floor_note = ""
    if helpers is not None:
        scratch = torch.empty(16, dtype=torch.uint8, device="cuda")

        def touched(i: int, pdl: bool = True) -> None:
            nb.produce(sets[0], i)
            rc = helpers.touch(nb.produced(sets[0]), scratch, pdl)
            if rc:
                raise RuntimeError(f"touch kernel returned cudaError {rc}")
            nb.consume(sets[0])

        try:  # PDL-launched and plain: behind a producer that never releases early the plain launch is cheaper
            for pdl in (True, False):
                graphs.append(graph_of(lambda i, pdl=pdl: touched(i, pdl), n))
        except RuntimeError as e:  # the floor is a bound, not the measurement: the row is timed without it
            floor_note = f"in-context floor not measured: {str(e).splitlines()[0]}"
    ms = time_graphs(graphs, replays, before)
    per = [[m * 1e3 / n for m in series] for series in ms]
    marg = {who: marginal(p, per[0]) for (who, _), p in zip(impls, per[1:])}
    touches = per[1 + len(impls):]   # the touch graphs that could be captured, PDL first
    floor = lower_floor([marginal(p, per[0]) for p in touches]) if touches else None
    failed = verify_context_graphs(spec, graphs[1:1 + len(impls)], impls, sets, prod_sets, nb, dims, dtype, n)
    return {"gemms": " / ".join(nb.kinds), "marg": marg, "neighbours_us": sorted(per[0])[len(per[0]) // 2],
            "floor": floor, "failed": failed, "floor_note": floor_note}


def site_times(t: Dict[str, Any]) -> Dict[str, Any]:
    """One place's times as the row keeps them (row.context_sites): its GEMMs, each implementation's median
    ("production_us", ...) and its floor where measured."""
    out = {"gemms": t["gemms"], **{f"{who}_us": m["median"] for who, m in t["marg"].items()}}
    if t["floor"] is not None:
        out.update(floor_us=t["floor"][0]["median"], floor_launch=t["floor"][1])
    return out


def combine_sites(timed: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """time_at_site's results at several places as one: the mean of each median (each place runs the op equally
    often: once a layer), the largest spread, the first failure, each place's GEMMs and floor launch joined with
    "; " where they differ. One place: as it is."""
    if len(timed) == 1:
        return timed[0]

    def mean_of(ms: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        out = {"median": sum(m["median"] for m in ms) / len(ms), "spread": max(m["spread"] for m in ms)}
        series = [m.get("samples") or [] for m in ms]
        n = min(len(x) for x in series)
        if n:  # round r of every place, averaged: the rounds stay paired across implementations (stats.paired_ci)
            out["samples"] = [sum(x[r] for x in series) / len(series) for r in range(n)]
        return out

    def joined(xs: Sequence[str]) -> str:
        return xs[0] if len(set(xs)) == 1 else "; ".join(xs)

    marg = {who: mean_of([t["marg"][who] for t in timed]) for who in timed[0]["marg"]
            if all(who in t["marg"] for t in timed)}
    floors = [t["floor"] for t in timed]
    floor = None
    if all(f is not None for f in floors):
        floor = (mean_of([f[0] for f in floors]), joined([f[1] for f in floors]))
    return {"gemms": joined([t["gemms"] for t in timed]), "marg": marg,
            "neighbours_us": sum(t["neighbours_us"] for t in timed) / len(timed), "floor": floor,
            "failed": next((t["failed"] for t in timed if t["failed"]), ""),
            "floor_note": next((t["floor_note"] for t in timed if t["floor_note"]), "")}


def lower_floor(touches: Sequence[Dict[str, Any]]) -> Tuple[Dict[str, Any], str]:
    """The in-context floor from the touch kernel's marginal times, PDL-launched first, then plain (either may be
    missing when its capture failed): the lower median, and how that touch was launched."""
    launches = ("PDL", "plain")[:len(touches)]
    i = min(range(len(touches)), key=lambda j: touches[j]["median"])
    return touches[i], launches[i]


def unmeasurable_context(row: Any) -> str:
    """The note of a decode row whose in-context marginal came out not positive (set_context then kept the chained
    speedup): said in the footer with the other rows in context not measured."""
    if row.context_cand_us is None or row.context_speedup is not None:
        return ""
    return (f"in-context timing not measured: a marginal time was not positive (production {row.context_base_us:.2f} "
            f"µs, candidate {row.context_cand_us:.2f} µs, spread {row.context_spread_us:.2f} µs); rerun the row")


def copy_all(dst: Sequence[Any], src: Sequence[Any]) -> None:
    """dst[i].copy_(src[i]) for all i, in a few multi-tensor kernels: before every replay of an in-place
    op's graph bench restores thousands of small sets (L2-cold rotation of a decode shape), and one
    copy_ per tensor made that restore most of a decode row's bench time."""
    import torch

    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None and dst:
        foreach(list(dst), list(src))
        return
    for d, s in zip(dst, src):
        d.copy_(s)


def verify_context_graphs(spec, graphs, impls, sets, prod_sets, nb, dims, dtype: str, n: int) -> str:
    """What was timed in context is checked too, where the op leaves its producer's output in place (out-of-
    place ops, no in-place tensor, production in the op's own convention): replay each timed graph once
    with poisoned outputs, then compare the outputs with the reference of the inputs the producer GEMM
    wrote. A kernel that reads its input before waiting for the producer (PDL) fails here. '' when it
    passes or does not apply, else the first failure."""
    import torch

    from .graphcheck import judge_sets, set_references
    from .numerics import poison_

    roles = {a.name: a.role for a in spec.abi if a.ctype == "ptr"}
    if "inout" in roles.values() or any(prod_sets[0][k] is not sets[0][k] for k in roles):
        return ""
    prod_errs = None
    label = f"{'x'.join(map(str, dims))} {dtype} timed in-context graph (producer GEMM -> op -> consumer GEMM)"
    for (who, _impl), g in zip(impls, graphs):
        t = sets[0]
        for k, r in roles.items():
            if r == "out":
                poison_(t[k])
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        fresh = [{k: v.clone() for k, v in t.items()}]
        refs = set_references(spec, fresh, dims, [1], None)
        f, errs = judge_sets(spec, who, [t], fresh, refs, dtype, None, label, prod_errs, dims=dims)
        if who == "production":
            if f:
                return ""  # no tolerance to judge by (production's own trouble shows in the chained check)
            prod_errs = errs
        elif f:
            return f[0].replace(", input set 1 of 1", "")
    return ""


def verify_timed_graphs(spec, graphs, impls, sets, prod_sets, gset, dims, dtype: str, dist: str, seed: int,
                        n_calls: int, prod_attrs) -> List[str]:
    """What was timed is checked: fresh values into the input sets in place (every set, or CHECK_SETS of them
    spread over a longer rotation), each timed graph replayed, every output and in-place side effect of those sets
    compared with the reference (production first: its errors set the candidate's tolerance). Returns the
    failures."""
    import torch

    from .graphcheck import calls_per_set, checked_sets, fresh_inputs, guard_failures, judge_sets, refill, set_references

    n_sets = len(sets)
    skey = "x".join(map(str, dims))
    idx = checked_sets(n_sets)   # set 0 (the guarded one) is always among them, and first
    sub = [sets[j] for j in idx]
    sub_prod = [prod_sets[j] for j in idx]
    per_set = calls_per_set(n_calls, n_sets)
    repeats = [per_set[j] for j in idx]
    fresh = fresh_inputs(spec, dims, dtype, dist, [case_seed(seed, dims, dtype, "timed-graph", j) for j in idx])
    refs = set_references(spec, fresh, dims, repeats, prod_attrs)
    prod_errs = None
    out: List[str] = []
    label = f"{skey} {dtype} timed graph replayed on fresh inputs" + (
        f" ({len(idx)} of its {n_sets} sets judged, spread over the rotation)" if len(idx) < n_sets else "")
    for (who, _impl), g in zip(impls, graphs):
        refill(spec, sub, sub_prod, fresh, prod_attrs)
        gset.fill_guards()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        f = guard_failures([gset], label)
        if not f:
            f, errs = judge_sets(spec, who, sub_prod if who == "production" else sub, fresh, refs, dtype, prod_attrs,
                                 label, prod_errs, dims=dims, repeats=repeats)
            if who == "production":
                prod_errs = errs
        if f:
            f0 = f[0] if who != "production" or "production" in f[0] else f"production: {f[0]}"
            out.append(f0 + _calls_seen(spec, sub_prod if who == "production" else sub, fresh, dims,
                                        repeats[0], prod_attrs, who))
            if who == "production":
                break  # no tolerance to judge the candidate with
    del fresh, refs
    return out


def _calls_seen(spec, sets, fresh, dims, expected: int, prod_attrs, who: str) -> str:
    """For an in-place op that failed the timed-graph re-check: how many applications of the op the
    first input set's in-place outputs look like (a replay that ran the op more or fewer times than
    the graph holds, or a stale buffer, shows here). '' for other ops."""
    from .graphcheck import _flat
    from .inputs import reference_kwargs
    from .numerics import rel_err
    from .oracle import reference_walk

    inout = [a.name for a in spec.abi if a.ctype == "ptr" and a.role == "inout"]
    if not inout:
        return ""
    kw = reference_kwargs(spec, prod_attrs) if who == "production" else {}
    walk = reference_walk(spec, fresh[0], dims, spec.scalars(tuple(dims)), **kw)  # one chain, k = 1, 2, ...
    first = next(walk)
    inout = [n for n in inout if n in first]  # scratch the reference does not define (moe_experts' act) says nothing
    if not inout:
        return ""

    def norm(ref) -> float:
        return max(rel_err(_flat([sets[0][n]]), _flat([ref[n]]))["norm"] for n in inout)

    errs = {0: norm({n: fresh[0][n] for n in inout}), 1: norm(first)}
    errs.update({k: norm(next(walk)) for k in range(2, 2 * expected + 2)})
    best = min(errs, key=errs.get)
    return (f" [set 1 is closest to {best} application(s) of the op (normwise {errs[best]:.3g}); the graph holds "
            f"{expected} per set; 0 applications: {errs[0]:.3g}]")


def refuse_impossible(row: BenchRow, gbps: float, ceiling_spread: float, floor_us: float,
                      floor_spread: float, read_gbps: Optional[float] = None) -> List[str]:
    """Chained (L2-cold) times above the copy ceiling or under the launch floor: refused (rules.py)."""
    from .rules import impossible

    out = []
    for who, us, sp in (("production", row.prod_us, row.prod_spread), ("candidate", row.cand_us, row.cand_spread)):
        # (the installed callable is SGLang's: measured and shown, not judged)
        if us is None:
            continue
        why = impossible(who, us, sp, row.bytes_moved, gbps, ceiling_spread, floor_us, floor_spread, read_gbps)
        if why:
            out.append(f"{row.shape} {row.dtype}: {why}")
    return out


def _bench_result(rows, notes, recheck, dev_name, props, l2_bytes, gbps, source, floor_us,
                  read_gbps: Optional[float] = None) -> Dict[str, Any]:
    import torch

    return {
        "ok": bool(recheck["ok"]), "reason": recheck["reason"], "rows": rows, "notes": notes, "recheck": recheck,
        "device": dev_name, "sm_count": props.multi_processor_count, "l2_bytes": l2_bytes, "ceiling_gbps": gbps,
        "read_ceiling_gbps": read_gbps,
        "ceiling_source": source, "launch_floor_us": floor_us,
        "software": {"torch": torch.__version__, "cuda": torch.version.cuda or "",
                     "driver": _driver_version()},
    }


def _driver_version() -> str:
    from ..build import query_gpu

    return query_gpu("driver_version") or ""



# ------------------------------------------------------------------------------------------
# caller side


def fold_event(rep: BenchReport, ev: Dict[str, Any], total_rows: int, say: Callable[[str], None]) -> bool:
    """Fold one worker event into the report so far: a timed row, or the re-checks after timing so far (a failed
    one is said at once). True when the report changed, so a run cut short keeps what it had measured and checked."""
    kind = ev.get("event")
    if kind == "recheck":
        rep.recheck = dict(ev.get("recheck") or {})
        for f in ev.get("failures") or []:
            say(f"re-check FAILED: {f}")
    elif kind == "row" and ev.get("row"):
        rep.rows.append(BenchRow(**ev["row"]))
    else:
        return False
    rep.ok, rep.reason = False, (f"partial: {len(rep.rows)} of {total_rows} rows timed so far "
                                 "(the run had not finished when this was written)")
    return True


def mark_served(rep: BenchReport) -> None:
    """Each row's `kept`: why the op's patch adapter leaves that shape to SGLang by design, or "" where the patch
    takes it; rows stay unmarked (None) for an op without an adapter or a shape that is not plain dims."""
    from ..registry import has_part

    if not has_part(rep.op, "adapter"):
        return
    try:
        from ..patch.adapters import get_adapter

        adapter = get_adapter(rep.op)
    except Exception:  # an adapter that does not import here (bench needs no SGLang): the rows stay unmarked
        return
    for r in rep.rows:
        try:
            dims = tuple(int(x) for x in r.shape.split("x"))
            r.kept = adapter.kept_by_sglang(dims) or ""
        except Exception:
            r.kept = None


def bench(
    op: str,
    workspace: Any,
    candidate: Optional[Union[str, Path]] = None,
    *,
    shapes: Optional[Union[str, Sequence[Shape]]] = None,
    dtypes: Optional[Sequence[str]] = None,
    l2: str = "cold",
    replays: int = DEFAULT_REPLAYS,
    seed: Optional[int] = None,
    timeout: float = 120.0,
    total_timeout: float = 3600.0,
    recheck: bool = True,
    static: bool = True,
    remeasure_ceiling: bool = False,
    command: str = "",
    progress: Optional[Callable[[str], None]] = None,
    context: bool = True,
    baseline: str = "extracted",
    consumer_width: Optional[int] = None,
    producer_k: Optional[int] = None,
    on_row: Optional[Callable[[BenchReport], None]] = None,
    neighbours: str = "cublas",
    sites: str = "serving",
) -> BenchReport:
    """Time production (and `candidate`) on `shapes`; see the module docstring.

    on_row(report so far) is called after each timed row (ok False, reason saying how far it got), so a caller can
    keep the rows of a run that is killed from outside.

    baseline="installed" also times the installed SGLang callable the patch replaces (installed.py)
    beside the extracted production kernel, and counts the elements where the two differ in bits.

    neighbours="astra": the in-context GEMMs are astra's shipped linear wherever its adapter takes their shape (what a
    patched server runs there), else cuBLAS; "cublas": F.linear always (an unpatched server's GEMMs).

    sites="serving": a decode row of an op with spec.context_sites is timed in context between each GEMM pair serving
    runs it between (sites.py), the row the mean (a site with norm_after puts astra's rmsnorm between the op and the
    consumer GEMM, as a patched server runs the next layer's norm after a MoE combine, norm_before between the
    producer GEMM and the op, as before a Gemma layer's second norm of a pair; both, as around Qwen3's rope);
    "generic": between one pair
    of inner size `producer_k` and width
    `consumer_width` (both default CONTEXT_K), as every row was before 2026-11-28. Passing `producer_k` or
    `consumer_width` means "generic": they name the one pair.

    Never raises for anything the candidate does: a failure leaves report.ok False with the reason.
    Raises AstraError for usage errors."""
    from ..build import first_error_line
    from ..registry import get_op
    from ..static_checks import scan_file, summarize
    from .worker import run_worker

    t0 = time.monotonic()
    say = progress or (lambda s: None)
    if replays < 1:
        raise AstraError(f"--replays must be at least 1, not {replays}")
    for flag, v in (("--consumer-width", consumer_width), ("--producer-k", producer_k)):
        if v is not None and v < 1:
            raise AstraError(f"{flag} must be at least 1, not {v}")
    if l2 not in ("cold", "warm"):
        raise AstraError(f"--l2 must be cold or warm, not {l2!r}")
    if neighbours not in ("cublas", "astra"):
        raise AstraError(f"--neighbours must be cublas or astra, not {neighbours!r}")
    if sites not in ("serving", "generic"):
        raise AstraError(f"--sites must be serving or generic, not {sites!r}")
    if consumer_width is not None or producer_k is not None:
        sites = "generic"   # the flags name the one pair to time between
    spec = get_op(op)
    if baseline not in ("extracted", "installed"):
        raise AstraError(f"--baseline must be extracted or installed, not {baseline!r}")
    ws = open_workspace(op, workspace)
    from .installed import describe_production, verify_installed

    prod_ref = verify_installed(ws) if ws.installed else ""  # no sglang / a broken fact: one error: line
    # production already is the installed callable: no second column of the same
    installed = resolve_installed(spec) if baseline == "installed" and not ws.installed else ""
    shape_list = select_shapes(spec, default_bench_shapes(spec) if shapes is None else shapes)
    have = workspace_dtypes(spec, ws.manifest)
    if dtypes is None:
        dtypes = default_dtypes(have, spec.serving_dtypes)
    dts = [d for d in dtypes if d in have]
    if not dts:
        raise AstraError(f"none of the dtypes {', '.join(dtypes)} is supported by this {op} workspace "
                         f"(it has: {', '.join(have)})")
    seed = int(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    rep = BenchReport(op=op, variant=ws.variant, candidate=str(candidate) if candidate else None, l2=l2, replays=replays,
                      installed=installed, production=describe_production(ws),
                      date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), command=command)
    off = not_served(spec, dts)
    # timed as asked, but said: production may run other kernels for them (a cast) than in serving
    served_note = [f"NOT SERVING'S DTYPE: SGLang hands {op} {', '.join(spec.serving_dtypes)} in serving, not "
                   f"{', '.join(off)}: production's time for them may include kernels serving never runs"] if off else []

    def fail(reason: str) -> BenchReport:
        rep.ok, rep.reason = False, reason
        rep.seconds = time.monotonic() - t0
        return rep

    cand_path = Path(candidate) if candidate else None
    if cand_path is not None:
        if not cand_path.exists():
            raise AstraError(f"candidate {cand_path} does not exist")
        import hashlib

        rep.candidate_sha256 = hashlib.sha256(cand_path.read_bytes()).hexdigest()
        if static:
            s = summarize(scan_file(cand_path, ws.include_dirs))
            if s:
                return fail(s)
    # arguments and the static scan above need no GPU; everything below does (one error: line each, exit 2)
    from ..preconditions import require

    require("gpu", "cuda_torch")
    if not prod_ref:
        say("building the production baseline")
        pb = ws.build()
        if not pb.ok:
            return fail(f"the production baseline does not compile: {first_error_line(pb.log)}")
        prod_ref = f"lib:{pb.library}"
    else:
        say(f"production: {rep.production}")
    cb = None
    if cand_path is not None:
        say(f"building {cand_path.name}")
        cb = ws.build(cand_path)
        if not cb.ok:
            return fail(f"compile error: {first_error_line(cb.log)}")
    helpers = build_helpers(ws.manifest.get("arch") or "sm_90")
    linear_lib = ""
    if context and neighbours == "astra":
        from ..patch.apply import build_kernel

        say("building astra's linear (the in-context neighbour GEMMs)")
        try:
            linear_lib = str(build_kernel("linear", arch=ws.manifest.get("arch") or None))
        except AstraError as e:
            return fail(f"--neighbours astra: {e}")
    norm_lib = ""
    if context and sites == "serving" and sites_need_norm(spec, [s.dims for s in shape_list]):
        from ..patch.apply import build_kernel

        say("building astra's rmsnorm (the norm serving runs beside the op at its sites)")
        try:
            norm_lib = str(build_kernel("rmsnorm", arch=ws.manifest.get("arch") or None))
        except AstraError as e:
            return fail(f"--sites serving: {e}")
    width = int(consumer_width or CONTEXT_K)   # the in-context consumer GEMM's output width, decided once
    pk = int(producer_k or CONTEXT_K)          # and the producer GEMM's inner size
    job = {
        "mode": "bench", "op": op, "prod": prod_ref, "prod_binding": prod_ref.startswith("installed:"), "cand": f"lib:{cb.library}" if cb else None,
        "shapes": [{"dims": list(s.dims), "tags": list(s.tags)} for s in shape_list], "dtypes": dts,
        "l2": l2, "replays": replays, "seed": seed, "prod_attrs": ws.attrs,
        "helper_lib": str(helpers), "ceiling_cache": str(cache_root() / "ceiling.json"),
        "remeasure": remeasure_ceiling, "recheck": recheck, "context": context, "consumer_width": width, "producer_k": pk,
        "installed": installed, "skip": production_skips(spec, ws.variant, shape_list, dts),
        "neighbour_linear": linear_lib, "neighbour_norm": norm_lib,
        "sites": sites == "serving",
    }
    rep.context_consumer_width = width if context else 0
    rep.context_producer_k = pk if context else 0
    rep.context_neighbours = neighbours if context else ""
    rep.context_site_rule = sites if context else ""
    def row_done(ev: Dict[str, Any]) -> None:
        if fold_event(rep, ev, len(shape_list) * len(dts), say) and on_row is not None:
            rep.seconds = time.monotonic() - t0
            on_row(rep)

    wr = run_worker(job, timeout=timeout, total_timeout=total_timeout, progress=say, on_event=row_done)
    rows = [ev["row"] for ev in wr.events if ev.get("event") == "row" and ev.get("row")]
    p = wr.payload or {}
    rep.rows = [BenchRow(**r) for r in (p.get("rows") or rows)]
    mark_served(rep)
    for k in ("device", "sm_count", "l2_bytes", "ceiling_gbps", "read_ceiling_gbps", "ceiling_source", "launch_floor_us",
              "software"):
        if k in p:
            setattr(rep, k, p[k])
    rep.notes = served_note + [f"{d}: not benchmarked (the workspace has no {d})" for d in dtypes if d not in have]
    rep.notes += list(p.get("notes", []))
    rep.recheck = dict(p.get("recheck") or rep.recheck)   # a worker cut short keeps the re-checks it reported
    rep.seconds = time.monotonic() - t0
    if wr.status in ("ok", "failed") and p:
        rep.ok, rep.reason = bool(p.get("ok")), p.get("reason", "")
        return rep
    return fail(wr.reason)
