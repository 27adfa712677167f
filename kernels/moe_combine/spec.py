"""moe_combine: the MoE combine, out[t, :] = routed_scaling_factor * sum_k input[t, k, :].

input is fused_moe's intermediate_cache3 [tokens, topk, hidden]: the down GEMM already multiplied each expert
output by its router weight (invoke_fused_moe_kernel(..., mul_routed_weight = not apply_router_weight_on_input
and not no_combine)), so the combine is a plain sum over topk and one scale. output is [tokens, hidden]. hidden is
never TP-sharded here: the down GEMM writes full rows (the all-reduce comes after).

What SGLang runs on CUDA (sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py, fused_experts_impl's end):
  topk == 2 and scale 1      torch.add(cache3[:, 0], cache3[:, 1], out=out)         (Mixtral; not patchable)
  tokens <= 32               0.5.17: moe_sum_reduce_torch_compile (torch.compile'd sum + mul_: one Inductor
                             Triton kernel, triton_per_fused_copy__mul_sum_0); 0.5.23 on PDL archs (sm_90+):
                             moe_sum_reduce_triton (sglang.kernels.ops.moe.fused_moe_triton_kernels)
  otherwise                  sgl_kernel.moe_sum_reduce (sgl-kernel csrc/moe/moe_sum_reduce.cu)
Also sgl_kernel.moe_sum_reduce: fused_marlin_moe (wna16), paged experts (0.5.23); the JIT moe_topk_sum (bf16,
scale 1) in fused_marlin_moe.

Variants: "sgl_kernel" (the CUDA kernel above > 32 tokens; its csrc exists only in a git checkout, extract copies
the device part at run time) and "jit_topk_sum" (SGLang's JIT TopkSumKernel, csrc/moe/topk_sum.cuh in the wheel:
bf16, scale 1 only; the default when no checkout is given). The torch.compile / Triton paths cannot be extracted:
`bench --baseline installed` times them (spec.replaces lists moe_sum_reduce_torch_compile first). "installed" needs
no checkout: production is the installed `sgl_kernel.moe_sum_reduce` itself (the wheel's binary, through torch), for
the rows fused_moe hands it (more than 32 tokens, topk other than 2 at scale 1): the prefill corpus.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.sites import Site, moe_output_sites
from astra_sglang.spec import (
    DTYPE_BYTES,
    AbiArg,
    Excerpt,
    OpSpec,
    Shape,
    SourceFile,
    Tolerance,
    Variant,
    dedupe_shapes,
)

# MoE configs (config.json): name, hidden, topk, routed_scaling_factor SGLang's runner applies in the combine.
MOE_MODELS: Tuple[Tuple[str, int, int, float], ...] = (
    ("qwen3-30b-a3b", 2048, 8, 1.0),
    ("qwen3-235b-a22b", 4096, 8, 1.0),
    ("deepseek-v3", 7168, 8, 2.5),
    ("deepseek-v3 shared expert fused", 7168, 9, 2.5),  # num_fused_shared_experts = 1: topk 8 + 1
    ("gpt-oss", 2880, 4, 1.0),
    ("mixtral-8x7b", 4096, 2, 1.0),  # SGLang: torch.add (topk 2, scale 1), not moe_sum_reduce
)
DECODE = (1, 8, 32, 64, 256)  # 32: last torch.compile batch; 64/256: sgl_kernel's small-token kernel
PREFILL = (1024, 4096, 16384)  # > 256 tokens: sgl_kernel's warp-per-token kernels (bf16: the vector one)
COMPILE_MAX_TOKENS = 32  # fused_moe._use_moe_sum_reduce_torch_compile: num_tokens <= 32

# routed_scaling_factor by (topk, hidden): the harness's scalars depend on the shape alone
SCALE: Dict[Tuple[int, int], float] = {(k, h): s for _, h, k, s in MOE_MODELS}


def route(dims) -> str:
    """Which SGLang 0.5.17 path serves this shape on CUDA: torch_add | torch_compile | sgl_kernel."""
    t, k, h = dims
    if k == 2 and scale_of(dims) == 1.0:
        return "torch_add"
    return "torch_compile" if t <= COMPILE_MAX_TOKENS else "sgl_kernel"


def scale_of(dims) -> float:
    return SCALE.get((int(dims[1]), int(dims[2])), 1.0)


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, h, k, _ in MOE_MODELS:
        for t in DECODE + PREFILL:
            d = (t, k, h)
            shapes.append(Shape(d, ("decode" if t in DECODE else "prefill", route(d)), name))
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 1, 2048), ("edge",), "topk 1"),
    Shape((3, 6, 2048), ("edge",), "topk 6 (general-topk kernels)"),
    Shape((5, 8, 1000), ("edge",), "hidden % 8 == 0, % 16 != 0"),
    Shape((7, 4, 1001), ("edge",), "odd hidden (scalar path)"),
    Shape((33, 8, 2048), ("edge",), "first sgl_kernel batch"),
    Shape((129, 9, 7168), ("edge",), "warp-per-token kernels (> 128 tokens), scale 2.5"),
    Shape((300, 8, 2056), ("edge",), "bf16 > 256 tokens, hidden % 16 == 8: sgl_kernel's vector path drops the tail"),
    Shape((16384, 9, 7168), ("edge", "largest"), "deepseek-v3 prefill chunk, shared expert fused"),
)


def context_sites(dims) -> Tuple[Site, ...]:
    """bench --sites serving: the experts' down GEMM before, astra's norm and the next layer's qkv GEMM after, for the
    Qwen3-MoE rows (sites.moe_output_sites); the other rows keep bench's generic pair."""
    name = next((n for n, h, k, _ in MOE_MODELS if (k, h) == (int(dims[1]), int(dims[2]))), "")
    return moe_output_sites(name)


