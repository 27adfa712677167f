"""The SGLang code `validate` drives for this fused op, at both call sites, each called on an attention stand-in that
holds SGLang's own submodules (two RMSNorm layers with the op's weights, a RotaryEmbedding with the op's cos/sin
cache):
- Qwen3MoeAttention.apply_qk_norm_rope (the MoE method patch replaces), with a forward context whose KV pool hands
  out the op's caches;
- dense Qwen3Attention.forward, for the rows whose heads are a dense Qwen3's only (DENSE_HEADS): the stand-in's
  qkv_proj returns the case's q/k/v row buffer (the GEMM is not what is validated), its attention stores k and v with
  SGLang's store_cache when the method asks it to save the KV (every slot: the pool's skip of the padding slot 0 is
  left out, since the fused op, like SGLang's own fused rope + store, writes it), and o_proj passes through.

Outside a server SGLang's runtime config is not published; the values the methods read from it are supplied as a
server without those flags has them (patch/layers.py server_defaults). The q the attention gets (MoE: the method's q;
dense: the attention's) is the op's q_out (patched: the kernel's own buffer; unpatched: q's column view, normed and
rotated in place), so that is what validate compares, with k and the KV cache; the row buffer's q columns are the
op's input."""
from types import MethodType, SimpleNamespace

from astra_sglang.families.qkv import per_rank_heads
from astra_sglang.models import model
from astra_sglang.patch.layers import kv_pool_context, qk_norms_and_rope, server_defaults, storing_attention

from .spec import DENSE_MODELS, FUSED_MODELS


def _heads(models):
    return {per_rank_heads(model(n), tp) + (model(n).head_dim,) for n, tps in models for tp in tps}


# (q heads, kv heads, head_dim) per rank that only a dense Qwen3 has: those rows drive the dense call site
DENSE_HEADS = _heads(DENSE_MODELS) - _heads(FUSED_MODELS)


def _call_method(inp, dims, scalars):
    """Qwen3MoeAttention.apply_qk_norm_rope on the stand-in -> ((q, k, v), the stand-in)."""
    import torch
    from sglang.srt.model_executor.forward_context import forward_context
    from sglang.srt.models.qwen3_moe import Qwen3MoeAttention

    t, hq, hk, d = dims[:4]  # the strides (and q_out_stride, the 8th) are the op's layout, not the layer's
    eps = float(scalars.get("eps", 1e-6))
    neox = bool(int(scalars.get("is_neox", 1)))
    q_norm, k_norm, rope = qk_norms_and_rope(inp, d, eps, neox)
    # the qkv row buffer the method splits: q, k, v column blocks (the harness's q/k/v share one row layout
    # only where their strides are equal; otherwise they are copied into one buffer and back)
    qkv = torch.cat([inp["q"][:, : hq * d], inp["k"][:, : hk * d], inp["v"][:, : hk * d]], dim=1)
    attn = SimpleNamespace(
        use_fused_qk_norm_rope=False, head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d,
        q_norm=q_norm, k_norm=k_norm, rotary_emb=rope, alt_stream=None, compatible_with_fused_kv_buffer=True,
        attn=SimpleNamespace(layer_id=0, k_scale=None, v_scale=None), _used_fused_qk_norm_rope_last_call=None)
    batch = SimpleNamespace(out_cache_loc=inp["out_loc"])
    with torch.no_grad(), forward_context(kv_pool_context(inp, hk, d)):
        return Qwen3MoeAttention.apply_qk_norm_rope(attn, qkv, inp["positions"], batch), attn


def _call_dense_forward(inp, dims, scalars):
    """Qwen3Attention.forward on the stand-in -> (q, k) as the attention received them."""
    import torch
    from sglang.srt.model_executor.forward_context import forward_context
    from sglang.srt.models.qwen3 import Qwen3Attention

    t, hq, hk, d = dims[:4]
    eps = float(scalars.get("eps", 1e-6))
    neox = bool(int(scalars.get("is_neox", 1)))
    q_norm, k_norm, rope = qk_norms_and_rope(inp, d, eps, neox)
    qkv = torch.cat([inp["q"][:, : hq * d], inp["k"][:, : hk * d], inp["v"][:, : hk * d]], dim=1)
    radix, seen = storing_attention(inp, hk, d)
    attn = SimpleNamespace(
        head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d, q_norm=q_norm, k_norm=k_norm,
        rotary_emb=rope, alt_stream=None, use_fused_qk_norm_mrope=False, use_fused_qk_norm_rope=False,
        qkv_proj=lambda h: (qkv, None), attn=radix, o_proj=lambda x: (x, None))
    attn.forward_prepare_native = MethodType(Qwen3Attention.forward_prepare_native, attn)  # SGLang's, on the stand-in
    batch = SimpleNamespace(out_cache_loc=inp["out_loc"])
    hidden = torch.empty((t, 8), device=qkv.device, dtype=qkv.dtype)  # what the stand-in GEMM ignores
    with torch.no_grad(), forward_context(kv_pool_context(inp, hk, d)):
        Qwen3Attention.forward(attn, inp["positions"], hidden, batch)
    return seen["q"], seen["k"]


def run_layer(inp, dims, scalars):
    import torch

    t, hq, hk, d = dims[:4]
    if inp["q"].dtype != torch.bfloat16:  # validate reports the shape n/a: SGLang's layer never runs this op there
        raise ValueError("SGLang fuses the KV store only into a bf16 KV cache (enable_fused_set_kv_buffer); on an "
                         "fp16 cache the attention stores it and this op's sequence does not run")
    if tuple(dims[1:4]) in DENSE_HEADS:
        with server_defaults():
            q, k = _call_dense_forward(inp, dims, scalars)
    else:
        with server_defaults():
            (q, k, v), attn = _call_method(inp, dims, scalars)
        if attn._used_fused_qk_norm_rope_last_call is not False:
            raise RuntimeError("apply_qk_norm_rope did not take the q/k norm + rope + KV store path")
    inp["q_out"][:, : hq * d].copy_(q.reshape(t, hq * d))
    inp["k"][:, : hk * d].copy_(k.reshape(t, hk * d))
    return {"q_out": inp["q_out"], "k": inp["k"], "k_cache": inp["k_cache"], "v_cache": inp["v_cache"]}
