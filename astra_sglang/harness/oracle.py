"""One case: fresh inputs into existing guarded buffers, candidate and production run, every output and
in-place side effect compared with the fp64 reference and with production (numerics.py)."""
from __future__ import annotations

import itertools

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..spec import OpSpec
from .guards import GuardedSet
from .impl import Impl, cuda_error_name
from .inputs import from_prod_abi, make_case_inputs, reference_kwargs, takes_model_dtype, to_prod_abi
from .numerics import (BASELINE_SLACK, SHORT_DTYPE, bitwise_changed, canonical_outputs, count_poison, dtype_name,
                       judged, nonfinite_mismatch, rel_err, tolerance)


class FatalCaseError(Exception):
    """A CUDA error that poisons the context (illegal address, ...): the run cannot go on."""


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()



def run_case(
    spec: OpSpec,
    cand: Impl,
    prod: Impl,
    bufs_c: GuardedSet,
    bufs_p: GuardedSet,
    dims: Tuple[int, ...],
    dtype: str,
    dist: str,
    seed: int,
    device: str,
    *,
    run_index: int = 0,
    label: str = "",
    baseline_only: bool = False,
    prod_attrs: Optional[Dict[str, Any]] = None,
    stage: Callable[[str], None] = lambda s: None,
    reference_only: bool = False,
) -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    """Run candidate and production on one fresh input draw. Returns (details, failures, notes).

    reference_only: production does not take this case (its variant's `supports`), so only the candidate runs and is
    judged against the fp64 reference at its dtype's floor. The same happens when production refuses the case at run
    time (an error code): the candidate may still serve the shape, so it is never left unjudged.

    prod_attrs: the workspace's variant attrs: production gets its inputs converted to the
    variant's convention (spec.to_variant_abi) and is judged against the reference under its
    own semantics (reference_kwargs); the candidate implements the op's own ABI and contract.
    Raises FatalCaseError when a launch leaves the CUDA context unusable."""
    label = label or f"{'x'.join(map(str, dims))} {dtype} {dist}"
    rerun = run_index == 1  # the same distribution as run 0, fresh values, same buffers
    scalars = spec.scalars(tuple(dims))
    inputs = make_case_inputs(spec, dims, dtype, dist, seed, device)
    failures: List[str] = []
    notes: List[str] = []
    outs: Dict[str, Dict[str, Any]] = {}
    who_list = [("production", prod, bufs_p)] if baseline_only else [("candidate", cand, bufs_c), ("production", prod, bufs_p)]
    if reference_only and not baseline_only:
        who_list = who_list[:1]
    for who, impl, bufs in who_list:
        abi_in = to_prod_abi(spec, inputs, prod_attrs) if who == "production" else inputs
        bufs.load(abi_in)
        sync(device)
        stage(f"{who} on {label}" + (f" (run {run_index + 1})" if rerun else ""))
        try:
            rc = impl(bufs.views, dims, dtype, scalars)
            sync(device)
        except Exception as e:  # torch raises RuntimeError / AcceleratorError for CUDA errors
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FatalCaseError(f"{label}: {who} crashed the CUDA context: {msg}") from e
        if rc != 0:
            name = cuda_error_name(rc)
            if who == "production" and baseline_only:
                notes.append(f"{label}: production returned {name}; case skipped")
                return [], [], notes
            if who == "production":  # the candidate already ran: judge it against the reference alone
                notes.append(f"{label}: production returned {name}; the candidate is judged against the fp64 "
                             "reference alone")
                break
            failures.append(f"{label}: candidate returned {name}")
            return [], failures, notes
        dmg = bufs.guard_damage()
        for name, (before, after) in dmg.items():
            where = " and ".join(w for w, n in (("before the start", before), ("past the end", after)) if n)
            failures.append(f"{label}: {who} wrote outside {name}: {before + after} guard bytes changed {where}")
        for name, role in bufs.roles.items():
            if role == "in":
                n = bitwise_changed(bufs.views[name], abi_in[name])
                if n:
                    failures.append(f"{label}: {who} modified its input {name} ({n} elements changed)")
            elif role == "out":
                v = bufs.views[name]
                n = count_poison(v)
                if n:
                    failures.append(
                        f"{label}: {who} never wrote {n} of {v.numel()} elements of {name} (poison left)"
                        + (" on a re-run with fresh inputs in the same buffers (result cached by pointer?)"
                           if rerun else ""))
        if who == "production":
            outs[who] = from_prod_abi(spec, bufs.views, prod_attrs)
        else:
            outs[who] = {n: bufs.views[n].clone() for n, r in bufs.roles.items() if r in ("out", "inout")}
        outs[who] = canonical_outputs(spec, outs[who], dims)
    ref, ref_p = references(spec, inputs, dims, scalars, prod_attrs)
    del inputs, abi_in
    again = " on a re-run with fresh inputs in the same buffers (stale result cached by pointer?)" if rerun else ""
    details, f2, n2 = judge(spec, label, dims, dtype, dist, run_index, outs, ref, ref_p, baseline_only, again)
    return details, failures + f2, notes + n2


