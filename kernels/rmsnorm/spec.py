"""rmsnorm: out = input / rms(input) * weight (out of place).

Production paths (sglang 0.5.23 / 0.5.17, sglang-kernel 0.4.10, flashinfer-python 0.7.2, sm_90):
  sglang/srt/layers/layernorm.py RMSNorm.forward_cuda(x) with no residual (the first layer's input
  norm, the final norm, DeepSeek MLA's q_a / kv_a norms, ...)
    -> sgl_kernel.rmsnorm(x, weight, eps)
       -> fp16/bf16, eager: flashinfer.norm.rmsnorm, which runs FlashInfer's CuTe-DSL kernel
          (rmsnorm_cute, weight_bias=0) when nvidia-cutlass-dsl imports and supports the arch, else
          (FLASHINFER_USE_CUDA_NORM=1, no DSL) the CUDA kernel norm.cuh RMSNorm
       -> under torch.compile / without flashinfer: torch.ops.sgl_kernel.rmsnorm = FlashInfer's
          csrc/norm.cu rmsnorm -> norm.cuh RMSNorm (PDL on sm_90+)
The "flashinfer" variant is the CUDA RMSNorm with the host code of csrc/norm.cu and sgl-kernel's AOT
flags. The CuTe-DSL kernel is Python-generated and has no CUDA source to extract: it is timed as the
installed callable (`bench --baseline installed`) where the GPU machine has flashinfer.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.models import ALL_MODELS, model
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

EPS = 1e-6  # SGLang's RMSNorm default
DECODE = (1, 16, 64, 256)
PREFILL = (1024, 4096, 16384)


def _sweep(h: int, src: str, tokens, tag: str):
    return [Shape((t, h), (tag,), src) for t in tokens]


def _corpus() -> Tuple[Shape, ...]:
    # Per layer: DeepSeek-V3's MLA norms (q_lora 1536, kv_lora 512) run every layer, decode and prefill.
    ds = model("deepseek-v3")
    shapes = []
    for w in ds.extra_norm_widths:
        shapes += _sweep(w, f"{ds.name} MLA lora-rank norm", DECODE, "decode")
        shapes += _sweep(w, f"{ds.name} MLA lora-rank norm", PREFILL, "prefill")
    # Once per step (first layer's input norm, the final norm): the hidden sizes of the served models,
    # rms-norm models only (Gemma runs gemma_rmsnorm). 2880 (gpt-oss) is 360 vectors, not a power of two.
    # (4096 also stands for Qwen3-8B / Qwen3-235B; the device budget keeps this list short.)
    for name in ("llama-3-8b", "deepseek-v3", "gpt-oss-120b"):
        m = model(name)
        assert m.norm == "rms"
        shapes += _sweep(m.hidden, f"{m.name} hidden", DECODE, "decode")
        shapes += _sweep(m.hidden, f"{m.name} hidden", (4096,), "prefill")
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 4096), ("edge",), "one token"),
    Shape((3, 4100), ("edge",), "hidden % 8 == 4 (FlashInfer vec 4)"),
    Shape((5, 1001), ("edge",), "odd hidden (FlashInfer vec 1)"),
    Shape((7, 2), ("edge",), "narrowest row"),
    Shape((2, 16384), ("edge",), "widest corpus-like hidden"),
    Shape((3, 20000), ("edge",), "over 2048 vectors: a cluster splits the row"),
    Shape((16384, 8192), ("edge", "largest"), "llama-70b prefill chunk"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, h = dims
    dt = torch_dtype(dtype)
    x = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    w = 1.0 + 0.25 * torch.randn((h,), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":  # residual-stream magnitudes with outliers: large sums of squares
        x = x * 64.0
        idx = torch.randint(0, h, (t, max(1, h // 512)), generator=gen, device=device)
        x.scatter_(1, idx, 2000.0)
    elif dist == "uniform":
        x = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
    return {"input": x.to(dt), "weight": w.to(dt), "out": torch.empty((t, h), device=device, dtype=dt)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64: out = input * rsqrt(mean(input^2) + eps) * weight."""
    import torch

    x = inp["input"].double()
    w = inp["weight"].double()
    rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + float(scalars.get("eps", EPS)))
    return {"out": x * rms * w}


def bytes_moved(dims, dtype: str) -> int:
    t, h = dims
    return (2 * t * h + h) * DTYPE_BYTES[dtype]  # read input, weight; write out


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "flashinfer"


_NORM = "flashinfer/norm.cuh"

SPEC = OpSpec(
    name="rmsnorm",
    summary="out = rmsnorm(input) * weight (out of place)",
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
            description="FlashInfer RMSNorm CUDA kernel with csrc/norm.cu's host code and sgl-kernel's AOT flags",
            provenance="sgl_kernel.rmsnorm -> torch.ops.sgl_kernel.rmsnorm = flashinfer csrc/norm.cu rmsnorm -> "
            "flashinfer/norm.cuh norm::RMSNorm(input, weight, output, batch, hidden, stride_in=hidden, "
            "stride_out=hidden, eps, enable_pdl=is_arch_support_pdl(), stream) (fp16/bf16 eager calls in "
            "flashinfer 0.7.2 run its CuTe-DSL rmsnorm_cute instead; this CUDA kernel is that path's "
            "FLASHINFER_USE_CUDA_NORM=1 / torch.compile form)",
            sources=(SourceFile("flashinfer", _NORM),),
            launcher="launch_flashinfer.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    _NORM,
                    r"cudaError_t RMSNorm\(T\* input, T\* weight, T\* output, uint32_t batch_size, uint32_t d,\s+"
                    r"uint32_t stride_input, uint32_t stride_output, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "RMSNorm(input, weight, output, batch, d, stride_input, stride_output, eps, enable_pdl, stream)",
                ),
                (
                    _NORM,
                    r"cudaError_t RMSNorm\([^{]*\{\s*const uint32_t vec_size = std::gcd\(16 / sizeof\(T\), d\);"
                    r"[^}]*float weight_bias = 0\.f;",
                    "RMSNorm multiplies by (0 + weight): the plain weight",
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
        "sgl_kernel:rmsnorm",
        "sgl_kernel.elementwise:rmsnorm",
        "sglang.srt.layers.layernorm:rmsnorm",
        "flashinfer.norm:rmsnorm",
    ),
)
