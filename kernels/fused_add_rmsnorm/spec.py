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

from typing import Any, Dict, Mapping, Optional, Tuple

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
EPS = 1e-6  # SGLang's RMSNorm default (model configs use 1e-5 or 1e-6)

# JIT HF-parity kernel limits: sglang/kernels/ops/layernorm/norm.py
# is_supported_jit_fused_add_rmsnorm_hidden_size (callers route other sizes to torch).
JIT_HF_MAX_HIDDEN = 8192
JIT_HF_HIDDEN_MULTIPLE = 16


def _corpus() -> Tuple[Shape, ...]:
    shapes = [Shape(s, ("paper",), "astra-paper") for s in PAPER]
    for m in MODELS:
        # RMSNorm runs on the full (replicated) hidden state: TP does not shard it.
        widths = [(m.hidden, f"{m.name} hidden")]
        widths += [(w, f"{m.name} MLA lora-rank norm") for w in m.extra_norm_widths]
        for h, src in widths:
            shapes += token_sweep((h,), src)
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 4096), ("edge",), "one token"),
    Shape((3, 4100), ("edge",), "hidden % 8 == 4 (FlashInfer vec 4; JIT HF unsupported)"),
    Shape((5, 1001), ("edge",), "odd hidden (FlashInfer vec 1)"),
    Shape((2, 16384), ("edge",), "widest hidden: FlashInfer smem > 48 KB (opt-in)"),
    Shape((16384, 8192), ("edge", "largest"), "llama-70b prefill chunk"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, h = dims
    dt = torch_dtype(dtype)
    x = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    r = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    w = 1.0 + 0.25 * torch.randn((h,), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        # residual streams grow through the layers: large sums of squares, outliers
        x = x * 64.0
        r = r * 64.0
        idx = torch.randint(0, h, (t, max(1, h // 512)), generator=gen, device=device)
        r.scatter_(1, idx, 2000.0)
    elif dist == "uniform":
        x = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
        r = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
    return {"input": x.to(dt), "residual": r.to(dt), "weight": w.to(dt)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64: residual' = input + residual; input' = residual' / rms(residual') * weight."""
    import torch

    x = inp["input"].double()
    r = inp["residual"].double()
    w = inp["weight"].double()
    s = x + r
    rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + float(scalars.get("eps", EPS)))
    return {"input": s * rms * w, "residual": s}


def bytes_moved(dims, dtype: str) -> int:
    t, h = dims
    e = DTYPE_BYTES[dtype]
    return (4 * t * h + h) * e  # read input, residual, weight; write input, residual


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


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "flashinfer"


_NORM = "flashinfer/norm.cuh"
_JIT = "csrc/elementwise/fused_add_rmsnorm.cuh"

SPEC = OpSpec(
    name="fused_add_rmsnorm",
    summary="residual += input; input = rmsnorm(residual) * weight (both in place)",
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
            description="FlashInfer FusedAddRMSNorm CUDA kernel with sgl-kernel's host code and AOT flags",
            provenance="sgl_kernel.fused_add_rmsnorm -> sgl-kernel csrc/elementwise/fused_add_rms_norm_kernel.cu "
            "sgl_fused_add_rmsnorm -> flashinfer/norm.cuh norm::FusedAddRMSNorm(input, residual, weight, "
            "batch, hidden, stride=hidden, stride=hidden, eps, enable_pdl=is_arch_support_pdl(), stream) "
            "(fp16/bf16 eager calls in flashinfer 0.7.2 run its CuTe-DSL kernel instead; this CUDA kernel is "
            "that path's FLASHINFER_USE_CUDA_NORM=1 / torch.compile / fp32 form)",
            sources=(SourceFile("flashinfer", _NORM),),
            launcher="launch_flashinfer.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    _NORM,
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
    default_variant=_default_variant,
    dtypes=("fp16", "bf16", "fp32"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0),
    make_inputs=make_inputs,
    reference=reference,
    scalars=lambda dims: {"eps": EPS},
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "uniform"),
    # The default-mode bindings only: the HF-parity path (cast_x_before_out_mul=True,
    # sglang.srt.layers.layernorm:_jit_fused_add_rmsnorm) rounds differently by design.
    replaces=(
        "sgl_kernel:fused_add_rmsnorm",
        "sgl_kernel.elementwise:fused_add_rmsnorm",
        "sglang.srt.layers.layernorm:fused_add_rmsnorm",
        "flashinfer.norm:fused_add_rmsnorm",
    ),
    # FlashInfer norm.cuh FusedAddRMSNormKernel, its CuTe-DSL kernel, SGLang JIT fused_add_rmsnorm_reg_kernel,
    # astra's astra_farn:: kernels (not the gemma variant)
    kernel_symbols=(r"(?<!gemma)(?<!gemma_)fused_?add_?rms_?norm", r"astra_farn::"),
)
