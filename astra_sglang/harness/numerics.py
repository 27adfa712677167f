"""The error metric and bit-level helpers of the oracle (torch, device-agnostic).

A candidate fails an output when

    err(candidate vs fp64) > max(k * err(production vs fp64), floor[dtype])     (spec.tolerance)

with err the largest elementwise error relative to the reference's magnitude,

    err = max_i |c_i - r_i| / (|r_i| + 0.01 * rms(r)),

or, for a spec whose tolerance.metric is "norm", the normwise error ||c - r|| / ||r|| (`judged`),

both sides clamped to the output dtype's finite range (an fp16 output that overflows to inf
matches a reference beyond 65504). A NaN where the reference is finite is an error of inf.
Positions where the fp64 reference itself is not finite (±inf lse) must match the reference
or, failing that, what the production kernel returns there.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

from ..spec import OpSpec

BASELINE_SLACK = 8.0  # production's own error may be at most this many dtype floors
REL_SCALE = 1e-2  # err denominator: |r| + REL_SCALE * rms(r)
# Poison (a NaN with a recognizable payload) written to outputs before every run.
POISON_BITS = {"float16": 0x7E5A, "bfloat16": 0x7FA5, "float32": 0x7FC5A5A5, "float64": 0x7FF8A5A5A5A5A5A5}


def canonical_outputs(spec: OpSpec, outs: Dict[str, Any], dims) -> Dict[str, Any]:
    """Outputs as the comparison sees them (spec.canonical, e.g. moe_align's order within an expert)."""
    return spec.canonical(dict(outs), tuple(dims)) if spec.canonical is not None else outs


def dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def tolerance(spec: OpSpec, tensor_dtype: str, prod_err: Optional[float], alone: bool = False) -> float:
    """max(k * production error, floor of the output's dtype). tensor_dtype: fp16|bf16|fp32|...
    alone: production does not take the case (the fp64 reference alone judges): the spec's `alone` bound, else the
    floor."""
    floor = float(spec.tolerance.floor.get(tensor_dtype, spec.tolerance.floor.get("fp32", 1e-5)))
    if alone:
        return float(spec.tolerance.alone.get(tensor_dtype, floor))
    if prod_err is None or not math.isfinite(prod_err):
        return floor
    return max(spec.tolerance.k * prod_err, floor)


def judged(spec: OpSpec, r: Optional[Dict[str, Any]]) -> Optional[float]:
    """The error of a rel_err result that spec.tolerance judges (its metric; inf for a NaN where the reference is
    finite either way); None for None."""
    if r is None:
        return None
    return float("inf") if r["nan"] else float(r[spec.tolerance.metric])


def rel_err(out, ref, chunk: int = 1 << 24) -> Dict[str, Any]:
    """Errors of `out` against the fp64 `ref` (same shape). See the module docstring.

    Returns the max relative error over positions where ref is finite ('err'; inf when out has
    NaN there), the normwise error, and the counts of NaN and of non-finite reference positions.
    Works in chunks so the largest shapes need little extra memory."""
    import torch

    o = out.reshape(-1)
    r = ref.reshape(-1)
    odt = out.dtype
    fmax = torch.finfo(odt).max if odt.is_floating_point else float("inf")
    n = o.numel()
    sq_ref = 0.0
    n_ref_nonfinite = 0
    for i in range(0, n, chunk):
        rr = r[i:i + chunk].to(torch.float64)
        fin = torch.isfinite(rr)
        n_ref_nonfinite += int((~fin).sum())
        rr = torch.where(fin, rr.clamp(-fmax, fmax), torch.zeros_like(rr))
        sq_ref += float((rr * rr).sum())
    rms = math.sqrt(sq_ref / n) if n else 0.0
    scale = REL_SCALE * rms + 1e-300
    err = 0.0
    nan = 0
    sq_diff = 0.0
    for i in range(0, n, chunk):
        rr = r[i:i + chunk].to(torch.float64)
        fin = torch.isfinite(rr)
        rr = torch.where(fin, rr.clamp(-fmax, fmax), torch.zeros_like(rr))
        oc = o[i:i + chunk].to(torch.float64)
        nan_here = torch.isnan(oc) & fin
        nan += int(nan_here.sum())
        oc = torch.nan_to_num(oc, nan=0.0, posinf=fmax, neginf=-fmax).clamp(-fmax, fmax)
        d = torch.where(fin & ~nan_here, (oc - rr).abs(), torch.zeros_like(rr))
        if d.numel():
            err = max(err, float((d / (rr.abs() + scale)).max()))
        sq_diff += float((d * d).sum())
    if nan:
        err = float("inf")
    norm = math.sqrt(sq_diff) / math.sqrt(sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else float("inf"))
    return {"err": err, "norm": norm, "nan": nan, "ref_nonfinite": n_ref_nonfinite}


def nonfinite_mismatch(out, ref, prod=None) -> int:
    """Positions where the reference is ±inf/NaN and `out` matches neither it nor production."""
    import torch

    r = ref.reshape(-1).to(torch.float64)
    bad = ~torch.isfinite(r)
    if not bool(bad.any()):
        return 0
    o = out.reshape(-1).to(torch.float64)[bad]
    rb = r[bad]
    same = (o == rb) | (torch.isnan(o) & torch.isnan(rb))
    if prod is not None:
        p = prod.reshape(-1).to(torch.float64)[bad]
        same = same | (o == p) | (torch.isnan(o) & torch.isnan(p))
    return int((~same).sum())


def count_poison(t) -> int:
    """Elements of `t` that still hold the poison bit pattern."""
    import torch

    name = dtype_name(t)
    if name not in POISON_BITS:
        return 0
    ity = {"float16": torch.int16, "bfloat16": torch.int16, "float32": torch.int32, "float64": torch.int64}[name]
    bits = POISON_BITS[name]
    if bits >= 1 << (8 * t.element_size() - 1):
        bits -= 1 << (8 * t.element_size())
    return int((t.reshape(-1).view(ity) == bits).sum())


def poison_(t) -> None:
    import torch

    name = dtype_name(t)
    if name in POISON_BITS:
        ity = {"float16": torch.int16, "bfloat16": torch.int16, "float32": torch.int32, "float64": torch.int64}[name]
        bits = POISON_BITS[name]
        if bits >= 1 << (8 * t.element_size() - 1):
            bits -= 1 << (8 * t.element_size())
        t.reshape(-1).view(ity).fill_(bits)
    else:
        t.fill_(-0x5A5A)


def bitwise_changed(a, b) -> int:
    """Elements where a and b differ bit for bit (NaN-safe)."""
    import torch

    if a.dtype.is_floating_point:
        ity = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return int((a.reshape(-1).view(ity) != b.reshape(-1).view(ity)).sum())
    return int((a.reshape(-1) != b.reshape(-1)).sum())
