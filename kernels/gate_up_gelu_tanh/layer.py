"""The SGLang code `validate` drives for this fused op: Gemma2MLP.forward itself (the method patch replaces), looked up
on the class at call time, on a Gemma2MLP made without its __init__, with SGLang's own GeluAndMul("tanh") as act_fn,
through gate_up_silu's run_mlp (a real MergedColumnParallelLinear holding the case's weight and SGLang's
UnquantizedLinearMethod as gate_up_proj, an identity stand-in as down_proj, so the forward returns the activation)."""
from astra_sglang.kernels.gate_up_silu.layer import run_mlp
from astra_sglang.patch.layers import construct


def run_gelu_mlp(inp, mlp_cls, approximate: str):
    """`mlp_cls`.forward through run_mlp with SGLang's GeluAndMul(approximate) as act_fn (gate_up_gelu's layer runs
    GemmaMLP's, approximate "none")."""
    from sglang.srt.layers.activation import GeluAndMul

    # construct() without arguments: outside a server sglang 0.5.17 may build the layer through its base class (no
    # __init__, so no approximate attribute); set the one field forward_cuda reads, as the MLP's GeluAndMul has it
    act = construct(GeluAndMul)
    act.approximate = approximate
    return run_mlp(inp, mlp_cls, act)


def run_layer(inp, dims, scalars):
    from sglang.srt.models.gemma2 import Gemma2MLP

    return run_gelu_mlp(inp, Gemma2MLP, "tanh")
