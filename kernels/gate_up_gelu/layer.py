"""The SGLang code `validate` drives for this fused op: GemmaMLP.forward itself (the method patch replaces), looked up
on the class at call time, on a GemmaMLP made without its __init__, with SGLang's own GeluAndMul("none") as act_fn,
through gate_up_silu's run_mlp (a real MergedColumnParallelLinear holding the case's weight and SGLang's
UnquantizedLinearMethod as gate_up_proj, an identity stand-in as down_proj, so the forward returns the activation)."""
from astra_sglang.kernels.gate_up_silu.layer import run_mlp
from astra_sglang.patch.layers import construct


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.activation import GeluAndMul
    from sglang.srt.models.gemma import GemmaMLP

    # construct() without arguments: outside a server sglang 0.5.17 may build the layer through its base class (no
    # __init__, so no approximate attribute); set the one field forward_cuda reads, as GemmaMLP's GeluAndMul("none")
    act = construct(GeluAndMul)
    act.approximate = "none"
    return run_mlp(inp, GemmaMLP, act)
