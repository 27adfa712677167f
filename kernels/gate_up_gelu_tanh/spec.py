"""gate_up_gelu_tanh: a FUSED op. A Gemma MLP's gate_up projection and its GELU(tanh)-and-mul at decode sizes, in one
launch (kernels/gate_up_silu's op with Gemma's activation):

    g[t, k] = T( sum_h x[t, h] * weight[k, h] ),   u[t, k] = T( sum_h x[t, h] * weight[I + k, h] )
    out[t, k] = T( gelu_tanh(g[t, k]) * u[t, k] )                    fp32 math, rounded to the model dtype T
    gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))   (torch's approximate="tanh")

x [tokens, H] is the MLP's input, weight [2I, H] gate_up_proj's ([I/tp gate; I/tp up] per rank), out [tokens, I] the
activation down_proj reads; g and u are each rounded to T before the activation, as the GEMM writes them for
gelu_tanh_and_mul to read (gate_up_silu's spec says more).

What SGLang runs (0.5.17 and 0.5.23, CUDA, an unquantized bf16 / fp16 model): Gemma2MLP.forward (gemma2.py) and
Gemma3MLP.forward (gemma3_causal.py; Gemma-3 text and multimodal, Gemma-4's dense MLP imports it) call gate_up_proj
(MergedColumnParallelLinear -> UnquantizedLinearMethod.apply -> F.linear), then GeluAndMul() (approximate "tanh",
the default both build) -> forward_cuda -> gelu_tanh_and_mul (the JIT ActivationKernel, ActivationKind::kGELUTanh,
built with --use_fast_math: its tanhf is the hardware tanh.approx.f32 on sm_90), then down_proj. Production is the
first two back to back; a speedup of this op is over their SUM. The only variant is `installed`, the MLP forward
through the adapter, whose `sequence` runs F.linear and SGLang's gelu_tanh_and_mul on the op's tensors.

Tolerance: gate_up_silu's (linear's). The fp64 reference takes the exact tanh; production and this kernel take the
same tanh.approx.f32 (max relative error about 2^-11), whose error the relative metric sees most where
gelu_tanh(g) is small (g around -3: 1 + tanh cancels); both sides carry the same error, so the k x production rule
needs no relaxation, and the GPU check must confirm production's own error stays inside its fp16 / bf16 floors.

Every shape has I a multiple of 8 (SGLang's gelu_tanh_and_mul takes another kernel, sgl_kernel's, elsewhere).
"""
from __future__ import annotations

from astra_sglang.kernels.gate_up_silu.spec import corpus, fused_mlp_spec, installed_variant
from astra_sglang.kernels.gate_up_silu.spec import model_dims as _mlp_dims
from astra_sglang.models import MORE_MODELS

# (model, H, I, TP degrees): every model SGLang runs with GeluAndMul("tanh") in Gemma2MLP / Gemma3MLP
# (Gemma-2 2B / 9B / 27B, Gemma-3 1B / 4B / 12B / 27B; models.py holds their configs and TP degrees)
MLP_MODELS = tuple((m.name, m.hidden, m.intermediate, m.tp) for m in MORE_MODELS if m.act == "gelu_tanh")

_GEMMA2 = "srt/models/gemma2.py"
_GEMMA3 = "srt/models/gemma3_causal.py"
_ACT = "srt/layers/activation.py"
_BODY = (r"^    def forward\(self, x: torch\.Tensor\) -> torch\.Tensor:\n"
         r"        gate_up, _ = self\.gate_up_proj\(x\)\n"
         r"        x = self\.act_fn\(gate_up\)\n"
         r"        x, _ = self\.down_proj\(x\)\n"
         r"        return x$")

model_dims = _mlp_dims  # the profile's speedup lookup: (tokens, H, I / tp), as gate_up_silu's

SPEC = fused_mlp_spec(
    name="gate_up_gelu_tanh",
    summary="FUSED gate_up_proj GEMV + GELU(tanh)-and-mul epilogue of a Gemma-2 / Gemma-3 MLP at 1-2 decode tokens "
            "(replaces the gate_up projection's cuBLAS GEMM, then SGLang's gelu_tanh_and_mul kernel; speedups are "
            "over the sum of the two)",
    act="gelu_tanh",
    variant=installed_variant(
        description="SGLang's Gemma MLP up to down_proj: gate_up_proj's UnquantizedLinearMethod.apply -> F.linear "
        "(cuBLAS), then GeluAndMul('tanh').forward_cuda (the JIT ActivationKernel, kGELUTanh)",
        provenance="sglang/srt/models/gemma2.py Gemma2MLP.forward / srt/models/gemma3_causal.py Gemma3MLP.forward -> "
        "self.gate_up_proj(x) -> MergedColumnParallelLinear (ColumnParallelLinear.forward) -> "
        "UnquantizedLinearMethod.apply -> F.linear (cuBLAS); then self.act_fn(gate_up) -> GeluAndMul.forward_cuda "
        "-> _forward_impl -> srt/layers/activation.py gelu_tanh_and_mul (JIT csrc/elementwise/activation.cuh)",
        facts=(
            (_GEMMA2, r"class Gemma2MLP\(nn\.Module\):", "Gemma2MLP is Gemma-2's MLP (the method patch replaces)"),
            (_GEMMA2, _BODY, "Gemma2MLP.forward(self, x): gate_up_proj, act_fn, down_proj(x) (the replacement calls "
             "down_proj the same way)"),
            (_GEMMA2, r"^        self\.act_fn = GeluAndMul\(\)$", "Gemma2MLP's act_fn is GeluAndMul() (tanh)"),
            (_GEMMA3, r"class Gemma3MLP\(nn\.Module\):", "Gemma3MLP is Gemma-3's MLP"),
            (_GEMMA3, _BODY, "Gemma3MLP.forward(self, x): gate_up_proj, act_fn, down_proj(x)"),
            (_GEMMA3, r"^        self\.act_fn = GeluAndMul\(\)$", "Gemma3MLP's act_fn is GeluAndMul() (tanh)"),
            (_ACT, r"class GeluAndMul\(\w+\):\s*def __init__\(self, approximate=\"tanh\"\):",
             "GeluAndMul's approximate defaults to tanh"),
            (_ACT, r"if self\.approximate == \"tanh\":\s*gelu_tanh_and_mul\(x, out\)",
             "GeluAndMul._forward_impl: approximate tanh runs gelu_tanh_and_mul(x, out) into a new [..., d] tensor"),
            (_ACT, r"def forward_cuda\(self, x: torch\.Tensor\) -> torch\.Tensor:\s*return self\._forward_impl\(x\)",
             "GeluAndMul.forward_cuda is _forward_impl"),
        ),
        callable="sglang.srt.models.gemma2:Gemma2MLP.forward",
    ),
    corpus=corpus(MLP_MODELS),
    replaces=("sglang.srt.models.gemma2:Gemma2MLP.forward", "sglang.srt.models.gemma3_causal:Gemma3MLP.forward"),
    kernel_symbols=(r"astra_gugt::",),
)
