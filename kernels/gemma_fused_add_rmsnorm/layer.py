"""The SGLang layer `validate` drives for this op: GemmaRMSNorm.forward_cuda with a residual."""
from astra_sglang.patch.layers import construct


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.layernorm import GemmaRMSNorm

    x, r, w = inp["input"], inp["residual"], inp["weight"]
    norm = construct(GemmaRMSNorm, dims[1], eps=float(scalars.get("eps", 1e-6))).to(device=x.device, dtype=x.dtype)
    norm.weight.data.copy_(w)  # the stored (w - 1); gemma_fused_add_rmsnorm adds the 1
    out, res = norm.forward_cuda(x, r)
    return {"input": out, "residual": res}
