"""CPU stand-ins for kernels, called by the check worker through `py:<this file>:<function>`.

Each takes (tensors, dims, dtype, scalars) like a built kernel behind the astra ABI and
returns an error code. The good one computes silu_and_mul; the others misbehave the way
bad GPU candidates do (tests/bad_candidates/ has the CUDA versions).
"""
import os
import signal
import time

import torch

_CACHE = {}


def _silu_and_mul(x, d):
    xf = x.float()
    return (torch.nn.functional.silu(xf[:, :d]) * xf[:, d:]).to(x.dtype)


def good(t, dims, dtype, scalars):
    t["out"].copy_(_silu_and_mul(t["input"], dims[1]))
    return 0


def fp16_math(t, dims, dtype, scalars):
    """Computes in the storage dtype (fp16/bf16) instead of fp32: slightly less accurate."""
    x = t["input"]
    d = dims[1]
    t["out"].copy_(torch.nn.functional.silu(x[:, :d]) * x[:, d:])
    return 0


def noisy(t, dims, dtype, scalars):
    """Relative error of 5% on every element: clearly wrong."""
    good(t, dims, dtype, scalars)
    t["out"].mul_(1.05)
    return 0


def half_written(t, dims, dtype, scalars):
    ref = _silu_and_mul(t["input"], dims[1])
    n = ref.shape[0] * ref.shape[1] // 2
    t["out"].view(-1)[:max(1, n)].copy_(ref.reshape(-1)[:max(1, n)])
    return 0


def past_end(t, dims, dtype, scalars):
    good(t, dims, dtype, scalars)
    o = t["out"]
    tail = torch.as_strided(o, (8,), (1,), o.storage_offset() + o.numel())
    tail.fill_(1.0)
    return 0


def before_start(t, dims, dtype, scalars):
    good(t, dims, dtype, scalars)
    o = t["out"]
    torch.as_strided(o, (4,), (1,), o.storage_offset() - 4).fill_(2.0)
    return 0


def writes_input(t, dims, dtype, scalars):
    good(t, dims, dtype, scalars)
    t["input"].view(-1)[0] = 3.0
    return 0


def one_nan(t, dims, dtype, scalars):
    good(t, dims, dtype, scalars)
    t["out"].view(-1)[-1] = float("nan")
    return 0


def cached_by_pointer(t, dims, dtype, scalars):
    key = (t["input"].data_ptr(), t["out"].data_ptr(), tuple(dims), dtype)
    if key in _CACHE:
        t["out"].copy_(_CACHE[key])
        return 0
    good(t, dims, dtype, scalars)
    _CACHE[key] = t["out"].clone()
    return 0


def skip_repeat(t, dims, dtype, scalars):
    """Does nothing when called again on the same pointers (detects a benchmark loop)."""
    key = (t["input"].data_ptr(), tuple(dims), dtype)
    if key in _CACHE:
        return 0
    _CACHE[key] = True
    return good(t, dims, dtype, scalars)


def error_code(t, dims, dtype, scalars):
    return 1  # cudaErrorInvalidValue


def refuses_wide(t, dims, dtype, scalars):
    """A production that takes only narrow rows and returns an error code on the others, as SGLang's JIT
    activation kernel returns cudaErrorMisalignedAddress (716) on a hidden size its vectors do not divide."""
    return 716 if dims[-1] > 100 else good(t, dims, dtype, scalars)


def hang(t, dims, dtype, scalars):
    time.sleep(3600)
    return 0


def segfault(t, dims, dtype, scalars):
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0


def raises(t, dims, dtype, scalars):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


# ---------------------------------------------------------------- fused_add_rmsnorm


def rms_good(t, dims, dtype, scalars):
    x = t["input"].float() + t["residual"].float()
    inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + scalars["eps"])
    t["residual"].copy_(x.to(t["residual"].dtype))
    t["input"].copy_((x * inv * t["weight"].float()).to(t["input"].dtype))
    return 0


def rms_residual_not_updated(t, dims, dtype, scalars):
    x = t["input"].float() + t["residual"].float()
    inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + scalars["eps"])
    t["input"].copy_((x * inv * t["weight"].float()).to(t["input"].dtype))
    return 0


def rms_fp16_accum(t, dims, dtype, scalars):
    """Sum of squares accumulated in fp16, 32 columns at a time: overflows on large activations."""
    x = t["input"].float() + t["residual"].float()
    ss = torch.zeros(x.shape[0], dtype=torch.float16)
    for j in range(0, x.shape[1], 32):
        ss = (ss.float() + x[:, j:j + 32].pow(2).sum(-1)).half()
    inv = torch.rsqrt(ss.float() / x.shape[1] + scalars["eps"]).unsqueeze(-1)
    t["residual"].copy_(x.to(t["residual"].dtype))
    t["input"].copy_((x * inv * t["weight"].float()).to(t["input"].dtype))
    return 0


# ---------------------------------------------------------------- merge_state


def _merge(va, sa, vb, sb, map_inf=True):
    if map_inf:
        sa = torch.where(torch.isinf(sa), torch.full_like(sa, float("-inf")), sa)
        sb = torch.where(torch.isinf(sb), torch.full_like(sb, float("-inf")), sb)
    m = torch.maximum(sa, sb)
    pa, pb = torch.exp(sa - m), torch.exp(sb - m)
    se = pa + pb
    v = va.float() * (pa / se).unsqueeze(-1) + vb.float() * (pb / se).unsqueeze(-1)
    return v, torch.log(se) + m


def merge_good(t, dims, dtype, scalars):
    v, s = _merge(t["v_a"], t["s_a"], t["v_b"], t["s_b"])
    t["v_out"].copy_(v.to(t["v_out"].dtype))
    t["s_out"].copy_(s)
    return 0


def merge_no_inf_handling(t, dims, dtype, scalars):
    v, s = _merge(t["v_a"], t["s_a"], t["v_b"], t["s_b"], map_inf=False)
    t["v_out"].copy_(v.to(t["v_out"].dtype))
    t["s_out"].copy_(s)
    return 0


def merge_lse_not_written(t, dims, dtype, scalars):
    v, _ = _merge(t["v_a"], t["s_a"], t["v_b"], t["s_b"])
    t["v_out"].copy_(v.to(t["v_out"].dtype))
    return 0


def merge_flashinfer_base2(t, dims, dtype, scalars):
    """A production stand-in with FlashInfer's conventions: base-2 lse in and out, and its
    special values (an +inf side is not mapped; two empty sides give v = 0, s = -inf)."""
    sa, sb = t["s_a"].double(), t["s_b"].double()  # base 2
    m = torch.maximum(sa, sb)
    ninf = torch.full_like(sa, float("-inf"))
    da, db = sa - m, sb - m
    ea = torch.exp2(torch.where(torch.isnan(da), ninf, da))
    eb = torch.exp2(torch.where(torch.isnan(db), ninf, db))
    se = ea + eb
    pos = se > 0
    one = torch.ones_like(se)
    a = torch.where(pos, ea / torch.where(pos, se, one), torch.zeros_like(se))
    b = torch.where(pos, eb / torch.where(pos, se, one), torch.zeros_like(se))
    v = t["v_a"].double() * a.unsqueeze(-1) + t["v_b"].double() * b.unsqueeze(-1)
    t["v_out"].copy_(v.to(t["v_out"].dtype))
    t["s_out"].copy_((torch.log2(se) + m).float())
    return 0
