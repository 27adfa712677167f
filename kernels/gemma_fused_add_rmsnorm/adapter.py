"""The patch adapter: how SGLang's gemma_fused_add_rmsnorm callables (sgl_kernel, flashinfer.norm) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means. The weight is
the stored Gemma weight (w - 1); the kernel adds the 1."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem


def _rms_normalize(c):
    x, r, w = c["input"], c["residual"], c["weight"]
    if x.dim() < 1:
        return "input is 0-d"
    h = x.shape[-1]
    if tuple(r.shape) != tuple(x.shape):
        return f"residual shape {tuple(r.shape)} != input shape {tuple(x.shape)}"
    if tuple(w.shape) != (h,):
        return f"weight shape {tuple(w.shape)} != ({h},)"
    bad = contiguity_problem(c, ("input", "residual", "weight"))
    if bad:
        return bad
    if x.dim() == 2:
        return {"input": x, "residual": r, "weight": w}, (x.shape[0], h)
    t = x.numel() // h if h else 0
    return {"input": x.view(t, h), "residual": r.view(t, h), "weight": w}, (t, h)


ADAPTER = OpAdapter(
    op="gemma_fused_add_rmsnorm",
    data="input",
    same_dtype=("input", "residual", "weight"),
    rowwise=("input", "residual"),
    ignorable=frozenset({"enable_pdl"}),
    normalize=_rms_normalize,
    returns=lambda c: None,
)
