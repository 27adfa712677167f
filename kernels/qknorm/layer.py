"""The SGLang code `validate` drives for this op: sglang.srt.models.utils.apply_qk_norm, the helper every Qwen3
attention layer calls, with two of SGLang's RMSNorm layers holding the q and k weights. Outside a server
(sglang 0.5.17's runtime config not published) apply_qk_norm cannot read its exec config; the layer then makes
the call apply_qk_norm makes on CUDA, models.utils.fused_inplace_qknorm (the registered custom op)."""
from astra_sglang.patch.layers import construct, write_back


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models import utils as mutils

    t, hq, hk, d, qs, ks = dims
    eps = float(scalars.get("eps", 1e-6))
    q_buf, k_buf = inp["q"], inp["k"]
    norms = []
    for w in (inp["q_weight"], inp["k_weight"]):
        n = construct(RMSNorm, d, eps=eps).to(device=q_buf.device, dtype=q_buf.dtype)
        n.weight.data.copy_(w)
        norms.append(n)
    # the views SGLang passes: the q and k column blocks of each token's row
    q = q_buf[:, : hq * d]
    k = k_buf[:, : hk * d]
    with torch.no_grad():
        try:
            q_out, k_out = mutils.apply_qk_norm(q=q, k=k, q_norm=norms[0], k_norm=norms[1], head_dim=d,
                                                allow_inplace=True)
        except ValueError as e:
            if "not published" not in str(e):
                raise
            mutils.fused_inplace_qknorm(q=q.view(t, -1, d), k=k.view(t, -1, d), q_weight=norms[0].weight,
                                        k_weight=norms[1].weight, head_dim=d, eps=eps)
            q_out, k_out = q, k
        # the fused path normalizes in place and returns the views; the per-layer path returns new tensors
        write_back(q, q_out)
        write_back(k, k_out)
    return {"q": q_buf, "k": k_buf}
