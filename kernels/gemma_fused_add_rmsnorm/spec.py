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

from astra_sglang.families import rmsnorm
from astra_sglang.sites import gemma_norm_pair_sites

EPS = 1e-6  # Gemma-2/3 rms_norm_eps

SPEC = rmsnorm.spec(
    name="gemma_fused_add_rmsnorm",
    summary="residual += input; input = rmsnorm(residual) * (1 + weight) (Gemma, both in place)",
    fused=True,
    weight_bias=1.0,
    eps=EPS,
    variants=(
        rmsnorm.flashinfer_variant(
            description="FlashInfer GemmaFusedAddRMSNorm CUDA kernel with csrc/norm.cu's host code and AOT flags",
            provenance="sgl_kernel.gemma_fused_add_rmsnorm -> torch.ops.sgl_kernel.gemma_fused_add_rmsnorm = "
            "flashinfer csrc/norm.cu gemma_fused_add_rmsnorm -> flashinfer/norm.cuh norm::GemmaFusedAddRMSNorm("
            "input, residual, weight, batch, hidden, stride=hidden, stride=hidden, eps, "
            "enable_pdl=is_arch_support_pdl(), stream) = FusedAddRMSNormKernel with weight_bias 1 (fp16/bf16 eager "
            "calls in flashinfer 0.7.2 run its CuTe-DSL fused_add_rmsnorm_cute with weight_bias=1.0 instead)",
            source_facts=(
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t GemmaFusedAddRMSNorm\(T\* input, T\* residual, T\* weight, uint32_t batch_size, "
                    r"uint32_t d,\s+uint32_t stride_input, uint32_t stride_residual, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "GemmaFusedAddRMSNorm(input, residual, weight, batch, d, stride_input, stride_residual, eps, "
                    "enable_pdl, stream)",
                ),
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t GemmaFusedAddRMSNorm\([^{]*\{[^}]*float weight_bias = 1\.f;",
                    "GemmaFusedAddRMSNorm multiplies by (1 + weight)",
                ),
            ),
        ),
    ),
    corpus=rmsnorm.gemma_corpus(),
    edge_shapes=rmsnorm.gemma_edge_shapes(rmsnorm.SMEM_OPT_IN),
    # in context where an unpatched Gemma layer runs it: a pair of norms between two GEMMs, this op
    # the pair's second: the post-attention / post-FFN norm before it
    context_sites=lambda dims: gemma_norm_pair_sites(dims[1], second=True),
)
