"""gate_up_gelu: a FUSED op. A Gemma-1 MLP's gate_up projection and its GELU-and-mul (erf) at decode sizes, in one
launch (kernels/gate_up_silu's op with Gemma-1's activation; gate_up_gelu_tanh is Gemma-2 / Gemma-3's):

    g[t, k] = T( sum_h x[t, h] * weight[k, h] ),   u[t, k] = T( sum_h x[t, h] * weight[I + k, h] )
    out[t, k] = T( gelu(g[t, k]) * u[t, k] )                          fp32 math, rounded to the model dtype T
    gelu(g) = 0.5 g (1 + erf(g / sqrt(2)))                           (torch's approximate="none")

x [tokens, H] is the MLP's input, weight [2I, H] gate_up_proj's ([I/tp gate; I/tp up] per rank), out [tokens, I] the
activation down_proj reads; g and u are each rounded to T before the activation, as the GEMM writes them for
gelu_and_mul to read (gate_up_silu's spec says more).

What SGLang runs (0.5.17 and 0.5.23, CUDA, an unquantized bf16 / fp16 model): GemmaMLP.forward (gemma.py, Gemma-1)
calls gate_up_proj (MergedColumnParallelLinear -> UnquantizedLinearMethod.apply -> F.linear), then
GeluAndMul("none") -> forward_cuda -> gelu_and_mul (the JIT ActivationKernel, ActivationKind::kGELU, built with
--use_fast_math; its erff is libdevice's polynomial, which fast math leaves as it is), then down_proj. Production is
the first two back to back; a speedup of this op is over their SUM. The only variant is `installed`, the MLP forward
through the adapter, whose `sequence` runs F.linear and SGLang's gelu_and_mul on the op's tensors.

Tolerance: gate_up_silu's (linear's); the fp64 reference takes the exact erf.

Every shape has I a multiple of 8 (SGLang's gelu_and_mul takes another kernel, sgl_kernel's, elsewhere).
"""
from __future__ import annotations

from astra_sglang.kernels.gate_up_silu.spec import corpus, fused_mlp_spec, installed_variant
from astra_sglang.kernels.gate_up_silu.spec import model_dims as _mlp_dims
from astra_sglang.models import MORE_MODELS

# (model, H, I, TP degrees): every model SGLang runs with GeluAndMul("none") in GemmaMLP (Gemma-1 2B / 7B; models.py
# holds their configs and TP degrees)
MLP_MODELS = tuple((m.name, m.hidden, m.intermediate, m.tp) for m in MORE_MODELS if m.act == "gelu")

_GEMMA = "srt/models/gemma.py"
_ACT = "srt/layers/activation.py"
_BODY = (r"^    def forward\(self, x\):\n"
         r"        gate_up, _ = self\.gate_up_proj\(x\)\n"
         r"        x = self\.act_fn\(gate_up\)\n"
         r"        x, _ = self\.down_proj\(x\)\n"
         r"        return x$")

model_dims = _mlp_dims  # the profile's speedup lookup: (tokens, H, I / tp), as gate_up_silu's

SPEC = fused_mlp_spec(
    name="gate_up_gelu",
    summary="FUSED gate_up_proj GEMV + GELU-and-mul (erf) epilogue of a Gemma-1 MLP at 1-2 decode tokens (replaces "
            "the gate_up projection's cuBLAS GEMM, then SGLang's gelu_and_mul kernel; speedups are over the sum of "
            "the two)",
    act="gelu",
    variant=installed_variant(
        description="SGLang's Gemma-1 MLP up to down_proj: gate_up_proj's UnquantizedLinearMethod.apply -> F.linear "
        "(cuBLAS), then GeluAndMul('none').forward_cuda (the JIT ActivationKernel, kGELU)",
        provenance="sglang/srt/models/gemma.py GemmaMLP.forward -> self.gate_up_proj(x) -> MergedColumnParallelLinear "
        "(ColumnParallelLinear.forward) -> UnquantizedLinearMethod.apply -> F.linear (cuBLAS); then "
        "self.act_fn(gate_up) -> GeluAndMul.forward_cuda -> _forward_impl -> srt/layers/activation.py gelu_and_mul "
        "(JIT csrc/elementwise/activation.cuh)",
        facts=(
            (_GEMMA, r"class GemmaMLP\(nn\.Module\):", "GemmaMLP is Gemma-1's MLP (the method patch replaces)"),
            (_GEMMA, _BODY, "GemmaMLP.forward(self, x): gate_up_proj, act_fn, down_proj(x) (the replacement calls "
             "down_proj the same way)"),
            (_GEMMA, r"^        self\.act_fn = GeluAndMul\(\"none\"\)$", "GemmaMLP's act_fn is GeluAndMul(\"none\")"),
            (_ACT, r"elif self\.approximate == \"none\":\s*gelu_and_mul\(x, out\)",
             "GeluAndMul._forward_impl: approximate none runs gelu_and_mul(x, out) into a new [..., d] tensor"),
            (_ACT, r"def forward_cuda\(self, x: torch\.Tensor\) -> torch\.Tensor:\s*return self\._forward_impl\(x\)",
             "GeluAndMul.forward_cuda is _forward_impl"),
        ),
        callable="sglang.srt.models.gemma:GemmaMLP.forward",
    ),
    corpus=corpus(MLP_MODELS),
    replaces=("sglang.srt.models.gemma:GemmaMLP.forward",),
    kernel_symbols=(r"astra_gug::",),
)
