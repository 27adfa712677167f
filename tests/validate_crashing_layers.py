"""SGLang-like layers for test_patch's validate tests: the 'original' silu_and_mul dies (as on a
sticky CUDA fault) on hidden 1001 and above, refuses hidden 72 as sgl_kernel does unaligned halves, and
computes the op otherwise. The layer looks the op up at call time, so patch rebinds it."""
import os

import torch


def silu_and_mul(input, out=None):
    d = input.shape[-1] // 2
    if d >= 1001:
        os.abort()  # the process dies, as with cudaErrorMisalignedAddress
    if d == 72:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    out = input.new_empty(input.shape[:-1] + (d,)) if out is None else out
    out.copy_((torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()).to(out.dtype))
    return out


def _silu(inp, dims, scalars):
    return {"out": silu_and_mul(inp["input"])}


LAYERS = {"silu_and_mul": _silu}
