"""gemma_fused_add_rmsnorm: residual += input; input = rmsnorm(residual) * (1 + weight), both in place.

Production paths (sglang 0.5.23 / 0.5.17, sglang-kernel 0.4.10, flashinfer-python 0.7.2, sm_90):
  sglang/srt/layers/layernorm.py GemmaRMSNorm._forward_impl(x, residual) (Gemma-1/2: input_layernorm and
  pre_feedforward_layernorm, every layer) and Gemma3RMSNorm.forward_cuda(x, residual) (Gemma-3)
    -> sgl_kernel.gemma_fused_add_rmsnorm(x, residual, weight, eps)
       -> fp16/bf16, eager: flashinfer.norm.gemma_fused_add_rmsnorm, which runs FlashInfer's CuTe-DSL
          kernel (fused_add_rmsnorm_cute, weight_bias=1.0) when nvidia-cutlass-dsl imports and supports the
          arch, else (FLASHINFER_USE_CUDA_NORM=1, no DSL) the CUDA kernel norm.cuh GemmaFusedAddRMSNorm
       -> under torch.compile / without flashinfer: torch.ops.sgl_kernel.gemma_fused_add_rmsnorm =
          FlashInfer's csrc/norm.cu -> norm.cuh GemmaFusedAddRMSNorm = FusedAddRMSNormKernel, weight_bias = 1
The "flashinfer" variant is that CUDA kernel with csrc/norm.cu's host code and sgl-kernel's AOT flags. The
CuTe-DSL kernel has no CUDA source to extract: it is timed as the installed callable.
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

EPS = 1e-6  # Gemma-2/3 rms_norm_eps
DECODE = (1, 16, 64, 256)
PREFILL = (4096,)
# Gemma-2 runs two plain and two fused-add norms per layer, Gemma-3 the same on 2-D hidden states.
CORPUS_MODELS = ("gemma-2-2b", "gemma-2-9b", "gemma-3-12b", "gemma-3-27b")


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name in CORPUS_MODELS:
        m = model(name)
        assert m.norm == "gemma"
        # the norm runs on the full (replicated) hidden state: TP does not shard it
        shapes += [Shape((t, m.hidden), ("decode",), f"{m.name} hidden") for t in DECODE]
        shapes += [Shape((t, m.hidden), ("prefill",), f"{m.name} hidden") for t in PREFILL]
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 4096), ("edge",), "one token"),
    Shape((3, 4100), ("edge",), "hidden % 8 == 4 (FlashInfer vec 4)"),
    Shape((5, 1001), ("edge",), "odd hidden (FlashInfer vec 1)"),
    Shape((9, 1152), ("edge",), "gemma-3-1b hidden"),
    Shape((2, 16384), ("edge",), "widest hidden: FlashInfer smem > 48 KB (opt-in)"),
    Shape((16384, 5376), ("edge", "largest"), "gemma-3-27b prefill chunk"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, h = dims
    dt = torch_dtype(dtype)
    x = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    r = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    # Gemma checkpoints store weight - 1: values around 0
    w = 0.25 * torch.randn((h,), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":  # residual streams grow through the layers: large sums of squares, outliers
        x = x * 64.0
        r = r * 64.0
        idx = torch.randint(0, h, (t, max(1, h // 512)), generator=gen, device=device)
        r.scatter_(1, idx, 2000.0)
    elif dist == "uniform":
        x = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
        r = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
        w = torch.rand((h,), generator=gen, device=device, dtype=torch.float32) * 2 - 1.5
    return {"input": x.to(dt), "residual": r.to(dt), "weight": w.to(dt)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64: residual' = input + residual; input' = residual' / rms(residual') * (1 + weight)."""
    import torch

    x = inp["input"].double()
    r = inp["residual"].double()
    w = inp["weight"].double()
    s = x + r
    rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + float(scalars.get("eps", EPS)))
    return {"input": s * rms * (1.0 + w), "residual": s}


def bytes_moved(dims, dtype: str) -> int:
    t, h = dims
    return (4 * t * h + h) * DTYPE_BYTES[dtype]  # read input, residual, weight; write input, residual


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "flashinfer"


_NORM = "flashinfer/norm.cuh"

SPEC = OpSpec(
    name="gemma_fused_add_rmsnorm",
    summary="residual += input; input = rmsnorm(residual) * (1 + weight) (Gemma, both in place)",
    dim_names=("num_tokens", "hidden"),
    abi=(
        AbiArg("input", "ptr", "inout"),
        AbiArg("residual", "ptr", "inout"),
        AbiArg("weight", "ptr", "in"),
        AbiArg("num_tokens", "i64"),
        AbiArg("hidden", "i64"),
        AbiArg("eps", "f64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="flashinfer",
            description="FlashInfer GemmaFusedAddRMSNorm CUDA kernel with csrc/norm.cu's host code and AOT flags",
            provenance="sgl_kernel.gemma_fused_add_rmsnorm -> torch.ops.sgl_kernel.gemma_fused_add_rmsnorm = "
            "flashinfer csrc/norm.cu gemma_fused_add_rmsnorm -> flashinfer/norm.cuh norm::GemmaFusedAddRMSNorm("
            "input, residual, weight, batch, hidden, stride=hidden, stride=hidden, eps, "
            "enable_pdl=is_arch_support_pdl(), stream) = FusedAddRMSNormKernel with weight_bias 1 (fp16/bf16 eager "
            "calls in flashinfer 0.7.2 run its CuTe-DSL fused_add_rmsnorm_cute with weight_bias=1.0 instead)",
            sources=(SourceFile("flashinfer", _NORM),),
            launcher="launch_flashinfer.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    _NORM,
                    r"cudaError_t GemmaFusedAddRMSNorm\(T\* input, T\* residual, T\* weight, uint32_t batch_size, "
                    r"uint32_t d,\s+uint32_t stride_input, uint32_t stride_residual, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "GemmaFusedAddRMSNorm(input, residual, weight, batch, d, stride_input, stride_residual, eps, "
                    "enable_pdl, stream)",
                ),
                (
                    _NORM,
                    r"cudaError_t GemmaFusedAddRMSNorm\([^{]*\{[^}]*float weight_bias = 1\.f;",
                    "GemmaFusedAddRMSNorm multiplies by (1 + weight)",
                ),
            ),
            dtypes=("fp16", "bf16"),
        ),
    ),
    default_variant=_default_variant,
    dtypes=("fp16", "bf16"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0),
    make_inputs=make_inputs,
    reference=reference,
    scalars=lambda dims: {"eps": EPS},
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "uniform"),
    replaces=(
        "sgl_kernel:gemma_fused_add_rmsnorm",
        "sgl_kernel.elementwise:gemma_fused_add_rmsnorm",
        "sglang.srt.layers.layernorm:gemma_fused_add_rmsnorm",
        "flashinfer.norm:gemma_fused_add_rmsnorm",
    ),
)
