"""The patch adapter: how SGLang's rotary-embedding callables (sglang.kernels.ops.attention.rope
apply_rope_with_cos_sin_cache_inplace and the apply_rope_inplace custom op it calls) map onto this op's
kernel ABI. patch/adapters.py holds the machinery and says what each field means.

Not routed: calls with fused_args (rope + KV store, a different contract: SGLang's original serves them),
int32 positions, q and k of different dtypes, and the JIT module's run_rope (its is_neox lives in the module
factory, not in the call)."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter

from .spec import ROPE_DIMS


def _rope_normalize(c):
    import torch

    q, k, cache, pos = c["q"], c["k"], c["cos_sin_cache"], c["positions"]
    if q.dim() != 3 or k.dim() != 3:
        return f"q {tuple(q.shape)} / k {tuple(k.shape)} are not [tokens, heads, rope_dim]"
    t, hq, r = q.shape
    hk = k.shape[1]
    if k.shape[0] != t or k.shape[2] != r:
        return f"k shape {tuple(k.shape)} does not match q {tuple(q.shape)}"
    if r not in ROPE_DIMS:
        return f"rope_dim {r} not in {ROPE_DIMS}"
    if cache.dim() != 2 or cache.shape[1] != r or not cache.is_contiguous():
        return f"cos_sin_cache {tuple(cache.shape)} is not a contiguous [max_position, {r}]"
    if pos.dtype != torch.int64 or tuple(pos.shape) != (t,) or not pos.is_contiguous():
        return f"positions {pos.dtype} {tuple(pos.shape)} is not a contiguous int64 [{t}]"
    if q.stride(2) != 1 or k.stride(2) != 1:
        return "q or k is not unit-stride in its last dimension"
    heads = [x.stride(1) for x in (q, k) if x.shape[1] > 1]
    hs = heads[0] if heads else r
    if any(s != hs for s in heads) or hs < r:
        return f"q/k head strides {tuple(heads)} differ or are below rope_dim {r}"
    qs = q.stride(0) if t > 1 else hq * hs
    ks = k.stride(0) if t > 1 else hk * hs
    if qs < hq * hs or ks < hk * hs:
        return "token stride shorter than the heads it holds"
    c["is_neox"] = int(bool(c["is_neox"]))  # SGLang passes a bool; the ABI and the custom op take an int
    return {"q": q, "k": k, "cos_sin_cache": cache, "positions": pos}, (t, hq, hk, hs, r, qs, ks)


# `--ops all` leaves this op out (name it to patch it anyway): it wins at its site, but where `--ops all` would run it
# is unmeasured.
DEFAULT_OFF = ("measured only where --ops all does not run it: at its serving sites 1.609x (bf16) / 1.531x (fp16) in "
               "context (H200, results/2026-11-29-h200/session22/), the Llama-3-8B step -0.42% at batch 1 with rope "
               "alone (session21, one process per arm); with --ops all, dense_rope_store and qknorm_rope(_store) take "
               "Llama's, Qwen2's, Gemma-2's and Qwen3's calls (Gemma-3 never calls it: its attention rotates with "
               "torch ops, gemma_qknorm_rope's), and where they decline (a KV pool that is not bf16, a sliding-window "
               "pool, context parallelism) no A/B has timed rope")

ADAPTER = OpAdapter(
    op="rope",
    data="q",
    same_dtype=("q", "k"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "k", "positions"),
    # rope_dim defaults to cos_sin_cache.size(-1), which SGLang's kernel requires anyway (normalize checks it)
    ignorable=frozenset({"rope_dim"}),
    normalize=_rope_normalize,
    returns=lambda c: None,
)
