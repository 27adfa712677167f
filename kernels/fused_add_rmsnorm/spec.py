"""fused_add_rmsnorm: residual += input; input = rmsnorm(residual) * weight, both in place.

Production paths (sglang 0.5.23, sglang-kernel 0.4.10, flashinfer-python 0.7.2, sm_90):
  sglang/srt/layers/layernorm.py RMSNorm.forward_cuda(x, residual)
    -> sgl_kernel.fused_add_rmsnorm(x, residual, weight, eps)            (default mode)
       -> fp16/bf16, eager: flashinfer.norm.fused_add_rmsnorm, which runs FlashInfer's
          CuTe-DSL kernel when nvidia-cutlass-dsl imports and supports the arch, else
          (FLASHINFER_USE_CUDA_NORM=1, no DSL) the CUDA kernel norm.cuh FusedAddRMSNorm
       -> fp32, or under torch.compile: torch.ops.sgl_kernel.fused_add_rmsnorm
          = sgl-kernel csrc/elementwise/fused_add_rms_norm_kernel.cu sgl_fused_add_rmsnorm
          -> FlashInfer norm.cuh FusedAddRMSNorm (PDL on sm_90+)
    -> sglang.kernels.ops.layernorm.norm.fused_add_rmsnorm(..., cast_x_before_out_mul=True)
       (HF-parity mode, transformers backend; hidden % 16 == 0 and hidden <= 8192)
       = JIT elementwise/fused_add_rmsnorm.cuh FusedAddRMSNormKernel<true, T>
The "flashinfer" variant is the CUDA FusedAddRMSNorm with sgl-kernel's host code and
AOT flags. The CuTe-DSL kernel is Python-generated and has no CUDA source to extract.
"""
from __future__ import annotations

from typing import Optional, Tuple

from astra_sglang.families import rmsnorm
from astra_sglang.models import MODELS, PREFILL_TOKENS
from astra_sglang.sites import residual_norm_sites
from astra_sglang.spec import Shape, SourceFile, Variant, dedupe_shapes

PAPER = [(16, 4096), (32, 5120), (64, 8192), (16, 12288), (256, 4096), (1024, 4096), (128, 11008), (512, 14336)]
EPS = 1e-6  # SGLang's RMSNorm default (model configs use 1e-5 or 1e-6)

# JIT HF-parity kernel limits: sglang/kernels/ops/layernorm/norm.py
# is_supported_jit_fused_add_rmsnorm_hidden_size (callers route other sizes to torch).
JIT_HF_MAX_HIDDEN = 8192
JIT_HF_HIDDEN_MULTIPLE = 16


def _corpus() -> Tuple[Shape, ...]:
    shapes = [Shape(s, ("paper",), "astra-paper") for s in PAPER]
    for m in MODELS:
        widths = rmsnorm.hidden_widths([m.name], "rms") + rmsnorm.mla_widths(m)
        shapes += rmsnorm.token_shapes(widths, PREFILL_TOKENS)
    return dedupe_shapes(shapes)


def _jit_hf_supports(dims, dtype: str) -> Optional[str]:
    h = dims[1]
    if dtype not in ("fp16", "bf16"):
        return f"{dtype}: the HF-parity JIT kernel is fp16/bf16 only"
    if h % JIT_HF_HIDDEN_MULTIPLE or h > JIT_HF_MAX_HIDDEN:
        return (
            f"hidden {h}: SGLang runs the HF-parity JIT kernel only for hidden % {JIT_HF_HIDDEN_MULTIPLE} == 0 "
            f"and hidden <= {JIT_HF_MAX_HIDDEN} (else forward_native)"
        )
    return None


_JIT = "csrc/elementwise/fused_add_rmsnorm.cuh"