def reference_walk(spec: OpSpec, inputs: Dict[str, Any], dims, scalars: Dict[str, Any], **kw: Any) -> Iterator[Dict[str, Any]]:
    """The op applied again and again to one input set, as a graph that calls it repeatedly does: the fp64
    result after each call. What feeds the next call is what a correct kernel stored: the in-place outputs
    rounded to the buffer's dtype (an fp64 chain drifts from any real kernel as the calls add up)."""
    import torch

    inout = [a.name for a in spec.abi if a.ctype == "ptr" and a.role == "inout"]
    ins = [a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("in", "inout")]
    cur = {n: inputs[n].to(torch.float64) for n in ins}
    if ins and takes_model_dtype(spec):  # the fp64 copies lose it: say it (spec.py's reference contract)
        kw = {**kw, "model_dtype": inputs[ins[0]].dtype}
    while True:
        r = spec.reference(cur, tuple(dims), scalars, **kw)
        yield r
        cur.update({n: r[n].to(inputs[n].dtype).to(torch.float64) for n in inout if n in r})


def references(spec: OpSpec, inputs: Dict[str, Any], dims, scalars: Dict[str, Any],
               prod_attrs: Optional[Dict[str, Any]], repeats: int = 1) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """fp64 references for the candidate (the op's semantics) and production (its variant's semantics).
    `repeats` > 1: the op applied that many times in a row (in-place outputs feed the next call), what a
    graph that calls it repeatedly on one input set leaves behind."""
    inout = any(a.ctype == "ptr" and a.role == "inout" for a in spec.abi)
    n_rep = max(1, repeats) if inout else 1
    kw = reference_kwargs(spec, prod_attrs)
    outs = [next(itertools.islice(reference_walk(spec, inputs, dims, scalars, **k), n_rep - 1, None))
            for k in ([{}, kw] if kw else [{}])]
    return outs[0], outs[-1]


def identical_fraction(cand: Any, prod: Any) -> Optional[float]:
    """The share of the candidate's elements equal to production's, bit for bit (NaN matching NaN), or None where
    the two are not comparable element by element. Within tolerance is not identical: a last-bit difference can
    still flip a greedy token downstream (Gemma-2's norms, 2026-11-26)."""
    import torch

    if not (isinstance(cand, torch.Tensor) and isinstance(prod, torch.Tensor)) or cand.shape != prod.shape \
            or cand.dtype != prod.dtype or cand.numel() == 0:
        return None
    same = cand == prod
    if cand.is_floating_point():
        same |= cand.isnan() & prod.isnan()
    return float(same.float().mean())


