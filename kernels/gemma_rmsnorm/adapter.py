"""The patch adapter: how SGLang's gemma_rmsnorm callables (sgl_kernel.gemma_rmsnorm,
flashinfer.norm.gemma_rmsnorm) map onto this op's kernel ABI. patch/adapters.py holds the machinery and says
what each field means. The weight is the stored Gemma weight (w - 1); the kernel adds the 1."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem


def _rms_normalize(c):
    x, w, out = c["input"], c["weight"], c["out"]
    if x.dim() < 1:
        return "input is 0-d"
    h = x.shape[-1]
    if tuple(out.shape) != tuple(x.shape):
        return f"out shape {tuple(out.shape)} != input shape {tuple(x.shape)}"
    if tuple(w.shape) != (h,):
        return f"weight shape {tuple(w.shape)} != ({h},)"
    bad = contiguity_problem(c, ("input", "weight", "out"))
    if bad:
        return bad
    if x.dim() == 2:
        return {"out": out, "input": x, "weight": w}, (x.shape[0], h)
    # flashinfer's 3-D form ([tokens, heads, head_dim], per-head norm) is the same math per row
    t = x.numel() // h if h else 0
    return {"out": out.view(t, h), "input": x.view(t, h), "weight": w}, (t, h)


ADAPTER = OpAdapter(
    op="gemma_rmsnorm",
    data="input",
    same_dtype=("input", "weight", "out"),
    rowwise=("input", "out"),
    ignorable=frozenset({"enable_pdl"}),
    alloc={"out": lambda c: c["input"].new_empty(tuple(c["input"].shape))},
    normalize=_rms_normalize,
    returns=lambda c: c["out"],
)
