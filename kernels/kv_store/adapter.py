"""The patch adapter: how SGLang's KV-cache store (sglang.kernels.ops.kvcache.kvcache.store_cache, the custom op
MHATokenToKVPool.set_kv_buffer reaches through _set_kv_buffer_impl) maps onto this op's kernel ABI.
patch/adapters.py holds the machinery and says what each field means.

Not routed: int32 slot indices, non-contiguous caches or index vectors, dtypes other than fp16/bf16 (an fp8
cache is stored as uint8). row_bytes / v_row_bytes are the rows' widths in every SGLang call (SGLang's kernel
checks it) and num_split is a tuning knob: neither changes the result."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter


def _kv_normalize(c):
    import torch

    k, v, kc, vc, idx = c["k"], c["v"], c["k_cache"], c["v_cache"], c["indices"]
    if any(x.dim() != 2 for x in (k, v, kc, vc)):
        return "k, v, k_cache, v_cache are not 2-D [rows, row width]"
    t, kr = k.shape
    vr = v.shape[1]
    if v.shape[0] != t or kc.shape[1] != kr or vc.shape[1] != vr:
        return f"shapes k {tuple(k.shape)} v {tuple(v.shape)} k_cache {tuple(kc.shape)} v_cache {tuple(vc.shape)} disagree"
    if idx.dtype != torch.int64 or tuple(idx.shape) != (t,) or not idx.is_contiguous():
        return f"indices {idx.dtype} {tuple(idx.shape)} is not a contiguous int64 [{t}]"
    if not (kc.is_contiguous() and vc.is_contiguous()):
        return "a cache view is not contiguous"
    if k.stride(1) != 1 or v.stride(1) != 1:
        return "k or v is not unit-stride along the row"
    ks = k.stride(0) if t > 1 else kr
    vs = v.stride(0) if t > 1 else vr
    if ks < kr or vs < vr:
        return "a token stride is shorter than its row"
    if int(c.get("size_limit") or 0) <= 0:
        c["size_limit"] = kc.shape[0]  # store_cache's default: the cache's row count
    return {"k": k, "v": v, "k_cache": kc, "v_cache": vc, "indices": idx}, (t, kr, vr, ks, vs)


# `--ops all` leaves this op out until its kernel wins in context (name it to patch it anyway).
DEFAULT_OFF = ("slower in context: decode corpus geomean 0.945x on the H200, 6 of 24 bf16 rows slower (min 0.82x; "
               "results/2026-12-01-h200/session37/). The bf16 KV store of Qwen3, Llama and Gemma-2 "
               "runs fused in qknorm_rope_store / dense_rope_store")

ADAPTER = OpAdapter(
    op="kv_store",
    data="k",
    same_dtype=("k", "v", "k_cache", "v_cache"),
    rowwise=("k", "v", "indices"),
    ignorable=frozenset({"row_bytes", "v_row_bytes", "num_split"}),
    normalize=_kv_normalize,
    returns=lambda c: None,
)
