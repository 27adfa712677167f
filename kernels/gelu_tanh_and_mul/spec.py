"""gelu_tanh_and_mul: out[t, i] = gelu_tanh(x[t, i]) * x[t, d + i] for input x of shape [tokens, 2d].

gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (torch's approximate="tanh").
Production path (sglang 0.5.23 / 0.5.17, sm_90): sglang/srt/layers/activation.py GeluAndMul("tanh")
(Gemma-2, Gemma-3, Grok MLPs) -> gelu_tanh_and_mul -> the JIT ActivationKernel (activation.cuh,
ActivationKind::kGELUTanh, built with --use_fast_math) for hidden % (16 / sizeof(T)) == 0, else
sgl_kernel.gelu_tanh_and_mul (FlashInfer act_and_mul_kernel).
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
CORPUS = (("gemma-2-9b", 1), ("gemma-3-12b", 1), ("gemma-3-27b", 1), ("gemma-3-27b", 2), ("gemma-3-27b", 4))


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, tp in CORPUS:
        m = model(name)
        assert m.act == "gelu_tanh" and tp in m.tp
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
    Shape((16384, 18432), ("edge", "largest"), "gemma-2-27b tp2 prefill"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, d = dims
    x = torch.randn((t, 2 * d), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        x = x * 8.0  # tanh saturates: the cdf rounds to 0 / 1
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
    return {"out": torch.nn.functional.gelu(g, approximate="tanh") * u}


def bytes_moved(dims, dtype: str) -> int:
    t, d = dims
    return 3 * t * d * DTYPE_BYTES[dtype]  # read 2d, write d per token


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "jit"


_ACT = "csrc/elementwise/activation.cuh"

SPEC = OpSpec(
    name="gelu_tanh_and_mul",
    summary="GeGLU gate (tanh GELU): gelu_tanh(gate) * up over a [tokens, 2*hidden] input",
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
            description="SGLang JIT ActivationKernel, kGELUTanh (what SGLang runs on sm_90 for aligned hidden sizes)",
            provenance="sglang/kernels/jit/csrc/elementwise/activation.cuh: ActivationKernel<T, pdl>::run_activation"
            "(input, out, \"gelu_tanh\") -> act_and_mul_kernel<T, ActivationKind::kGELUTanh, pdl, false> "
            "(unaligned hidden -> sgl_kernel.gelu_tanh_and_mul, flashinfer::activation::act_and_mul_kernel)",
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
                    r"type == \"gelu_tanh\"\) \{\s*return activation_kernel<ActivationKind::kGELUTanh,",
                    "run_activation(\"gelu_tanh\") selects ActivationKind::kGELUTanh",
                ),
                (
                    _ACT,
                    r"kGeluTanhAlpha = 0\.044715f;\s*constexpr auto kGeluTanhBeta = 0\.7978845608028654f;\s*"
                    r"const float cdf = 0\.5f \* \(1\.0f \+ tanhf\(kGeluTanhBeta \* \(x_f32 \+ kGeluTanhAlpha \* "
                    r"x_f32 \* x_f32 \* x_f32\)\)\);",
                    "kGELUTanh = x * 0.5 (1 + tanhf(sqrt(2/pi) (x + 0.044715 x^3))) (the reference's formula)",
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
        "sgl_kernel:gelu_tanh_and_mul",
        "sgl_kernel.elementwise:gelu_tanh_and_mul",
        "sglang.kernels.ops.activation.activation:gelu_tanh_and_mul",
        "sglang.srt.layers.activation:gelu_tanh_and_mul",
    ),
)
