"""gelu_and_mul: out[t, i] = gelu(x[t, i]) * x[t, d + i] for input x of shape [tokens, 2d].

gelu(g) = 0.5 g (1 + erf(g / sqrt(2))) (torch's approximate="none").
Production path (sglang 0.5.23 / 0.5.17, sm_90): sglang/srt/layers/activation.py GeluAndMul("none")
(Gemma-1 MLPs; fused_moe's activation="gelu"; GGUF) -> gelu_and_mul -> the JIT ActivationKernel
(activation.cuh, ActivationKind::kGELU, built with --use_fast_math) for hidden % (16 / sizeof(T)) == 0,
else sgl_kernel.gelu_and_mul (FlashInfer act_and_mul_kernel).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.models import model
from astra_sglang.spec import (
    DTYPE_BYTES,
    AbiArg,
    OpSpec,
    Shape,
    SourceFile,
    Tolerance,
    Variant,
    dedupe_shapes,
    torch_dtype,
)

DECODE = (1, 16, 64, 256)
PREFILL = (4096,)
# (model, tp): the MLP's per-rank intermediate width. Prefill only for the unsharded widths (device budget).
CORPUS = (("gemma-2b", 1), ("gemma-7b", 1), ("gemma-7b", 2))


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, tp in CORPUS:
        m = model(name)
        assert m.act == "gelu"
        d = m.intermediate // tp
        src = f"{m.name} tp{tp}"
        shapes += [Shape((t, d), ("decode",), src) for t in DECODE]
        if tp == 1:
            shapes += [Shape((t, d), ("prefill",), src) for t in PREFILL]
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 4096), ("edge",), "one token"),
    Shape((3, 1368), ("edge",), "hidden not a multiple of 8 (sgl-kernel FlashInfer path)"),
    Shape((5, 3420), ("edge",), "hidden % 8 == 4"),
    Shape((7, 1001), ("edge",), "odd hidden"),
    Shape((16384, 24576), ("edge", "largest"), "gemma-7b prefill"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, d = dims
    x = torch.randn((t, 2 * d), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        x = x * 8.0  # erf saturates: the cdf rounds to 0 / 1
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
    return {"out": torch.nn.functional.gelu(g, approximate="none") * u}


def bytes_moved(dims, dtype: str) -> int:
    t, d = dims
    return 3 * t * d * DTYPE_BYTES[dtype]  # read 2d, write d per token


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "jit"


_ACT = "csrc/elementwise/activation.cuh"

SPEC = OpSpec(
    name="gelu_and_mul",
    summary="GeGLU gate (exact GELU): gelu(gate) * up over a [tokens, 2*hidden] input",
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
            description="SGLang JIT ActivationKernel, kGELU (what SGLang runs on sm_90 for aligned hidden sizes)",
            provenance="sglang/kernels/jit/csrc/elementwise/activation.cuh: ActivationKernel<T, pdl>::run_activation"
            "(input, out, \"gelu\") -> act_and_mul_kernel<T, ActivationKind::kGELU, pdl, false> "
            "(unaligned hidden -> sgl_kernel.gelu_and_mul, flashinfer::activation::act_and_mul_kernel)",
            sources=(
                SourceFile("sglang_jit", _ACT),
                SourceFile("flashinfer", "flashinfer/activation.cuh"),
            ),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit.cu.in",
            flag_profile="sglang_jit",
            # activation.py: activation_module(fast_math=True) -> get_activation_cuda_cflags()
            extra_flags=("--use_fast_math",),
            source_facts=(
                (
                    _ACT,
                    r"static constexpr auto kBlockSize = (?P<BLOCK_SIZE>\d+u?);",
                    "ActivationKernel::kBlockSize (threads per block)",
                ),
                (
                    _ACT,
                    r"__global__ void act_and_mul_kernel\(const __grid_constant__ ActivationParams params\)",
                    "act_and_mul_kernel takes ActivationParams by value",
                ),
                (
                    _ACT,
                    r"num_blocks = div_ceil\(static_cast<uint32_t>\(num_total_items\), kBlockSize\)",
                    "grid = div_ceil(tokens * hidden / kVecSize, kBlockSize)",
                ),
                (
                    _ACT,
                    r"type == \"gelu\"\) \{\s*return activation_kernel<ActivationKind::kGELU,",
                    "run_activation(\"gelu\") selects ActivationKind::kGELU",
                ),
                (
                    _ACT,
                    r"kSqrt1Over2 = 0\.7071067811865475f;\s*"
                    r"return x_f32 \* \(0\.5f \* \(1\.0f \+ erff\(x_f32 \* kSqrt1Over2\)\)\);",
                    "kGELU = x * 0.5 (1 + erff(x / sqrt(2))) (the reference's formula)",
                ),
                (
                    "flashinfer/activation.cuh",
                    r"__global__ __launch_bounds__\((?P<ACT_LAUNCH_BOUNDS>\d+)\) void act_and_mul_kernel\(",
                    "the unaligned-hidden fallback's block may not exceed act_and_mul_kernel's launch bounds",
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
        "sgl_kernel:gelu_and_mul",
        "sgl_kernel.elementwise:gelu_and_mul",
        "sglang.kernels.ops.activation.activation:gelu_and_mul",
        "sglang.srt.layers.activation:gelu_and_mul",
    ),
)