def judge(spec: OpSpec, label: str, dims, dtype: str, dist: str, run_index: int, outs: Dict[str, Dict[str, Any]],
          ref: Dict[str, Any], ref_p: Dict[str, Any], baseline_only: bool = False,
          again: str = "") -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    """The tolerance rule on every output: outs["candidate"] / outs["production"] against the fp64
    references (numerics.py). Returns (details, failures, notes); `again` is appended to failures.
    Without outs["production"] (production does not take the case) the candidate is held to its dtype's floor."""
    failures: List[str] = []
    notes: List[str] = []
    details: List[Dict[str, Any]] = []
    prod = outs.get("production")   # None: production does not take the case; the dtype's floor judges alone
    what = "normwise error" if spec.tolerance.metric == "norm" else "error"
    for name, r in ref.items():
        rp = rel_err(prod[name], ref_p[name]) if prod is not None else None
        short = SHORT_DTYPE.get(dtype_name((prod if prod is not None else outs["candidate"])[name]), dtype)
        prod_err = judged(spec, rp)
        if baseline_only:
            rc_, cand_err = rp, None
            limit = BASELINE_SLACK * tolerance(spec, short, None)
            tol = limit
            mism = nonfinite_mismatch(prod[name], ref_p[name])
            ok = prod_err <= limit
            if not ok:
                failures.append(f"{label}: production's {name} disagrees with the fp64 reference: {what} "
                                f"{prod_err:.3g} > {limit:.3g} ({BASELINE_SLACK:g}× the {short} floor)"
                                + (f", {rp['nan']} NaN where the reference is finite" if rp["nan"] else "") + again)
            if mism:
                notes.append(f"{label}: production's {name} differs from the reference at {mism} non-finite positions")
        else:
            rc_ = rel_err(outs["candidate"][name], r)
            tol = tolerance(spec, short, prod_err, alone=prod is None)
            mism = nonfinite_mismatch(outs["candidate"][name], r, prod[name] if prod is not None else None)
            cand_err = judged(spec, rc_)
            ok = cand_err <= tol and not mism
            if rc_["nan"]:
                failures.append(f"{label}: candidate's {name} has {rc_['nan']} NaN where the reference is finite{again}")
            elif cand_err > tol:
                why = (f"production {prod_err:.3g}; max({spec.tolerance.k:g}×production, {short} floor)" if rp else
                       f"the {short} bound where production does not take the case: the fp64 reference alone judges it")
                failures.append(f"{label}: candidate's {name} {what} {cand_err:.3g} > tolerance {tol:.3g} "
                                f"({why}){again}")
            if mism:
                failures.append(f"{label}: candidate's {name} differs from reference"
                                + (" and production" if rp else "") + f" at {mism} positions where the reference is "
                                f"±inf/NaN{again}")
        details.append({
            "shape": "x".join(map(str, dims)), "dtype": dtype, "dist": dist, "run": run_index, "tensor": name,
            # cand_err / prod_err: the errors the tolerance judged (spec.tolerance.metric); the elementwise maximum and
            # the normwise error both stay in the row
            "cand_err": cand_err, "prod_err": prod_err, "tol": tol,
            "metric": spec.tolerance.metric, "cand_max": None if baseline_only else rc_["err"],
            "prod_max": rp["err"] if rp else None,
            "ok": ok, "cand_norm": None if baseline_only else rc_["norm"], "prod_norm": rp["norm"] if rp else None,
            "nan": rc_["nan"], "ref_nonfinite": int((rp or rc_)["ref_nonfinite"]),
            "identical": None if baseline_only or prod is None else identical_fraction(outs["candidate"][name],
                                                                                        prod[name]),
            **({} if rp else {"ref_only": True}),
        })
    _mark_failed(details, failures)
    return details, failures, notes


def _mark_failed(details: List[Dict[str, Any]], failures: List[str]) -> None:
    """A detail row whose tensor a failure names is not ok (the NaN and non-finite failures included)."""
    if failures:
        for d in details:
            if any(f"{d['tensor']} " in f or f"{d['tensor']}:" in f for f in failures):
                d["ok"] = False
