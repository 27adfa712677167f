"""The SGLang layer `validate` drives for this op: GeluAndMul("none").forward_cuda."""
from astra_sglang.patch.layers import construct


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.activation import GeluAndMul

    # construct() without arguments: sglang 0.5.17 builds the layer through its base class outside a
    # server (no __init__, so no approximate attribute); set the one field forward_cuda reads.
    layer = construct(GeluAndMul)
    layer.approximate = "none"
    return {"out": layer.forward_cuda(inp["input"])}
