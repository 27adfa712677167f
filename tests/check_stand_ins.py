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


def hang(t, dims, dtype, scalars):
    time.sleep(3600)
    return 0


def segfault(t, dims, dtype, scalars):
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0


def raises(t, dims, dtype, scalars):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
