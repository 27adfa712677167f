"""The patch adapter: how SGLang's fused rope + KV store (sglang.kernels.ops.attention.rope
apply_rope_inplace_with_kvcache, which apply_rope_with_cos_sin_cache_inplace calls when RotaryEmbedding.forward_cuda
gets fused_set_kv_buffer_arg) maps onto this op's kernel ABI. patch/adapters.py holds the machinery and says what
each field means.

Not routed: int32 positions/slots, q/k/v of different dtypes, non-contiguous cache views, head sizes the launcher
does not carry."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter

from .spec import HEAD_DIMS


def _rope_store_normalize(c):
    import torch

    q, k, v, kc, vc = c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"]
    cache, pos, loc = c["cos_sin_cache"], c["positions"], c["out_loc"]
    if q.dim() != 3 or k.dim() != 3:
        return f"q {tuple(q.shape)} / k {tuple(k.shape)} are not [tokens, heads, head_dim]"
    t, hq, d = q.shape
    hk = k.shape[1]
    if k.shape[0] != t or k.shape[2] != d or d not in HEAD_DIMS:
        return f"k {tuple(k.shape)} / q {tuple(q.shape)}: head_dim not in {HEAD_DIMS} or shapes disagree"
    if cache.dim() != 2 or cache.shape[1] != d or not cache.is_contiguous():
        return f"cos_sin_cache {tuple(cache.shape)} is not a contiguous [max_position, {d}] (rope_dim = head_dim)"
    for n, x in (("positions", pos), ("out_loc", loc)):
        if x.dtype != torch.int64 or tuple(x.shape) != (t,) or not x.is_contiguous():
            return f"{n} {x.dtype} {tuple(x.shape)} is not a contiguous int64 [{t}]"
    for n, x in (("q", q), ("k", k)):
        if x.stride(2) != 1 or (x.shape[1] > 1 and x.stride(1) != d):
            return f"{n} strides {tuple(x.stride())} are not (row, head_dim, 1)"
    if v.dim() == 3:
        if tuple(v.shape) != (t, hk, d) or v.stride(2) != 1 or (hk > 1 and v.stride(1) != d):
            return f"v {tuple(v.shape)} strides {tuple(v.stride())} do not match k"
    elif v.dim() == 2:
        if tuple(v.shape) != (t, hk * d) or v.stride(1) != 1:
            return f"v {tuple(v.shape)} is not [{t}, {hk * d}] with unit column stride"
    else:
        return f"v {tuple(v.shape)} is neither [tokens, kv heads * head_dim] nor [tokens, kv heads, head_dim]"
    for n, x in (("k_cache", kc), ("v_cache", vc)):
        if not x.is_contiguous() or x.dim() < 2 or x.numel() % (hk * d) or x.shape[-1] not in (d, hk * d):
            return f"{n} {tuple(x.shape)} is not a contiguous [slots, {hk} * {d}] pool view"
    qs = q.stride(0) if t > 1 else hq * d
    ks = k.stride(0) if t > 1 else hk * d
    vs = v.stride(0) if t > 1 else hk * d
    c["is_neox"] = int(bool(c["is_neox"]))  # SGLang passes a bool; the ABI and the custom op take an int
    views = {"q": q, "k": k, "v": v, "k_cache": kc, "v_cache": vc, "cos_sin_cache": cache, "positions": pos,
             "out_loc": loc}
    return views, (t, hq, hk, d, qs, ks, vs)


# `--ops all` leaves this op out until its kernel wins in context (name it to patch it anyway).
DEFAULT_OFF = ("little gain in context: decode corpus geomean 1.061x on the H200, 4 of 16 rows slower (min 0.83x; "
               "results/2026-12-01-h200/session37/). Qwen3 and Llama run qknorm_rope_store / dense_rope_store "
               "instead")

ADAPTER = OpAdapter(
    op="rope_store",
    data="q",
    same_dtype=("q", "k", "v", "k_cache", "v_cache"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "k", "v", "positions", "out_loc"),
    # rope_dim defaults to cos_sin_cache.size(-1) = head_dim, which SGLang's fused kernel requires (normalize checks)
    ignorable=frozenset({"rope_dim"}),
    normalize=_rope_store_normalize,
    returns=lambda c: None,
    slot_indexed={"k_cache": "out_loc", "v_cache": "out_loc"},
)
