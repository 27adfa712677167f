"""merge_state: merge two attention partials (v_a, s_a), (v_b, s_b) by their log-sum-exp.

    s   = log(exp(s_a) + exp(s_b))
    v   = v_a * exp(s_a - s) + v_b * exp(s_b - s)

v: [num_tokens, num_heads, head_dim] in the op's dtype; s: [num_tokens, num_heads] fp32.
The ABI's lse is the NATURAL log, the convention of SGLang's merge_state_v2
(sgl-kernel csrc/attention/merge_attn_states.cu: expf / logf; FlashAttention's
softmax_lse). Production (sglang 0.5.23 on CUDA):
  sglang/srt/layers/attention/merge_state.py merge_state -> sgl_kernel.merge_state_v2
    (fp32/fp16/bf16 with head_dim % (16 / sizeof) == 0, else the Triton kernel);
  the FlashInfer backend calls flashinfer.cascade.merge_state (cascade.cuh MergeState,
    lse in BASE 2), falling back to Triton when heads * head_dim / vec > 1024 threads.

Variant "flashinfer" keeps FlashInfer's base-2 convention inside the kernel: its attrs
carry lse_base = 2.0 and the harness converts at the boundary, outside the timed region:
to_variant_abi multiplies s_a, s_b by log2(e) (into new tensors) before the call and
from_variant_abi multiplies s_out by ln(2) after it. ±inf survive the conversion.

Special values: SGLang maps any infinite lse (an empty partial; FA3 reports +inf) to
-inf, so one empty side yields the other side exactly, and two empty sides give NaN
(0/0) in v and s. FlashInfer does not map +inf, and merges two empty sides to v = 0,
s = -inf. The reference takes `semantics` ("sgl_kernel", the op's contract, or
"flashinfer"); each variant names its own in attrs["semantics"].
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.models import MODELS
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
    token_sweep,
    torch_dtype,
)

PAPER = [(512, 32, 256), (512, 40, 128), (768, 32, 256), (512, 64, 128)]
LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

# flashinfer/utils.cuh DISPATCH_HEAD_DIM and cascade.cuh MergeState's block (bdx, heads)
FLASHINFER_HEAD_DIMS = (64, 128, 256, 512)
MAX_THREADS_PER_BLOCK = 1024


def _corpus() -> Tuple[Shape, ...]:
    shapes = [Shape(s, ("paper",), "astra-paper") for s in PAPER]
    for m in MODELS:
        for tp in m.tp:
            h = m.num_heads // tp  # query heads per TP shard
            shapes += token_sweep((h, m.head_dim), f"{m.name} tp{tp}")
    return dedupe_shapes(shapes)


EDGE = (
    Shape((1, 32, 128), ("edge",), "one token"),
    Shape((3, 8, 64), ("edge",), "head_dim 64"),
    Shape((5, 16, 256), ("edge",), "head_dim 256"),
    Shape((7, 4, 96), ("edge",), "head_dim 96 (sgl_kernel only: FlashInfer dispatches 64/128/256/512)"),
    Shape((2, 64, 128), ("edge",), "most heads FlashInfer takes at head_dim 128 (1024 threads)"),
    Shape((16384, 40, 128), ("edge", "largest"), "llama-2-13b prefill chunk"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """v_* ~ N(0, 1) in dtype; s_* natural-log lse in fp32, typical magnitudes ~ log(kv_len).

    dist "large": lse differences up to ~±60 (exp under/overflow), v * 32.
    dist "inf_lse": ±inf lse patterns — a-side empty (-inf), b-side empty, a-side +inf
    (FA3's empty rows), both empty — on separate rows, the rest normal.
    """
    import torch

    t, h, d = dims
    dt = torch_dtype(dtype)
    f32 = dict(device=device, dtype=torch.float32)
    va = torch.randn((t, h, d), generator=gen, **f32)
    vb = torch.randn((t, h, d), generator=gen, **f32)
    sa = 6.0 + 2.0 * torch.randn((t, h), generator=gen, **f32)
    sb = 6.0 + 2.0 * torch.randn((t, h), generator=gen, **f32)
    if dist == "large":
        va, vb = va * 32.0, vb * 32.0
        sa = 20.0 * torch.randn((t, h), generator=gen, **f32)
        sb = 20.0 * torch.randn((t, h), generator=gen, **f32)
    elif dist == "inf_lse":
        inf = float("inf")
        k = torch.randint(0, 8, (t, h), generator=gen, device=device)
        sa = torch.where(k == 1, torch.full_like(sa, -inf), sa)
        sb = torch.where(k == 2, torch.full_like(sb, -inf), sb)
        sa = torch.where(k == 3, torch.full_like(sa, inf), sa)
        sa = torch.where(k == 4, torch.full_like(sa, -inf), sa)
        sb = torch.where(k == 4, torch.full_like(sb, -inf), sb)
    return {
        "v_a": va.to(dt),
        "s_a": sa.contiguous(),
        "v_b": vb.to(dt),
        "s_b": sb.contiguous(),
        "v_out": torch.empty((t, h, d), device=device, dtype=dt),
        "s_out": torch.empty((t, h), device=device, dtype=torch.float32),
    }


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any], semantics: str = "sgl_kernel") -> Dict[str, Any]:
    """fp64 merge, natural-log lse, special values as `semantics` handles them."""
    import torch

    va, vb = inp["v_a"].double(), inp["v_b"].double()
    sa, sb = inp["s_a"].double(), inp["s_b"].double()
    if semantics == "sgl_kernel":
        ninf = torch.full_like(sa, float("-inf"))
        sa = torch.where(torch.isinf(sa), ninf, sa)
        sb = torch.where(torch.isinf(sb), ninf, sb)
        m = torch.maximum(sa, sb)
        ea, eb = torch.exp(sa - m), torch.exp(sb - m)  # both -inf: nan, as in production
        se = ea + eb
        v = va * (ea / se).unsqueeze(-1) + vb * (eb / se).unsqueeze(-1)
        return {"v_out": v, "s_out": torch.log(se) + m}
    if semantics == "flashinfer":
        m = torch.maximum(sa, sb)
        ninf = torch.full_like(sa, float("-inf"))
        # fmaxf(x - m, -inf) turns the nan of inf - inf into -inf, i.e. weight 0
        da, db = sa - m, sb - m
        ea = torch.exp(torch.where(torch.isnan(da), ninf, da))
        eb = torch.exp(torch.where(torch.isnan(db), ninf, db))
        se = ea + eb
        pos = se > 0
        one = torch.ones_like(se)
        a = torch.where(pos, ea / torch.where(pos, se, one), torch.zeros_like(se))
        b = torch.where(pos, eb / torch.where(pos, se, one), torch.zeros_like(se))
        v = va * a.unsqueeze(-1) + vb * b.unsqueeze(-1)
        return {"v_out": v, "s_out": torch.log(se) + m}
    raise ValueError(f"unknown merge_state semantics {semantics!r}")


def bytes_moved(dims, dtype: str) -> int:
    t, h, d = dims
    return 3 * t * h * d * DTYPE_BYTES[dtype] + 3 * t * h * 4  # read 2 v + 2 s, write v + s


def to_variant_abi(tensors: Mapping[str, Any], attrs: Mapping[str, Any]) -> Dict[str, Any]:
    """The tensors to pass to a variant's kernel: base-2 lse inputs for lse_base 2."""
    out = dict(tensors)
    base = float(attrs.get("lse_base", math.e))
    if base == 2.0:
        out["s_a"] = tensors["s_a"] * LOG2E
        out["s_b"] = tensors["s_b"] * LOG2E
    elif abs(base - math.e) > 1e-12:
        raise ValueError(f"unsupported lse base {base}")
    return out


def from_variant_abi(abi_tensors: Mapping[str, Any], tensors: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
    """Bring a variant's outputs back to the op's convention (natural-log s_out), in place."""
    base = float(attrs.get("lse_base", math.e))
    if abi_tensors["v_out"] is not tensors["v_out"]:
        tensors["v_out"].copy_(abi_tensors["v_out"])
    if base == 2.0:
        tensors["s_out"].copy_(abi_tensors["s_out"] * LN2)
    elif abi_tensors["s_out"] is not tensors["s_out"]:
        tensors["s_out"].copy_(abi_tensors["s_out"])


def _sgl_supports(dims, dtype: str) -> Optional[str]:
    d = dims[2]
    pack = 16 // DTYPE_BYTES[dtype]
    if d % pack:
        return f"head_dim {d} % {pack} != 0: SGLang routes it to the Triton merge_state"
    return None


def _fi_supports(dims, dtype: str) -> Optional[str]:
    _, h, d = dims
    if dtype not in ("fp16", "bf16"):
        return f"{dtype}: flashinfer.cascade.merge_state dispatches fp16/bf16 only"
    if d not in FLASHINFER_HEAD_DIMS:
        return f"head_dim {d}: FlashInfer dispatches {FLASHINFER_HEAD_DIMS}"
    vec = max(16 // DTYPE_BYTES[dtype], d // 32)
    if h * (d // vec) > MAX_THREADS_PER_BLOCK:
        return f"{h} heads x {d // vec} threads > {MAX_THREADS_PER_BLOCK}: SGLang's FlashInfer backend uses Triton"
    return None


def _default_variant(roots: Mapping[str, bool]) -> str:
    return "sgl_kernel" if roots.get("sglang_checkout") else "flashinfer"


_MAS = "sgl-kernel/csrc/attention/merge_attn_states.cu"
_CASCADE = "flashinfer/attention/cascade.cuh"

SPEC = OpSpec(
    name="merge_state",
    summary="merge two attention partials by their (natural-log) log-sum-exp",
    dim_names=("num_tokens", "num_heads", "head_dim"),
    abi=(
        AbiArg("v_a", "ptr", "in"),
        AbiArg("s_a", "ptr", "in"),
        AbiArg("v_b", "ptr", "in"),
        AbiArg("s_b", "ptr", "in"),
        AbiArg("v_out", "ptr", "out"),
        AbiArg("s_out", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("num_heads", "i64"),
        AbiArg("head_dim", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="sgl_kernel",
            description="sgl-kernel merge_attn_states_kernel (what sgl_kernel.merge_state_v2 runs)",
            provenance="sglang/srt/layers/attention/merge_state.py -> sgl_kernel.merge_state_v2 -> sgl-kernel "
            "csrc/attention/merge_attn_states.cu merge_attn_states_launcher<T>: merge_attn_states_kernel<T, 128>, "
            "one thread per 16-byte pack, grid ceil(tokens*heads*head_dim/pack / 128), no PDL; lse natural log, "
            "[tokens, heads]",
            sources=(),
            excerpts=(
                Excerpt(
                    SourceFile("sglang_checkout", _MAS),
                    start=r"^inline __device__ float to_float\(float u\)",
                    end=r"output_lse\[token_idx \* num_heads \+ head_idx\] = out_lse;\s*\}\s*\}\n",
                    header="merge_attn_states_kernel.cuh",
                    meaning="to_float/from_float and merge_attn_states_kernel (the .cu's host code needs torch)",
                ),
            ),
            launcher="launch_sgl_kernel.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=(
                (
                    _MAS,
                    r"^  float p_lse = prefix_lse\[token_idx \* num_heads \+ head_idx\];",
                    "lse layout [num_tokens, num_heads]",
                ),
                (
                    _MAS,
                    r"p_lse = std::isinf\(p_lse\) \? -std::numeric_limits<float>::infinity\(\) : p_lse;",
                    "any infinite lse is treated as -inf (an empty partial)",
                ),
                (_MAS, r"constexpr uint NUM_THREADS = (?P<NUM_THREADS>\d+);", "threads per block"),
                (
                    _MAS,
                    r"const uint pack_size = 16 / sizeof\(scalar_t\);\s*SGL_TORCH_CHECK\(head_size % pack_size == 0|"
                    r"const uint pack_size = 16 / sizeof\(scalar_t\);\s*TORCH_CHECK\(head_size % pack_size == 0",
                    "one 16-byte pack per thread; head_size must be a multiple of the pack",
                ),
                (
                    _MAS,
                    r"dim3 grid\(\(total_threads \+ NUM_THREADS - 1\) / NUM_THREADS\);",
                    "grid = ceil(tokens * heads * head_dim / pack / NUM_THREADS)",
                ),
                (
                    _MAS,
                    r"merge_attn_states_kernel<scalar_t, NUM_THREADS><<<grid, block, 0, stream>>>",
                    "plain <<<>>> launch on the current stream (no PDL)",
                ),
            ),
            dtypes=("fp16", "bf16", "fp32"),
            requires_root="sglang_checkout",
            supports=_sgl_supports,
            attrs={"lse_base": math.e, "semantics": "sgl_kernel"},
        ),
        Variant(
            name="flashinfer",
            description="FlashInfer cascade MergeState (SGLang's FlashInfer attention backend; base-2 lse)",
            provenance="sglang/srt/layers/attention/flashinfer_backend.py _safe_merge_state -> "
            "flashinfer.cascade.merge_state -> flashinfer/attention/cascade.cuh MergeState: grid tokens, "
            "block (head_dim / vec, heads), vec = max(16 / sizeof(T), head_dim / 32); lse base 2",
            sources=(SourceFile("flashinfer", _CASCADE),),
            launcher="launch_flashinfer.cu.in",
            flag_profile="flashinfer_jit",
            source_facts=(
                (
                    _CASCADE,
                    r"cudaError_t MergeState\(DTypeIn\* v_a, float\* s_a, DTypeIn\* v_b, float\* s_b, DTypeO\* v_merged,"
                    r"\s*float\* s_merged, uint32_t seq_len, uint32_t num_heads, uint32_t head_dim,"
                    r"\s*cudaStream_t stream = nullptr\)",
                    "MergeState(v_a, s_a, v_b, s_b, v_merged, s_merged, seq_len, num_heads, head_dim, stream)",
                ),
                (
                    _CASCADE,
                    r"constexpr uint32_t vec_size = std::max\(16U / sizeof\(DTypeIn\), HEAD_DIM / 32U\);\s*"
                    r"uint32_t bdx = HEAD_DIM / vec_size;\s*uint32_t bdy = num_heads;",
                    "block = (head_dim / vec, num_heads): heads * bdx must be <= 1024",
                ),
                (_CASCADE, r"ptx_exp2\(", "lse in base 2"),
            ),
            dtypes=("fp16", "bf16"),
            supports=_fi_supports,
            attrs={"lse_base": 2.0, "semantics": "flashinfer"},
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
    distributions=("normal", "large", "inf_lse"),
    replaces=(
        "sgl_kernel:merge_state_v2",
        "sgl_kernel.attention:merge_state_v2",
        "sglang.srt.layers.attention.merge_state:merge_state_v2",
        "sglang.srt.layers.attention.flashattention_backend:merge_state_v2",
    ),
    # sgl_kernel merge_state_v2 / FlashInfer cascade MergeStateKernel, astra's astra_merge:: kernel
    kernel_symbols=(r"merge_?state", r"astra_merge::"),
    to_variant_abi=to_variant_abi,
    from_variant_abi=from_variant_abi,
)
