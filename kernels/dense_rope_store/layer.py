"""The SGLang code `validate` drives for this fused op: LlamaAttention.forward itself (the method patch replaces),
called on an attention stand-in that holds SGLang's own RotaryEmbedding with the op's cos/sin cache. Its qkv_proj
returns the case's q/k/v row buffer (the GEMM is not what is validated), its attention stores k and v with SGLang's
store_cache when the method asks it to save the KV (patch/layers.py storing_attention), and o_proj passes through.
Outside a server the rope's construction reads the runtime config; it is supplied as a default server has it
(patch/layers.py server_defaults). The q the attention gets is the op's q_out (patched: the kernel's own buffer;
unpatched: q's column view, rotated in place), so that is what validate compares, with k and the KV cache; the row
buffer's q columns are the op's input."""
from types import MethodType, SimpleNamespace

from astra_sglang.patch.layers import kv_pool_context, rotary_embedding, server_defaults, storing_attention


def _call_forward(inp, dims, scalars):
    """LlamaAttention.forward on the stand-in -> (q, k) as the attention received them."""
    import torch
    from sglang.srt.model_executor.forward_context import forward_context
    from sglang.srt.models.llama import LlamaAttention

    t, hq, hk, d = dims[:4]  # q_out_stride (8th) is the op's output layout, not the layer's
    neox = bool(int(scalars.get("is_neox", 1)))
    rope = rotary_embedding(inp["cos_sin_cache"], d, d, neox)
    qkv = torch.cat([inp["q"][:, : hq * d], inp["k"][:, : hk * d], inp["v"][:, : hk * d]], dim=1)
    radix, seen = storing_attention(inp, hk, d)
    attn = SimpleNamespace(head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d,
                           rotary_emb=rope, qkv_proj=lambda h: (qkv, None), attn=radix, o_proj=lambda x: (x, None))
    attn.forward_prepare_native = MethodType(LlamaAttention.forward_prepare_native, attn)  # SGLang's, on the stand-in
    batch = SimpleNamespace(out_cache_loc=inp["out_loc"], forward_mode=SimpleNamespace(is_extend=lambda: False))
    hidden = torch.empty((t, 8), device=qkv.device, dtype=qkv.dtype)  # what the stand-in GEMM ignores
    with torch.no_grad(), forward_context(kv_pool_context(inp, hk, d)):
        LlamaAttention.forward(attn, inp["positions"], hidden, batch)
    return seen["q"], seen["k"]


def run_layer(inp, dims, scalars):
    import torch

    t, hq, hk, d = dims[:4]
    if inp["q"].dtype != torch.bfloat16:  # validate reports the shape n/a: SGLang's layer never runs this op there
        raise ValueError("the fused KV store is taken only on a bf16 KV cache (enable_fused_set_kv_buffer); on an "
                         "fp16 cache the attention stores it and this op's sequence does not run")
    with server_defaults():
        q, k = _call_forward(inp, dims, scalars)
    inp["q_out"][:, : hq * d].copy_(q.reshape(t, hq * d))
    inp["k"][:, : hk * d].copy_(k.reshape(t, hk * d))
    return {"q_out": inp["q_out"], "k": inp["k"], "k_cache": inp["k_cache"], "v_cache": inp["v_cache"]}