SPEC = rmsnorm.spec(
    name="fused_add_rmsnorm",
    summary="residual += input; input = rmsnorm(residual) * weight (both in place)",
    fused=True,
    weight_bias=0.0,
    eps=EPS,
    dtypes=("fp16", "bf16", "fp32"),
    variants=(
        rmsnorm.flashinfer_variant(
            description="FlashInfer FusedAddRMSNorm CUDA kernel with sgl-kernel's host code and AOT flags",
            provenance="sgl_kernel.fused_add_rmsnorm -> sgl-kernel csrc/elementwise/fused_add_rms_norm_kernel.cu "
            "sgl_fused_add_rmsnorm -> flashinfer/norm.cuh norm::FusedAddRMSNorm(input, residual, weight, "
            "batch, hidden, stride=hidden, stride=hidden, eps, enable_pdl=is_arch_support_pdl(), stream) "
            "(fp16/bf16 eager calls in flashinfer 0.7.2 run its CuTe-DSL kernel instead; this CUDA kernel is "
            "that path's FLASHINFER_USE_CUDA_NORM=1 / torch.compile / fp32 form)",
            source_facts=(
                (
                    rmsnorm.NORM_HEADER,
                    r"cudaError_t FusedAddRMSNorm\(T\* input, T\* residual, T\* weight, uint32_t batch_size, "
                    r"uint32_t d,\s+uint32_t stride_input, uint32_t stride_residual, float eps = [\d.e-]+,\s+"
                    r"bool enable_pdl = false, cudaStream_t stream = 0\)",
                    "FusedAddRMSNorm(input, residual, weight, batch, d, stride_input, stride_residual, eps, "
                    "enable_pdl, stream)",
                ),
            ),
            dtypes=("fp16", "bf16", "fp32"),
        ),
        Variant(
            name="jit_hf",
            description="SGLang JIT FusedAddRMSNormKernel<true, T> (HF-parity mode: cast before the weight multiply)",
            provenance="sglang/kernels/ops/layernorm/norm.py fused_add_rmsnorm(cast_x_before_out_mul=True) -> "
            "jit/csrc/elementwise/fused_add_rmsnorm.cuh FusedAddRMSNormKernel<true, T>::run: one CTA per token, "
            "ceil32(hidden / (kMaxVecBytes / sizeof(T))) threads, no PDL; hidden % 16 == 0 and <= 8192",
            sources=(SourceFile("sglang_jit", _JIT),),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit_hf.cu.in",
            flag_profile="sglang_jit",
            source_facts=(
                (
                    # relative to sglang/kernels/jit: the Python policy that routes shapes here
                    "../ops/layernorm/norm.py",
                    r"return hidden_size > 0 and hidden_size % (?P<JIT_HF_HIDDEN_MULTIPLE>\d+) == 0 "
                    r"and hidden_size <= (?P<JIT_HF_MAX_HIDDEN>\d+)",
                    "is_supported_jit_fused_add_rmsnorm_hidden_size: hidden % 16 == 0 and hidden <= 8192",
                ),
                (
                    _JIT,
                    r"if \(hidden_size <= \(device::kMaxVecBytes == 32 \? 12288 : 8192\)\)",
                    "register-resident path limit: hidden <= 8192 with 16-byte vectors (12288 with 32-byte)",
                ),
                (
                    _JIT,
                    r"uint threads = \(vec_hidden_size \+ 31\) / 32 \* 32;",
                    "block = vec_hidden_size rounded up to a warp multiple",
                ),
                (
                    _JIT,
                    r"auto kernel = fused_add_rmsnorm_reg_kernel<kCastXBeforeOutMul, DType, device::kMaxVecBytes>;",
                    "kernel template <kCastXBeforeOutMul, T, kMaxVecBytes>",
                ),
                (
                    _JIT,
                    r"\.enable_pdl\(false\)\(\s*kernel,\s*reinterpret_cast<DType\*>\(input\.data_ptr\(\)\),\s*"
                    r"reinterpret_cast<DType\*>\(residual\.data_ptr\(\)\),\s*"
                    r"reinterpret_cast<DType\*>\(weight\.data_ptr\(\)\),\s*vec_hidden_size,\s*eps\);",
                    "launch(kernel, input, residual, weight, vec_hidden_size, eps) without PDL",
                ),
            ),
            dtypes=("fp16", "bf16"),
            supports=_jit_hf_supports,
            attrs={"max_hidden": JIT_HF_MAX_HIDDEN, "hidden_multiple": JIT_HF_HIDDEN_MULTIPLE},
        ),
    ),
    corpus=_corpus(),
    edge_shapes=(
        rmsnorm.ONE_TOKEN,
        Shape((3, 4100), ("edge",), "hidden % 8 == 4 (FlashInfer vec 4; JIT HF unsupported)"),
        rmsnorm.VEC1,
        rmsnorm.SMEM_OPT_IN,
        Shape((16384, 8192), ("edge", "largest"), "llama-70b prefill chunk"),
    ),
    # replaces: the default-mode bindings only; the HF-parity path (cast_x_before_out_mul=True,
    # sglang.srt.layers.layernorm:_jit_fused_add_rmsnorm) rounds differently by design.
    # FlashInfer norm.cuh FusedAddRMSNormKernel, its CuTe-DSL kernel, SGLang JIT fused_add_rmsnorm_reg_kernel,
    # astra's astra_farn:: kernels (not the gemma variant)
    kernel_symbols=(r"(?<!gemma)(?<!gemma_)fused_?add_?rms_?norm", r"astra_farn::"),
    # in context between o_proj and gate_up, and between down_proj and qkv, as a dense decoder runs it
    context_sites=lambda dims: residual_norm_sites(dims[1]),
)
