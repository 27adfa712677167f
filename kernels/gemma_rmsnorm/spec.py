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

from astra_sglang.families import rmsnorm
from astra_sglang.sites import gemma_norm_pair_sites

EPS = 1e-6  # Gemma-2/3 rms_norm_eps

SPEC = rmsnorm.spec(
    name="gemma_rmsnorm",
    summary="out = rmsnorm(input) * (1 + weight) (Gemma, out of place)",
    fused=False,
    weight_bias=1.0,
    eps=EPS,
    variants=(
        rmsnorm.flashinfer_variant(
            description="FlashInfer GemmaRMSNorm CUDA kernel with csrc/norm.cu's host code and sgl-kernel's AOT flags",
            provenance="sgl_kernel.gemma_rmsnorm -> torch.ops.sgl_kernel.gemma_rmsnorm = flashinfer csrc/norm.cu "
            "gemma_rmsnorm -> flashinfer/norm.cuh norm::GemmaRMSNorm(input, weight, output, batch, hidden, "
            "stride_in=hidden, stride_out=hidden, eps, enable_pdl=is_arch_support_pdl(), stream) = RMSNormKernel "
            "with weight_bias 1 (fp16/bf16 eager calls in flashinfer 0.7.2 run its CuTe-DSL rmsnorm_cute with "
            "weight_bias=1.0 instead; this CUDA kernel is that path's FLASHINFER_USE_CUDA_NORM=1 form)",
            source_facts=(
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t GemmaRMSNorm\(T\* input, T\* weight, T\* output, uint32_t batch_size, uint32_t d,\s+"
                    r"uint32_t stride_input, uint32_t stride_output, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "GemmaRMSNorm(input, weight, output, batch, d, stride_input, stride_output, eps, enable_pdl, "
                    "stream)",
                ),
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t GemmaRMSNorm\([^{]*\{[^}]*float weight_bias = 1\.f;",
                    "GemmaRMSNorm multiplies by (1 + weight)",
                ),
            ),
        ),
    ),
    corpus=rmsnorm.gemma_corpus(),
    edge_shapes=rmsnorm.gemma_edge_shapes(rmsnorm.CLUSTER_SPLIT),
    # in context where an unpatched Gemma layer runs it: a pair of norms between two GEMMs, this op
    # the pair's first: the pre-FFN / next input norm after it
    context_sites=lambda dims: gemma_norm_pair_sites(dims[1], second=False),
)
