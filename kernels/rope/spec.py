"""rope: rotary position embedding of q and k, in place (SGLang's JIT fused_rope_kernel).

For each token t at position p = positions[t] and each q and k head, the first rope_dim columns rotate by
the angles of row p of cos_sin_cache ([max_position, rope_dim] fp32: cos in the first half, sin in the second):
  NeoX style (is_neox=1):  x = h[i], y = h[i + r/2]      -> (x cos_i - y sin_i, x sin_i + y cos_i), i < r/2
  GPT-J style (is_neox=0): x = h[2i], y = h[2i + 1]      -> same, i < r/2
Columns past rope_dim (partial rotary) are left alone. q and k are the q/k column blocks of the qkv output:
token rows q_stride / k_stride elements apart, heads head_size apart.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.models import DECODE_TOKENS, PREFILL_TOKENS
from astra_sglang.spec import (
    DTYPE_BYTES,
    AbiArg,
    OpSpec,
    Shape,
    SourceFile,
    Tolerance,
    Variant,
    dedupe_shapes,
)

ROPE_DIMS = (32, 64, 128, 256)  # rope_dim instantiations the launchers carry
MAX_POSITION = 8192  # cos_sin_cache rows in the harness (positions drawn below it)

# Models whose attention runs RotaryEmbedding.forward_cuda without the fused KV store (config.json):
# name, q heads, kv heads, head_dim, TP degrees. KV heads are replicated past TP = kv heads.
# (Qwen3-MoE and gpt-oss take the fused rope + KV store path on a bf16 KV cache instead.)
ROPE_MODELS: Tuple[Tuple[str, int, int, int, Tuple[int, ...]], ...] = (
    ("llama-3-8b", 32, 8, 128, (1, 2)),
    ("llama-3-70b", 64, 8, 128, (4, 8)),
    ("qwen3-8b", 32, 8, 128, (1,)),
    ("qwen3-32b", 64, 8, 128, (2, 4)),
    ("qwen2.5-7b", 28, 4, 128, (1,)),
)


def _dims(t: int, hq: int, hk: int, d: int, rope: Optional[int] = None) -> Tuple[int, ...]:
    stride = (hq + 2 * hk) * d  # q and k are column blocks of the fused qkv output
    return (t, hq, hk, d, rope or d, stride, stride)


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, hq, hk, d, tps in ROPE_MODELS:
        for tp in tps:
            q, k = hq // tp, max(1, hk // tp)
            src = f"{name} tp{tp}"
            shapes += [Shape(_dims(t, q, k, d), ("decode",), src) for t in DECODE_TOKENS]
            shapes += [Shape(_dims(t, q, k, d), ("prefill",), src) for t in PREFILL_TOKENS]
    return dedupe_shapes(shapes)


# GPT-J (interleaved) style shapes: the harness runs them with is_neox = 0.
_GPTJ = {(5, 16, 1, 64, 64, 1152, 1152), (3, 8, 2, 128, 128, 1536, 1536)}

EDGE = (
    Shape((1, 1, 1, 128, 128, 384, 384), ("edge",), "one q head, one kv head"),
    Shape((7, 8, 2, 128, 64, 1536, 1536), ("edge",), "partial rotary: rope_dim 64 of head 128"),
    Shape((5, 16, 1, 64, 64, 1152, 1152), ("edge",), "GPT-J (interleaved) style, head 64"),
    Shape((3, 8, 2, 128, 128, 1536, 1536), ("edge",), "GPT-J (interleaved) style, head 128"),
    Shape((9, 4, 4, 256, 256, 3072, 3072), ("edge",), "head_dim 256"),
    Shape((11, 8, 2, 128, 128, 1024, 256), ("edge",), "contiguous q and k (separate tensors)"),
)


def scalars(dims) -> Dict[str, Any]:
    return {"is_neox": 0 if tuple(dims) in _GPTJ else 1}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import math

    import torch

    from astra_sglang.spec import torch_dtype

    t, hq, hk, d, r, qs, ks = dims
    dt = torch_dtype(dtype)
    scale = 16.0 if dist == "large" else 1.0
    q = (torch.randn((t, qs), generator=gen, device=device) * scale).to(dt)
    k = (torch.randn((t, ks), generator=gen, device=device) * scale).to(dt)
    # SGLang's cache: cos/sin of position * inv_freq (base 1e6, Qwen3's rope_theta)
    inv = 1.0 / (1e6 ** (torch.arange(0, r, 2, device=device, dtype=torch.float64) / r))
    ang = torch.arange(MAX_POSITION, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    if dist == "uniform":  # any fp32 cache, not only unit-circle pairs
        cache = torch.rand((MAX_POSITION, r), generator=gen, device=device) * 2 - 1
    pos = torch.randint(0, MAX_POSITION, (t,), generator=gen, device=device, dtype=torch.int64)
    if t > 1:
        pos[-1] = MAX_POSITION - 1  # the last cache row
    del math
    return {"q": q, "k": k, "cos_sin_cache": cache, "positions": pos}


def _rotate(x, heads: int, d: int, r: int, cos, sin, neox: bool):
    """x: [tokens, >= heads * d]; rotate the first r columns of every head."""
    t = x.shape[0]
    out = x.clone()
    h = out[:, : heads * d].reshape(t, heads, d).clone()
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = h[..., : r // 2].clone(), h[..., r // 2 : r].clone()
        h[..., : r // 2] = a * c - b * s
        h[..., r // 2 : r] = a * s + b * c
    else:
        a, b = h[..., 0:r:2].clone(), h[..., 1:r:2].clone()
        h[..., 0:r:2] = a * c - b * s
        h[..., 1:r:2] = a * s + b * c
    out[:, : heads * d] = h.reshape(t, heads * d)
    return out


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    # works on the harness's [tokens, stride] buffers and on the patch's [tokens, heads, rope_dim] views
    _, hq, hk, d, r = dims[:5]
    neox = bool(int(scalars.get("is_neox", 1)))
    q, k = inp["q"].double(), inp["k"].double()
    pos = inp["positions"].long()
    cache = inp["cos_sin_cache"].double()[pos]
    cos, sin = cache[:, : r // 2], cache[:, r // 2 : r]
    # a patch view [T, H, r] of heads d apart arrives here as a contiguous [T, H, r] copy
    dq = d if q.dim() == 2 else q.shape[-1]
    dk = d if k.dim() == 2 else k.shape[-1]
    qo = _rotate(q.reshape(q.shape[0], -1), hq, dq, r, cos, sin, neox).reshape(q.shape)
    ko = _rotate(k.reshape(k.shape[0], -1), hk, dk, r, cos, sin, neox).reshape(k.shape)
    return {"q": qo, "k": ko}


def bytes_moved(dims, dtype: str) -> int:
    t, hq, hk, d, r = dims[:5]
    return 2 * t * (hq + hk) * r * DTYPE_BYTES[dtype] + t * (8 + r * 4)  # q/k rotated part r+w, positions, cache rows


def _supports(dims, dtype: str) -> Optional[str]:
    t, hq, hk, d, r, qs, ks = dims
    if r not in ROPE_DIMS:
        return f"rope_dim {r} (the launcher instantiates {ROPE_DIMS})"
    if r > d or qs < hq * d or ks < hk * d:
        return "rope_dim past the head, or a row stride shorter than its heads"
    return None


SPEC = OpSpec(
    name="rope",
    summary="rotary embedding of q and k in place (NeoX or GPT-J style), cos/sin rows from an fp32 cache",
    dim_names=("num_tokens", "num_q_heads", "num_kv_heads", "head_size", "rope_dim", "q_stride", "k_stride"),
    abi=(
        AbiArg("q", "ptr", "inout"),
        AbiArg("k", "ptr", "inout"),
        AbiArg("cos_sin_cache", "ptr", "in"),
        AbiArg("positions", "ptr", "in"),
        AbiArg("num_tokens", "i64"),
        AbiArg("num_q_heads", "i64"),
        AbiArg("num_kv_heads", "i64"),
        AbiArg("head_size", "i64"),
        AbiArg("rope_dim", "i64"),
        AbiArg("q_stride", "i64"),
        AbiArg("k_stride", "i64"),
        AbiArg("is_neox", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="jit",
            description="SGLang JIT FusedRopeKernel::run (fused_rope_kernel), int64 positions",
            provenance="sglang/kernels/ops/attention/rope.py apply_rope_with_cos_sin_cache_inplace -> apply_rope_inplace "
            "-> _jit_fused_rope_module(is_neox, rope_dim, dtype, q_dtype).run_rope -> csrc/elementwise/rope.cuh "
            "FusedRopeKernel<is_neox, rope_dim, pdl, T>::run (called from sglang/srt/layers/rotary_embedding/"
            "base.py RotaryEmbedding.forward_cuda)",
            sources=(SourceFile("sglang_jit", "csrc/elementwise/rope.cuh"),),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit.cu.in",
            flag_profile="sglang_jit",
            source_facts=(
                (
                    "csrc/elementwise/rope.cuh",
                    r"struct FusedRopeParams \{\s*void\* __restrict__ q_ptr;\s*void\* __restrict__ k_ptr;[^\n]*\s*"
                    r"const void\* __restrict__ cos_sin_cache_ptr;\s*const void\* __restrict__ positions;\s*"
                    r"int64_t q_stride_bytes;\s*int64_t k_stride_bytes;\s*int64_t head_stride_bytes;\s*"
                    r"uint32_t num_qo_heads;\s*uint32_t num_kv_heads;\s*uint32_t num_tokens;\s*\};",
                    "FusedRopeParams fields, in the order the launcher sets them (strides in bytes)",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"const int64_t k_offset = static_cast<int64_t>\(num_qo_heads\) \* head_stride_bytes;",
                    "k is passed pre-offset by -num_qo_heads * head_stride bytes",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"constexpr uint32_t kBlockSize = (?P<BLOCK_SIZE>\d+);",
                    "threads per block",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"needed_blocks = div_ceil\(num_works, \(kBlockSize / kWorkThreads\)\);\s*"
                    r"const auto num_blocks = std::min\(max_blocks, needed_blocks\);",
                    "persistent grid: min(SMs * occupancy, div_ceil(heads, heads per block))",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"template <bool kIsNeox, int64_t kRopeDim, bool kUsePDL, typename DType, typename QDType = DType>\s*"
                    r"struct FusedRopeKernel",
                    "FusedRopeKernel's template parameters",
                ),
            ),
            dtypes=("fp16", "bf16"),
            supports=_supports,
        ),
    ),
    default_variant=lambda roots: "jit",
    dtypes=("fp16", "bf16"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "uniform"),
    replaces=(
        "sglang.kernels.ops.attention.rope:apply_rope_with_cos_sin_cache_inplace",
        "sglang.kernels.ops.attention.rope:apply_rope_inplace",
    ),
    # the kernels a profiler shows: SGLang's JIT kernel, ours (namespace in kernel.cu)
    kernel_symbols=(r"fused_rope_kernel", r"astra_rope_k::"),
)
