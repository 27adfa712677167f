"""The patch adapter: how SGLang's gemma_fused_add_rmsnorm callables (sgl_kernel, flashinfer.norm) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means. The weight is
the stored Gemma weight (w - 1); the kernel adds the 1."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, weighted_rows


ADAPTER = OpAdapter(
    op="gemma_fused_add_rmsnorm",
    data="input",
    same_dtype=("input", "residual", "weight"),
    rowwise=("input", "residual"),
    ignorable=frozenset({"enable_pdl"}),
    normalize=weighted_rows(("input", "residual")),
    returns=lambda c: None,
)
