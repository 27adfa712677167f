"""The patch adapter of a fused op: SGLang's LlamaAttention, Gemma2Attention, Qwen2Attention, Qwen2MoeAttention and
MixtralAttention forwards (spec.REPLACES; 0.5.17, 0.5.23: the same body, and the attributes this adapter reads). On
CUDA that body is the qkv GEMM, the JIT rope in place (RotaryEmbedding.forward_cuda ->
apply_rope_with_cos_sin_cache_inplace, no store), then the attention, whose backend stores the KV first
(MHATokenToKVPool.set_kv_buffer -> store_cache), and o_proj. The method is replaced where SGLang
would fuse a KV store (enable_fused_set_kv_buffer: a bf16 MHA pool, no SWA pool, no context parallelism, the checks
qknorm_rope_store's dense site makes; Gemma-2's sliding window is the attention's, over a plain pool): it runs the
GEMM, this op's kernel and the attention with save_kv_cache=False, as SGLang's own Qwen3-MoE path does.
patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.qknorm_rope_store.adapter import (_attend_without_store, _dense_canonical, _dense_store_path,
                                                            _rope_path, _rope_then_store)
from astra_sglang.kernels.rope_store.adapter import _rope_store_normalize
from astra_sglang.patch.adapters import OpAdapter


def _expand(a: Dict[str, Any]):
    """An attention forward(self, positions, hidden_states, forward_batch) of spec.REPLACES -> canonical arguments, or
    why SGLang keeps it. Every reason to decline comes before the qkv GEMM: after it, SGLang's kernel sequence serves
    what the kernel does not take (patch/apply.py not_covered)."""
    import torch

    attn, positions, hs, fb = a["self"], a["positions"], a["hidden_states"], a["forward_batch"]
    if not isinstance(hs, torch.Tensor) or hs.device.type != "cuda" or hs.dim() != 2:
        return "hidden_states is not a 2-D CUDA tensor"
    return _dense_store_path(attn, fb) or _rope_path(attn.rotary_emb) or _dense_canonical(attn, positions, hs, fb)


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
