"""silu_and_mul: out[t, i] = silu(x[t, i]) * x[t, d + i] for input x of shape [tokens, 2d]."""
from __future__ import annotations

from astra_sglang.families import activation
from astra_sglang.models import MODELS
from astra_sglang.spec import Shape, SourceFile, Variant

PAPER = [(16, 4096), (32, 5120), (64, 8192), (16, 12288), (256, 4096), (1024, 4096), (128, 11008), (512, 14336)]

EDGE = (
    Shape((1, 4096), ("edge",), "one token"),
    Shape((3, 1368), ("edge",), "DeepSeek-V2-Lite tp8: hidden not a multiple of 8 (FlashInfer path)"),
    Shape((5, 3420), ("edge",), "Qwen2.5-VL: hidden % 8 == 4"),
    Shape((7, 1001), ("edge",), "odd hidden"),
    Shape((16384, 28672), ("edge", "largest"), "llama-70b tp1 prefill"),
)

SPEC = activation.spec(
    name="silu_and_mul",
    summary="SwiGLU gate: silu(gate) * up over a [tokens, 2*hidden] input",
    act="silu",
    variants=(
        activation.jit_variant(
            description="SGLang JIT ActivationKernel (what SGLang runs on sm_90 for aligned hidden sizes)",
            provenance="sglang/kernels/jit/csrc/elementwise/activation.cuh: ActivationKernel<T, pdl>::run_activation "
            "(unaligned hidden -> sgl_kernel.silu_and_mul, flashinfer::activation::act_and_mul_kernel)",
        ),
        Variant(
            name="aot",
            description="sgl-kernel AOT silu_and_mul: FlashInfer act_and_mul_kernel, one CTA per token",
            provenance="sgl_kernel.silu_and_mul -> torch.ops.sgl_kernel.silu_and_mul -> sgl-kernel "
            "csrc/elementwise/activation.cu silu_and_mul: flashinfer::activation::act_and_mul_kernel<T, silu> "
            "<<<tokens, min(d / (16 / sizeof(T)), 1024), 0, stream>>> (SGLang's route for hidden sizes the JIT "
            "kernel's vector width does not divide)",
            sources=(SourceFile("flashinfer", "flashinfer/activation.cuh"),),
            launcher="launch_aot.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    "flashinfer/activation.cuh",
                    r"template <typename T, float \(\*Activation\)\(const float&\), uint32_t vec_size>\s*"
                    r"__global__ __launch_bounds__\((?P<ACT_LAUNCH_BOUNDS>\d+)\) void act_and_mul_kernel\(",
                    "act_and_mul_kernel<T, Activation, vec_size> with its __launch_bounds__",
                ),
            ),
            dtypes=("fp16", "bf16", "fp32"),
        ),
    ),
    # every model of MODELS (the corpus the recorded RESULTS were measured on), all TP degrees it is served with
    corpus=activation.corpus([(m.name, tp) for m in MODELS for tp in m.tp], "silu", paper=PAPER),
    edge_shapes=EDGE,
    replaces=(
        "sgl_kernel:silu_and_mul",
        "sglang.kernels.ops.activation.activation:silu_and_mul",
        "sglang.srt.layers.activation:silu_and_mul",
    ),
    # JIT/FlashInfer act_and_mul_kernel (the functor may not show in the name: profile then uses the
    # model's hidden_act), sgl_kernel's silu_and_mul, astra's astra_silu:: kernel
    kernel_symbols=(r"act_and_mul.*silu", r"silu_?and_?mul", r"astra_silu::"),
)
