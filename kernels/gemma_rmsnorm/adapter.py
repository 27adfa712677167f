"""The patch adapter: how SGLang's gemma_rmsnorm callables (sgl_kernel.gemma_rmsnorm,
flashinfer.norm.gemma_rmsnorm) map onto this op's kernel ABI. patch/adapters.py holds the machinery and says
what each field means. The weight is the stored Gemma weight (w - 1); the kernel adds the 1."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguous_like, weighted_rows


ADAPTER = OpAdapter(
    op="gemma_rmsnorm",
    data="input",
    same_dtype=("input", "weight", "out"),
    rowwise=("input", "out"),
    ignorable=frozenset({"enable_pdl"}),
    alloc={"out": contiguous_like("input")},
    normalize=weighted_rows(("input", "out")),
    returns=lambda c: c["out"],
)