def scalars(dims) -> Dict[str, Any]:
    return {"routed_scaling_factor": scale_of(dims)}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """input: router-weighted expert outputs, ~N(0, 0.5). dist "large": x 64 (fp16 sums near 10^3);
    "cancel": expert 1 = -expert 0 + small, so the sum's order of accumulation shows."""
    import torch

    from astra_sglang.spec import torch_dtype

    t, k, h = dims
    x = 0.5 * torch.randn((t, k, h), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        x = x * 64.0
    elif dist == "cancel" and k >= 2:
        x[:, 1] = -x[:, 0] * 32.0 + 1e-2 * x[:, 1]
        x[:, 0] = x[:, 0] * 32.0
    dt = torch_dtype(dtype)
    return {"input": x.to(dt), "output": torch.empty((t, h), device=device, dtype=dt)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    s = float(scalars.get("routed_scaling_factor", 1.0))
    return {"output": inp["input"].double().sum(dim=1) * s}


def bytes_moved(dims, dtype: str) -> int:
    t, k, h = dims
    return t * h * (k + 1) * DTYPE_BYTES[dtype]  # read topk rows, write one


def _sgl_supports(dims, dtype: str) -> Optional[str]:
    t, k, h = dims
    if dtype == "bf16" and t > 256 and h % 8 == 0 and h % 16:
        return ("sgl_kernel's bf16 vector kernel (> 256 tokens) sums 16 columns per lane over hidden // 16 chunks: "
                f"the last {h % 16} columns of hidden {h} are never written")
    return None


def _jit_supports(dims, dtype: str) -> Optional[str]:
    t, k, h = dims
    if dtype != "bf16":
        return f"{dtype}: the JIT TopkSumKernel is bf16 only"
    if h % 8:
        return f"hidden {h} % 8 != 0: the JIT TopkSumKernel loads 8-element vectors"
    if scale_of(dims) != 1.0:
        return f"routed_scaling_factor {scale_of(dims)}: the JIT TopkSumKernel has no scale"
    return None


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "sgl_kernel" if roots.get("sglang_checkout") else "jit_topk_sum"


def _installed_supports(dims, dtype: str) -> Optional[str]:
    """The rows fused_moe hands sgl_kernel.moe_sum_reduce on CUDA (route()), which the installed variant times."""
    r = route(dims)
    if r == "torch_add":
        return "topk 2 at scale 1: fused_moe adds the two rows with torch.add, not sgl_kernel.moe_sum_reduce"
    if r == "torch_compile":
        return (f"<= {COMPILE_MAX_TOKENS} tokens: fused_moe runs its torch.compile'd (0.5.17) or Triton (0.5.23, "
                "sm_90+) sum there, not sgl_kernel.moe_sum_reduce (the jit_topk_sum workspace with --baseline "
                "installed times that route)")
    return _sgl_supports(dims, dtype)


_MSR = "sgl-kernel/csrc/moe/moe_sum_reduce.cu"
_FUSED_MOE = "srt/layers/moe/moe_runner/triton_utils/fused_moe.py"
_TOPK_SUM = "csrc/moe/topk_sum.cuh"

SPEC = OpSpec(
    name="moe_combine",
    summary="MoE combine: routed_scaling_factor * sum over topk of the router-weighted expert outputs",
    dim_names=("num_tokens", "topk", "hidden"),
    abi=(
        AbiArg("input", "ptr", "in"),
        AbiArg("output", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("topk", "i64"),
        AbiArg("hidden", "i64"),
        AbiArg("routed_scaling_factor", "f64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="sgl_kernel",
            description="sgl-kernel moe_sum_reduce (what fused_moe runs above 32 tokens on CUDA)",
            provenance="fused_moe.py fused_experts_impl -> sgl_kernel.moe_sum_reduce -> sgl-kernel "
            "csrc/moe/moe_sum_reduce.cu moe_sum_reduce: bf16 > 256 tokens, hidden % 8 == 0: "
            "moe_sum_reduce_warp_per_token_vec_kernel<8>; <= 128 tokens: moe_sum_reduce_kernel<T, topk> "
            "(topk 2/4/8/9, else moe_sum_reduce_kernel_general), 256-thread blocks, grid (hidden/256, tokens); "
            "else moe_sum_reduce_kernel_warp_token_topk<T, topk, 4> / _general; fp32 accumulation, no PDL",
            sources=(),
            excerpts=(
                Excerpt(
                    SourceFile("sglang_checkout", _MSR),
                    start=r"^template <typename T>\s*\n__device__ __forceinline__ opmath_t<T> to_acc\(T x\)",
                    end=r"moe_sum_reduce_kernel_warp_token_general\(.*?\n\}\n",
                    header="moe_sum_reduce_kernels.cuh",
                    meaning="to_acc/from_acc, ldg_cg, Pack16B and the moe_sum_reduce kernels (the .cu's host code "
                    "needs torch)",
                ),
            ),
            launcher="launch_sgl_kernel.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    _MSR,
                    r"fast_bf16_vec_ok =\s*\(input\.scalar_type\(\) == (?:at::kBFloat16|ScalarType::BFloat16)\) && "
                    r"\(token_num > (?P<VEC_MIN_TOKENS>\d+)\) && \(hidden_dim % 8 == 0\);",
                    "bf16 vector path: bf16, more than VEC_MIN_TOKENS tokens, hidden % 8 == 0",
                ),
                (
                    _MSR,
                    r"constexpr int WARPS_PER_BLOCK = (?P<VEC_WARPS>\d+);\s*constexpr int THREADS = WARPS_PER_BLOCK \* 32;"
                    r"\s*const int64_t n_chunks = hidden_dim / 8;\s*int64_t grid_x = \(n_chunks \+ 32 - 1\) / 32;",
                    "bf16 vector path: VEC_WARPS warps per block, grid x = ceil(hidden / 8 / 32)",
                ),
                (
                    _MSR,
                    r"per_token_use_one_warp = \(token_num > (?P<WARP_MIN_TOKENS>\d+)\);",
                    "warp-per-token kernels above WARP_MIN_TOKENS tokens, small-token kernels below",
                ),
                (
                    _MSR,
                    r"const int block_size = (?P<SMALL_BLOCK>\d+);\s*int64_t grid_x = \(hidden_dim \+ block_size - 1\) "
                    r"/ block_size;",
                    "small-token kernels: SMALL_BLOCK threads, grid (ceil(hidden / SMALL_BLOCK), tokens)",
                ),
                (
                    _MSR,
                    r"constexpr int WARPS_PER_BLOCK = (?P<WARP_WARPS>\d+);\s*constexpr int THREADS = WARPS_PER_BLOCK \* 32;"
                    r"\s*int64_t gx = \(hidden_dim \+ 32 - 1\) / 32;",
                    "warp-per-token kernels: WARP_WARPS warps per block, grid x = ceil(hidden / 32)",
                ),
                (
                    _MSR,
                    r"case 2:\s*LAUNCH_SMALL_TOKEN_KERNEL\(2\);\s*break;\s*case 4:\s*LAUNCH_SMALL_TOKEN_KERNEL\(4\);\s*"
                    r"break;\s*case 8:\s*LAUNCH_SMALL_TOKEN_KERNEL\(8\);\s*break;\s*case 9:\s*"
                    r"LAUNCH_SMALL_TOKEN_KERNEL\(9\);",
                    "compile-time topk instantiations 2, 4, 8, 9 (others: the general kernels)",
                ),
            ),
            dtypes=("fp16", "bf16", "fp32"),
            requires_root="sglang_checkout",
            supports=_sgl_supports,
        ),
        Variant(
            name="jit_topk_sum",
            description="SGLang JIT TopkSumKernel (fused_marlin_moe's bf16 top-k sum; scale 1 only)",
            provenance="sglang/kernels/ops/moe/moe_topk_sum.py moe_topk_sum -> csrc/moe/topk_sum.cuh "
            "TopkSumKernel<256, pdl>::run: topk_sum_kernel, one thread per 8-element bf16 vector, grid "
            "(ceil(hidden / 8 / 256), tokens), PDL on sm_90+",
            sources=(SourceFile("sglang_jit", _TOPK_SUM),),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit_topk_sum.cu.in",
            flag_profile="sglang_jit",
            # moe_topk_sum.py: load_jit(..., extra_cuda_cflags=["-O3", "--use_fast_math"])
            extra_flags=("-O3", "--use_fast_math"),
            source_facts=(
                (
                    _TOPK_SUM,
                    r"struct TopkSumParams \{\s*const bf16_t\* __restrict__ in;[^\n]*\s*bf16_t\* __restrict__ out;"
                    r"[^\n]*\s*uint32_t K;\s*uint32_t topk;\s*\};",
                    "TopkSumParams {in, out, K, topk}, in the order the launcher sets them",
                ),
                (
                    _TOPK_SUM,
                    r"template <int kThreads, bool kUsePDL>\s*__global__ void topk_sum_kernel\(",
                    "topk_sum_kernel<kThreads, kUsePDL>",
                ),
                (
                    _TOPK_SUM,
                    r"dim3 grid\(\(n_vecs \+ kThreads - 1\) / kThreads, M\);",
                    "grid (ceil(hidden / 8 / kThreads), tokens)",
                ),
            ),
            dtypes=("bf16",),
            supports=_jit_supports,
        ),
        Variant(
            name="installed",
            description="SGLang's installed sgl_kernel.moe_sum_reduce (the wheel's binary; what fused_moe runs above "
            "32 tokens on CUDA), no checkout needed",
            provenance="fused_moe.py fused_experts_impl -> sgl_kernel.moe_sum_reduce (sglang-kernel's compiled "
            "csrc/moe/moe_sum_reduce.cu), called through torch as SGLang calls it",
            sources=(),
            launcher="",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (_FUSED_MOE, r"^if _is_cuda:\s*from sgl_kernel import moe_sum_reduce$",
                 "on CUDA, fused_moe's moe_sum_reduce is sgl_kernel's"),
                (_FUSED_MOE, r"def _use_moe_sum_reduce_torch_compile\(num_tokens: int\) -> bool:\s*"
                             r"return num_tokens <= (?P<COMPILE_MAX_TOKENS>\d+) and not is_batch_invariant_mode_enabled",
                 "calls of more than COMPILE_MAX_TOKENS tokens leave the torch.compile / Triton sum"),
                (_FUSED_MOE, r"elif topk == 2 and routed_scaling_factor == 1\.0:\s*torch\.add\([\s\S]{0,200}?\s*else:"
                             r"\s*# According to micro benchmark results[^\n]*\s*"
                             r"if _use_moe_sum_reduce_torch_compile\(num_tokens\):[\s\S]{0,600}?\s*else:\s*"
                             r"moe_sum_reduce\(\s*intermediate_cache3\.view\(\*intermediate_cache3\.shape\),\s*"
                             r"out_hidden_states,\s*routed_scaling_factor,\s*\)",
                 "CUDA's combine: topk 2 at scale 1 is a torch.add, else above the compile bound "
                 "moe_sum_reduce(cache3 [tokens, topk, hidden], out [tokens, hidden], routed_scaling_factor)"),
            ),
            dtypes=("fp16", "bf16", "fp32"),
            requires_root="sglang_py",
            supports=_installed_supports,
            callable="sgl_kernel:moe_sum_reduce",
        ),
    ),
    default_variant=_default_variant,
    dtypes=("fp16", "bf16", "fp32"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    context_sites=context_sites,
    # fp32 cases the installed sgl_kernel route does not take (<= 32 tokens, topk 2 at scale 1) have no production
    # error to scale: a 9-term fp32 sum errs 1.07e-5 there (H200, 2026-12-02), over the 1e-5 floor, and production's
    # own fp32 error reached 2.76e-5 on the rows it takes (16384 x 9 x 7168): 2x that judges them alone
    tolerance=Tolerance(k=2.0, alone={"fp32": 6e-5}),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "cancel"),
    # The first installed entry is what `bench --baseline installed` times: 0.5.17's decode path (<= 32 tokens).
    replaces=(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:moe_sum_reduce_torch_compile",
        "sgl_kernel:moe_sum_reduce",
        "sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton",
    ),
    # Inductor's fused sum+mul (0.5.17 <= 32 tokens), the Triton _moe_sum_reduce_kernel (0.5.23), sgl-kernel's
    # moe_sum_reduce_* kernels, the JIT topk_sum_kernel, astra's astra_moec:: kernel
    kernel_symbols=(r"triton_\w*fused_copy__mul_sum", r"moe_sum_reduce", r"topk_sum_kernel", r"astra_moec::"),
)
