"""The patch adapter: how SGLang's merge_state callables (merge_state_v2, the attention helper) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem

# Token counts SGLang keeps its own kernel for: in context (between GEMMs, H200, 2026-11-23,
# results/2026-11-23-h200/kernels/all_ops/) ours ran 0.84x at 64 and 256 tokens, 1.84-1.88x at 1-16;
# prefill sizes (chained basis) win. The bound between 16 and 64 is not measured more finely.
SLOWER_IN_CONTEXT = range(33, 257)


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
    if t in SLOWER_IN_CONTEXT:
        return f"{t} tokens: slower than SGLang's kernel in context (0.84x at 64-256 tokens, H200)"
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
