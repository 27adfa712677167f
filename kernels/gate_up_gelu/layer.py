"""The SGLang code `validate` drives for this fused op: GemmaMLP.forward itself (the method patch replaces), looked up
on the class at call time, on a GemmaMLP made without its __init__, with SGLang's own GeluAndMul("none") as act_fn,
through gate_up_gelu_tanh's run_gelu_mlp (gate_up_silu's run_mlp: a real MergedColumnParallelLinear holding the case's
weight and SGLang's UnquantizedLinearMethod as gate_up_proj, an identity stand-in as down_proj, so the forward returns
the activation)."""
from astra_sglang.kernels.gate_up_gelu_tanh.layer import run_gelu_mlp


def run_layer(inp, dims, scalars):
    from sglang.srt.models.gemma import GemmaMLP

    return run_gelu_mlp(inp, GemmaMLP, "none")
