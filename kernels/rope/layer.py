"""The SGLang layer `validate` drives for this op: RotaryEmbedding.forward_cuda (no fused KV store) on views
of a qkv-shaped buffer, as every Llama/Qwen attention calls it."""
from astra_sglang.patch.layers import rotary_embedding, server_defaults, write_back


def run_layer(inp, dims, scalars):
    # 0.5.17's RotaryEmbedding reads the runtime config in __init__, which no server published here
    with server_defaults():
        return _run(inp, dims, scalars)


def _run(inp, dims, scalars):
    import torch

    t, hq, hk, d, r, qs, ks = dims
    neox = bool(int(scalars.get("is_neox", 1)))
    rope = rotary_embedding(inp["cos_sin_cache"], d, r, neox)
    q_buf, k_buf = inp["q"], inp["k"]
    q, k = q_buf[:, : hq * d], k_buf[:, : hk * d]
    with torch.no_grad():
        q_out, k_out = rope.forward_cuda(inp["positions"], q, k)
        write_back(q, q_out)
        write_back(k, k_out)
    return {"q": q_buf, "k": k_buf}
