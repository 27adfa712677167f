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

from typing import Tuple

from astra_sglang.families import rmsnorm
from astra_sglang.models import PREFILL_TOKENS, model
from astra_sglang.spec import Shape, dedupe_shapes

EPS = 1e-6  # SGLang's RMSNorm default


def _corpus() -> Tuple[Shape, ...]:
    # Per layer: DeepSeek-V3's MLA norms (q_lora 1536, kv_lora 512) run every layer, decode and prefill.
    shapes = rmsnorm.token_shapes(rmsnorm.mla_widths(model("deepseek-v3")), PREFILL_TOKENS)
    # Once per step (first layer's input norm, the final norm): the hidden sizes of the served models,
    # rms-norm models only (Gemma runs gemma_rmsnorm). 2880 (gpt-oss) is 360 vectors, not a power of two.
    # (4096 also stands for Qwen3-8B / Qwen3-235B; the device budget keeps this list short.)
    hidden = rmsnorm.hidden_widths(("llama-3-8b", "deepseek-v3", "gpt-oss-120b"), "rms")
    shapes += rmsnorm.token_shapes(hidden, (4096,))
    return dedupe_shapes(shapes)


SPEC = rmsnorm.spec(
    name="rmsnorm",
    summary="out = rmsnorm(input) * weight (out of place)",
    fused=False,
    weight_bias=0.0,
    eps=EPS,
    variants=(
        rmsnorm.flashinfer_variant(
            description="FlashInfer RMSNorm CUDA kernel with csrc/norm.cu's host code and sgl-kernel's AOT flags",
            provenance="sgl_kernel.rmsnorm -> torch.ops.sgl_kernel.rmsnorm = flashinfer csrc/norm.cu rmsnorm -> "
            "flashinfer/norm.cuh norm::RMSNorm(input, weight, output, batch, hidden, stride_in=hidden, "
            "stride_out=hidden, eps, enable_pdl=is_arch_support_pdl(), stream) (fp16/bf16 eager calls in "
            "flashinfer 0.7.2 run its CuTe-DSL rmsnorm_cute instead; this CUDA kernel is that path's "
            "FLASHINFER_USE_CUDA_NORM=1 / torch.compile form)",
            source_facts=(
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t RMSNorm\(T\* input, T\* weight, T\* output, uint32_t batch_size, uint32_t d,\s+"
                    r"uint32_t stride_input, uint32_t stride_output, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "RMSNorm(input, weight, output, batch, d, stride_input, stride_output, eps, enable_pdl, stream)",
                ),
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t RMSNorm\([^{]*\{\s*const uint32_t vec_size = std::gcd\(16 / sizeof\(T\), d\);"
                    r"[^}]*float weight_bias = 0\.f;",
                    "RMSNorm multiplies by (0 + weight): the plain weight",
                ),
            ),
        ),
    ),
    corpus=_corpus(),
    edge_shapes=(
        rmsnorm.ONE_TOKEN,
        rmsnorm.VEC4,
        rmsnorm.VEC1,
        Shape((7, 2), ("edge",), "narrowest row"),
        Shape((2, 16384), ("edge",), "widest corpus-like hidden"),
        # in the adapter's keep band (129-256 tokens at widths 1536-5120): validate shows it left to SGLang (n/a)
        Shape((256, 4096), ("edge",), "llama-3-8b decode, 256 tokens (kept band)"),
        rmsnorm.CLUSTER_SPLIT,
        Shape((16384, 8192), ("edge", "largest"), "llama-70b prefill chunk"),
    ),
)
