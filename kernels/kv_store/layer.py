"""The SGLang code `validate` drives for this op: sglang.srt.mem_cache.memory_pool._set_kv_buffer_impl, the body
of MHATokenToKVPool.set_kv_buffer, on views of a qkv-shaped k/v and a KV-pool layer's buffers."""


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.mem_cache import memory_pool

    t, kr, vr, ks, vs = dims
    kc, vc = inp["k_cache"], inp["v_cache"]
    k, v = inp["k"][:, :kr], inp["v"][:, :vr]
    with torch.no_grad():
        memory_pool._set_kv_buffer_impl(
            k, v, kc, vc, inp["indices"], row_dim=kr, store_dtype=kc.dtype, device_module=torch.cuda,
            size_limit=int(scalars.get("size_limit", kc.shape[0])), v_row_dim=vr,
        )
    return {"k_cache": kc, "v_cache": vc}
