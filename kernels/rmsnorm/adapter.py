"""The patch adapter: how SGLang's rmsnorm callables (sgl_kernel.rmsnorm, flashinfer.norm.rmsnorm) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

Not routed: sglang.kernels.ops.layernorm.norm.rmsnorm (the JIT rmsnorm.cuh, used by vision towers, with its
own hidden-size list) and the HF-parity rmsnorm_hf (cast before the weight multiply: a different rounding)."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguous_like, weighted_rows


ADAPTER = OpAdapter(
    op="rmsnorm",
    data="input",
    same_dtype=("input", "weight", "out"),
    rowwise=("input", "out"),
    ignorable=frozenset({"enable_pdl"}),
    alloc={"out": contiguous_like("input")},
    normalize=weighted_rows(("input", "out")),
    returns=lambda c: c["out"],
)
