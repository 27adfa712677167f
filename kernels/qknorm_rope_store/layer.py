"""The SGLang code `validate` drives for this fused op: Qwen3MoeAttention.apply_qk_norm_rope itself (the method patch
replaces), called on an attention stand-in that holds SGLang's own submodules (two RMSNorm layers with the op's
weights, a RotaryEmbedding with the op's cos/sin cache) and a forward context whose KV pool hands out the op's caches.

Outside a server SGLang's runtime config is not published; the values the method reads from it are supplied as a
server without those flags has them (patch/layers.py server_defaults)."""
from types import SimpleNamespace

from astra_sglang.patch.layers import qk_norms_and_rope, server_defaults


def _call_method(inp, dims, scalars):
    """Qwen3MoeAttention.apply_qk_norm_rope on the stand-in -> ((q, k, v), the stand-in)."""
    import torch
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.qwen3_moe import Qwen3MoeAttention

    t, hq, hk, d, qs, ks, vs = dims
    eps = float(scalars.get("eps", 1e-6))
    neox = bool(int(scalars.get("is_neox", 1)))
    q_norm, k_norm, rope = qk_norms_and_rope(inp, d, eps, neox)
    # the qkv row buffer the method splits: q, k, v column blocks (the harness's q/k/v share one row layout
    # only where their strides are equal; otherwise they are copied into one buffer and back)
    qkv = torch.cat([inp["q"][:, : hq * d], inp["k"][:, : hk * d], inp["v"][:, : hk * d]], dim=1)
    kc, vc = inp["k_cache"], inp["v_cache"]
    pool = SimpleNamespace(dtype=qkv.dtype, get_key_buffer=lambda i: kc.view(kc.shape[0], hk, d),
                           get_value_buffer=lambda i: vc.view(vc.shape[0], hk, d))
    attn = SimpleNamespace(
        use_fused_qk_norm_rope=False, head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d,
        q_norm=q_norm, k_norm=k_norm, rotary_emb=rope, alt_stream=None, compatible_with_fused_kv_buffer=True,
        attn=SimpleNamespace(layer_id=0, k_scale=None, v_scale=None), _used_fused_qk_norm_rope_last_call=None)
    batch = SimpleNamespace(out_cache_loc=inp["out_loc"])
    ctx = ForwardContext(attn_backend=SimpleNamespace(token_to_kv_pool=pool))
    with torch.no_grad(), forward_context(ctx):
        return Qwen3MoeAttention.apply_qk_norm_rope(attn, qkv, inp["positions"], batch), attn


def run_layer(inp, dims, scalars):
    import torch

    t, hq, hk, d = dims[:4]
    if inp["q"].dtype != torch.bfloat16:  # validate reports the shape n/a: SGLang's layer never runs this op there
        raise ValueError("SGLang fuses the KV store only into a bf16 KV cache (enable_fused_set_kv_buffer); on an "
                         "fp16 cache the attention stores it and this op's sequence does not run")
    with server_defaults():
        (q, k, v), attn = _call_method(inp, dims, scalars)
    if attn._used_fused_qk_norm_rope_last_call is not False:
        raise RuntimeError("apply_qk_norm_rope did not take the q/k norm + rope + KV store path")
    inp["q"][:, : hq * d].copy_(q.reshape(t, hq * d))
    inp["k"][:, : hk * d].copy_(k.reshape(t, hk * d))
    return {"q": inp["q"], "k": inp["k"], "k_cache": inp["k_cache"], "v_cache": inp["v_cache"]}
