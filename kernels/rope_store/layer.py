"""The SGLang layer `validate` drives for this op: RotaryEmbedding.forward_cuda with a fused_set_kv_buffer_arg, as
Qwen3-MoE attention calls it on a bf16 KV cache (views of a qkv buffer, the pool layer's caches)."""
from astra_sglang.patch.layers import rotary_embedding, server_defaults, write_back


def run_layer(inp, dims, scalars):
    # 0.5.17's RotaryEmbedding reads the runtime config in __init__, which no server published here
    with server_defaults():
        return _run(inp, dims, scalars)


def _run(inp, dims, scalars):
    import torch
    from sglang.kernels.ops.attention.rope import FusedSetKVBufferArg

    t, hq, hk, d, qs, ks, vs = dims
    neox = bool(int(scalars.get("is_neox", 1)))
    rope = rotary_embedding(inp["cos_sin_cache"], d, d, neox)
    q_buf, k_buf = inp["q"], inp["k"]
    q, k, v = q_buf[:, : hq * d], k_buf[:, : hk * d], inp["v"][:, : hk * d]
    arg = FusedSetKVBufferArg(value=v, k_buffer=inp["k_cache"], v_buffer=inp["v_cache"], cache_loc=inp["out_loc"])
    with torch.no_grad():
        q_out, k_out = rope.forward_cuda(inp["positions"], q, k, fused_set_kv_buffer_arg=arg)
        write_back(q, q_out)
        write_back(k, k_out)
    return {"q": q_buf, "k": k_buf, "k_cache": inp["k_cache"], "v_cache": inp["v_cache"]}
