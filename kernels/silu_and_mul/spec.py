"""silu_and_mul: out[t, i] = silu(x[t, i]) * x[t, d + i] for input x of shape [tokens, 2d]."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.models import MODELS
from astra_sglang.spec import (
    DTYPE_BYTES,
    AbiArg,
    OpSpec,
    Shape,
    SourceFile,
    Tolerance,
    Variant,
    dedupe_shapes,
    token_sweep,
    torch_dtype,
)

PAPER = [(16, 4096), (32, 5120), (64, 8192), (16, 12288), (256, 4096), (1024, 4096), (128, 11008), (512, 14336)]


def _corpus() -> Tuple[Shape, ...]:
    shapes = [Shape(s, ("paper",), "astra-paper") for s in PAPER]
    for m in MODELS:
        for tp in m.tp:
            d = m.intermediate // tp
            shapes += token_sweep((d,), f"{m.name} tp{tp}")
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 4096), ("edge",), "one token"),
    Shape((3, 1368), ("edge",), "DeepSeek-V2-Lite tp8: hidden not a multiple of 8 (FlashInfer path)"),
    Shape((5, 3420), ("edge",), "Qwen2.5-VL: hidden % 8 == 4"),
    Shape((7, 1001), ("edge",), "odd hidden"),
    Shape((16384, 28672), ("edge", "largest"), "llama-70b tp1 prefill"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, d = dims
    x = torch.randn((t, 2 * d), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        x = x * 8.0  # silu saturates / underflows: exercises exp overflow paths
    elif dist == "uniform":
        x = torch.rand((t, 2 * d), generator=gen, device=device, dtype=torch.float32) * 20 - 10
    return {
        "input": x.to(torch_dtype(dtype)),
        "out": torch.empty((t, d), device=device, dtype=torch_dtype(dtype)),
    }


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    x = inp["input"].double()
    d = dims[1]
    g, u = x[:, :d], x[:, d:]
    return {"out": torch.nn.functional.silu(g) * u}


def bytes_moved(dims, dtype: str) -> int:
    t, d = dims
    return 3 * t * d * DTYPE_BYTES[dtype]  # read 2d, write d per token


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "jit"


SPEC = OpSpec(
    name="silu_and_mul",
    summary="SwiGLU gate: silu(gate) * up over a [tokens, 2*hidden] input",
    dim_names=("num_tokens", "hidden"),
    abi=(
        AbiArg("out", "ptr", "out"),
        AbiArg("input", "ptr", "in"),
        AbiArg("num_tokens", "i64"),
        AbiArg("hidden", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="jit",
            description="SGLang JIT ActivationKernel (what SGLang runs on sm_90 for aligned hidden sizes)",
            provenance="sglang/kernels/jit/csrc/elementwise/activation.cuh: ActivationKernel<T, pdl>::run_activation "
            "(unaligned hidden -> sgl_kernel.silu_and_mul, flashinfer::activation::act_and_mul_kernel)",
            sources=(
                SourceFile("sglang_jit", "csrc/elementwise/activation.cuh"),
                SourceFile("flashinfer", "flashinfer/activation.cuh"),
            ),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit.cu.in",
            flag_profile="sglang_jit",
            # activation.py: activation_module(fast_math=True) -> get_activation_cuda_cflags()
            extra_flags=("--use_fast_math",),
            source_facts=(
                (
                    "csrc/elementwise/activation.cuh",
                    r"static constexpr auto kBlockSize = (?P<BLOCK_SIZE>\d+u?);",
                    "ActivationKernel::kBlockSize (threads per block)",
                ),
                (
                    "csrc/elementwise/activation.cuh",
                    r"__global__ void act_and_mul_kernel\(const __grid_constant__ ActivationParams params\)",
                    "act_and_mul_kernel takes ActivationParams by value",
                ),
                (
                    "csrc/elementwise/activation.cuh",
                    r"num_blocks = div_ceil\(static_cast<uint32_t>\(num_total_items\), kBlockSize\)",
                    "grid = div_ceil(tokens * hidden / kVecSize, kBlockSize)",
                ),
                (
                    "flashinfer/activation.cuh",
                    r"__global__ __launch_bounds__\((?P<ACT_LAUNCH_BOUNDS>\d+)\) void act_and_mul_kernel\(",
                    "the unaligned-hidden fallback's block may not exceed act_and_mul_kernel's launch bounds",
                ),
            ),
            dtypes=("fp16", "bf16", "fp32"),
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
    default_variant=_default_variant,
    dtypes=("fp16", "bf16", "fp32"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0),
    make_inputs=make_inputs,
    reference=reference,
    scalars=lambda dims: {},
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "uniform"),
    replaces=(
        "sgl_kernel:silu_and_mul",
        "sglang.kernels.ops.activation.activation:silu_and_mul",
        "sglang.srt.layers.activation:silu_and_mul",
    ),
    # JIT/FlashInfer act_and_mul_kernel (the functor may not show in the name: profile then uses the
    # model's hidden_act), sgl_kernel's silu_and_mul, astra's astra_silu:: kernel
    kernel_symbols=(r"act_and_mul.*silu", r"silu_?and_?mul", r"astra_silu::"),
)
