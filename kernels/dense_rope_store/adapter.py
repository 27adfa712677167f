"""The patch adapter of a fused op: SGLang's LlamaAttention.forward (0.5.17, 0.5.23), whose body on CUDA is the qkv
GEMM, the JIT rope in place (RotaryEmbedding.forward_cuda -> apply_rope_with_cos_sin_cache_inplace, no store), then
the attention, whose backend stores the KV first (MHATokenToKVPool.set_kv_buffer -> store_cache), and o_proj. The
method is replaced where SGLang would fuse a KV store (enable_fused_set_kv_buffer: a bf16 MHA pool, no SWA, no
context parallelism, the checks qknorm_rope_store's dense site makes): it runs the GEMM, this op's kernel and the
attention with save_kv_cache=False, as SGLang's own Qwen3-MoE path does. patch/adapters.py holds the machinery and
says what each field means."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.qknorm_rope_store.adapter import (_attend_without_store, _dense_store_path, _rope_path,
                                                            _rope_then_store)
from astra_sglang.kernels.rope_store.adapter import _rope_store_normalize
from astra_sglang.patch.adapters import OpAdapter


def _expand(a: Dict[str, Any]):
    """LlamaAttention.forward(self, positions, hidden_states, forward_batch) -> canonical arguments, or why SGLang
    keeps it. Every reason to decline comes before the qkv GEMM: after it, SGLang's kernel sequence serves what the
    kernel does not take (patch/apply.py not_covered)."""
    import torch
    from sglang.srt.models import utils as mutils

    attn, positions, hs, fb = a["self"], a["positions"], a["hidden_states"], a["forward_batch"]
    if not isinstance(hs, torch.Tensor) or hs.device.type != "cuda" or hs.dim() != 2:
        return "hidden_states is not a 2-D CUDA tensor"
    why = _dense_store_path(attn, fb) or _rope_path(attn.rotary_emb)
    if why:
        return why
    d, hq, hk = attn.head_dim, attn.num_heads, attn.num_kv_heads
    qkv, _ = attn.qkv_proj(hs)
    t = qkv.shape[0]
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    arg = mutils.create_fused_set_kv_buffer_arg(value=v, layer=attn.attn, forward_batch=fb)
    rope = attn.rotary_emb
    return {
        "q": q.view(t, hq, d), "k": k.view(t, hk, d), "v": v, "k_cache": arg.k_buffer, "v_cache": arg.v_buffer,
        "cos_sin_cache": rope.cos_sin_cache, "positions": positions, "out_loc": arg.cache_loc,
        "is_neox": rope.is_neox_style,
        # for returns: the rest of the method (attention without its own store, o_proj)
        "layer": attn, "forward_batch": fb, "qkv": qkv, "sizes": [attn.q_size, attn.kv_size, attn.kv_size],
    }


ADAPTER = OpAdapter(
    op="dense_rope_store",
    data="q",
    same_dtype=("q", "k", "v", "k_cache", "v_cache"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "k", "v", "positions", "out_loc"),
    normalize=_rope_store_normalize,
    returns=_attend_without_store,
    expand=_expand,
    sequence=_rope_then_store,
    slot_indexed={"k_cache": "out_loc", "v_cache": "out_loc"},
)
