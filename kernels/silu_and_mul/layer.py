"""The SGLang layer `validate` drives for this op: SiluAndMul.forward_cuda."""
from astra_sglang.patch.layers import construct


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.activation import SiluAndMul

    return {"out": construct(SiluAndMul).forward_cuda(inp["input"])}
