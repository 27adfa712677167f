"""gemma_rmsnorm: out = input / rms(input) * (1 + weight) (out of place; Gemma stores weight - 1).

Production paths (sglang 0.5.23 / 0.5.17, sglang-kernel 0.4.10, flashinfer-python 0.7.2, sm_90):
  sglang/srt/layers/layernorm.py GemmaRMSNorm._forward_impl(x) (Gemma-1/2: post_attention_layernorm and
  post_feedforward_layernorm, every layer) and Gemma3RMSNorm.forward_cuda(x) for 2-D x (Gemma-3's
  per-layer norms; its 3-D q/k norms go to forward_native)
    -> sgl_kernel.gemma_rmsnorm(x, weight, eps)
       -> fp16/bf16, eager: flashinfer.norm.gemma_rmsnorm, which runs FlashInfer's CuTe-DSL kernel
          (rmsnorm_cute, weight_bias=1.0) when nvidia-cutlass-dsl imports and supports the arch, else
          (FLASHINFER_USE_CUDA_NORM=1, no DSL) the CUDA kernel norm.cuh GemmaRMSNorm
       -> under torch.compile / without flashinfer: torch.ops.sgl_kernel.gemma_rmsnorm = FlashInfer's
          csrc/norm.cu gemma_rmsnorm -> norm.cuh GemmaRMSNorm = RMSNormKernel, weight_bias = 1 (PDL on sm_90+)
The "flashinfer" variant is that CUDA kernel with csrc/norm.cu's host code and sgl-kernel's AOT flags.
The CuTe-DSL kernel has no CUDA source to extract: it is timed as the installed callable.
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
    Shape((3, 20000), ("edge",), "over 2048 vectors: a cluster splits the row"),
    Shape((16384, 5376), ("edge", "largest"), "gemma-3-27b prefill chunk"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, h = dims
    dt = torch_dtype(dtype)
    x = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    # Gemma checkpoints store weight - 1: values around 0 (some near -1, where 1 + w cancels)
    w = 0.25 * torch.randn((h,), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        x = x * 64.0
        idx = torch.randint(0, h, (t, max(1, h // 512)), generator=gen, device=device)
        x.scatter_(1, idx, 2000.0)
    elif dist == "uniform":
        x = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
        w = torch.rand((h,), generator=gen, device=device, dtype=torch.float32) * 2 - 1.5
    return {"input": x.to(dt), "weight": w.to(dt), "out": torch.empty((t, h), device=device, dtype=dt)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64: out = input * rsqrt(mean(input^2) + eps) * (1 + weight)."""
    import torch

    x = inp["input"].double()
    w = inp["weight"].double()
    rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + float(scalars.get("eps", EPS)))
    return {"out": x * rms * (1.0 + w)}


def bytes_moved(dims, dtype: str) -> int:
    t, h = dims
    return (2 * t * h + h) * DTYPE_BYTES[dtype]  # read input, weight; write out


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "flashinfer"


_NORM = "flashinfer/norm.cuh"

SPEC = OpSpec(
    name="gemma_rmsnorm",
    summary="out = rmsnorm(input) * (1 + weight) (Gemma, out of place)",
    dim_names=("num_tokens", "hidden"),
    abi=(
        AbiArg("out", "ptr", "out"),
        AbiArg("input", "ptr", "in"),
        AbiArg("weight", "ptr", "in"),
        AbiArg("num_tokens", "i64"),
        AbiArg("hidden", "i64"),
        AbiArg("eps", "f64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="flashinfer",
            description="FlashInfer GemmaRMSNorm CUDA kernel with csrc/norm.cu's host code and sgl-kernel's AOT flags",
            provenance="sgl_kernel.gemma_rmsnorm -> torch.ops.sgl_kernel.gemma_rmsnorm = flashinfer csrc/norm.cu "
            "gemma_rmsnorm -> flashinfer/norm.cuh norm::GemmaRMSNorm(input, weight, output, batch, hidden, "
            "stride_in=hidden, stride_out=hidden, eps, enable_pdl=is_arch_support_pdl(), stream) = RMSNormKernel "
            "with weight_bias 1 (fp16/bf16 eager calls in flashinfer 0.7.2 run its CuTe-DSL rmsnorm_cute with "
            "weight_bias=1.0 instead; this CUDA kernel is that path's FLASHINFER_USE_CUDA_NORM=1 form)",
            sources=(SourceFile("flashinfer", _NORM),),
            launcher="launch_flashinfer.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    _NORM,
                    r"cudaError_t GemmaRMSNorm\(T\* input, T\* weight, T\* output, uint32_t batch_size, uint32_t d,\s+"
                    r"uint32_t stride_input, uint32_t stride_output, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "GemmaRMSNorm(input, weight, output, batch, d, stride_input, stride_output, eps, enable_pdl, "
                    "stream)",
                ),
                (
                    _NORM,
                    r"cudaError_t GemmaRMSNorm\([^{]*\{[^}]*float weight_bias = 1\.f;",
                    "GemmaRMSNorm multiplies by (1 + weight)",
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
        "sgl_kernel:gemma_rmsnorm",
        "sgl_kernel.elementwise:gemma_rmsnorm",
        "sglang.srt.layers.layernorm:gemma_rmsnorm",
        "flashinfer.norm:gemma_rmsnorm",
    ),
)
