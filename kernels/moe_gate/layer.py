"""The SGLang code `validate` drives for this op: ReplicatedLinear.forward itself (the method patch replaces), called on
a stand-in gate that holds the op's weight and SGLang's own UnquantizedLinearMethod, looked up on the class at call
time so the patch is what runs. Constructing a real ReplicatedLinear needs SGLang's parallel state; forward reads only
these four attributes."""
from types import SimpleNamespace


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    gate = SimpleNamespace(weight=inp["weight"], bias=None, skip_bias_add=False,
                           quant_method=UnquantizedLinearMethod())
    with torch.no_grad():
        out, out_bias = ReplicatedLinear.forward(gate, inp["x"])
    assert out_bias is None
    inp["out"].copy_(out)
    return {"out": inp["out"]}
