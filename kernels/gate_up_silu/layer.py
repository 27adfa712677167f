"""The SGLang code `validate` drives for this fused op: LlamaMLP.forward itself (the method patch replaces), looked up
on the class at call time, on a LlamaMLP made without its __init__ (that needs SGLang's parallel state): its
gate_up_proj is a real MergedColumnParallelLinear holding the case's weight and SGLang's UnquantizedLinearMethod,
whose forward is, for this instance, what ColumnParallelLinear.forward runs at TP 1 without sequence parallelism
(quant_method.apply, no gather); its act_fn is SGLang's own SiluAndMul; its down_proj is an identity stand-in, so
the forward returns the activation this op writes (down_proj is not what is validated: the replacement calls
SGLang's own)."""
from types import SimpleNamespace


class _Identity:
    """down_proj's stand-in: (the activation, no bias), whatever keywords the forward passes."""

    def __call__(self, x, **kwargs):
        return x, None


def _gate_up_proj(weight, method):
    import torch
    from sglang.srt.layers.linear import MergedColumnParallelLinear

    gu = MergedColumnParallelLinear.__new__(MergedColumnParallelLinear)
    torch.nn.Module.__init__(gu)
    gu.weight, gu.bias, gu.quant_method = weight, None, method
    gu.gather_output, gu.skip_bias_add = False, False
    gu.input_size, gu.output_sizes = weight.shape[1], [weight.shape[0] // 2] * 2
    gu.tp_rank, gu.tp_size, gu.tp_group = 0, 1, None
    gu.forward = lambda input_: (method.apply(gu, input_, None), None)
    return gu


def run_mlp(inp, mlp_cls, act):
    """`mlp_cls`.forward (looked up at call time: patched or not) on an MLP made without its __init__, with act_fn
    `act` (SGLang's own activation layer); gate_up_gelu_tanh's layer runs Gemma2MLP's through it too."""
    import torch
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    mlp = mlp_cls.__new__(mlp_cls)
    torch.nn.Module.__init__(mlp)
    mlp.gate_up_proj = _gate_up_proj(inp["weight"], UnquantizedLinearMethod())
    mlp.act_fn = act
    mlp.down_proj = _Identity()
    # 0.5.23's own fusions (LlamaMLP's), off as on Hopper
    mlp.dual_gemm = SimpleNamespace(mode=None, can_run=lambda x, proj: False)
    mlp.activation_quant = SimpleNamespace(enabled=False)
    with torch.no_grad():
        out = mlp_cls.forward(mlp, inp["x"])
    inp["out"].copy_(out)
    return {"out": inp["out"]}


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.models.llama import LlamaMLP

    from astra_sglang.patch.layers import construct

    return run_mlp(inp, LlamaMLP, construct(SiluAndMul))
