"""Layers for test_patch's crash-isolation test: SGLang's 'original' silu_and_mul dies (like a
sticky CUDA fault) on hidden 1001, raises a refusal on hidden 72, and works otherwise."""
import os

import torch  # noqa: F401  (the child's layers run on torch tensors)


def _silu(inp, dims, scalars):
    x = inp["input"]
    d = x.shape[-1] // 2
    if d == 1001:
        os.abort()  # the process dies, as with cudaErrorMisalignedAddress
    if d == 72:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    import fake_crash_sk

    return {"out": fake_crash_sk.silu_and_mul(x)}

LAYERS = {"silu_and_mul": _silu}
