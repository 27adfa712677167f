"""The patch adapter: how SGLang's merge_state callables (merge_state_v2, the attention helper) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem


def _merge_normalize(c):
    va = c["v_a"]
    if va.dim() != 3:
        return f"v_a is {va.dim()}-d, not [tokens, heads, head_dim]"
    t, h, d = va.shape
    for n in ("v_b", "v_out"):
        if tuple(c[n].shape) != (t, h, d):
            return f"{n} shape {tuple(c[n].shape)} != {(t, h, d)}"
    for n in ("s_a", "s_b", "s_out"):
        if tuple(c[n].shape) != (t, h):
            return f"{n} shape {tuple(c[n].shape)} != {(t, h)}"
    bad = contiguity_problem(c, ("v_a", "s_a", "v_b", "s_b", "v_out", "s_out"))
    if bad:
        return bad
    return dict(c), (t, h, d)


ADAPTER = OpAdapter(
    op="merge_state",
    data="v_a",
    same_dtype=("v_a", "v_b", "v_out"),
    fp32=("s_a", "s_b", "s_out"),
    rowwise=("v_a", "s_a", "v_b", "s_b", "v_out", "s_out"),
    aliases={
        # sgl_kernel.merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None)
        "v_merged": "v_out",
        "s_merged": "s_out",
        # sglang.srt.layers.attention.merge_state.merge_state(prefix_output, prefix_lse, ...)
        "prefix_output": "v_a",
        "prefix_lse": "s_a",
        "suffix_output": "v_b",
        "suffix_lse": "s_b",
        "output": "v_out",
        "output_lse": "s_out",
    },
    alloc={
        "v_out": lambda c: c["v_a"].new_empty(tuple(c["v_a"].shape)),
        "s_out": lambda c: c["s_a"].new_empty(tuple(c["s_a"].shape)),
    },
    normalize=_merge_normalize,
    returns=lambda c: (c["v_out"], c["s_out"]),
)
