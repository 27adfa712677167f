"""The SGLang code `validate` drives for this op: UnquantizedLinearMethod.apply itself (the method patch replaces),
called on a stand-in layer that holds the op's weight, looked up on the class at call time so the patch is what runs.
Constructing a real QKVParallelLinear / RowParallelLinear needs SGLang's parallel state; apply reads only the weight
(and, through use_intel_amx_backend, the layer's AMX flag, absent here)."""
from types import SimpleNamespace


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    method = UnquantizedLinearMethod()
    layer = SimpleNamespace(weight=inp["weight"], quant_method=method)
    with torch.no_grad():
        out = method.apply(layer, inp["x"])
    inp["out"].copy_(out)
    return {"out": inp["out"]}
