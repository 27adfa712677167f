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

from astra_sglang.families import qkv
from astra_sglang.kernels.qknorm import spec as _qknorm_spec
from astra_sglang.sites import attention_input_sites
from astra_sglang.spec import DTYPE_BYTES, Shape

ROPE_DIMS = (32, 64, 128, 256)  # rope_dim instantiations the launchers carry
# cos_sin_cache rows in the harness (positions drawn below it); a module global: CPU tests shrink it
MAX_POSITION = 8192

# Models whose attention runs RotaryEmbedding.forward_cuda without the fused KV store, and the TP degrees.
# (Qwen3-MoE and gpt-oss take the fused rope + KV store path on a bf16 KV cache instead.)
ROPE_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("llama-3-8b", (1, 2)),
    ("llama-3-70b", (4, 8)),
    ("qwen3-8b", (1,)),
    ("qwen3-32b", (2, 4)),
    ("qwen2.5-7b", (1,)),
)


# Which of them run the q/k norm (PDL) between the qkv GEMM and rope: the models qknorm's corpus names (Qwen3).
_QK_NORMED = {name for name, _ in _qknorm_spec.QK_NORM_MODELS}
_PLAIN_SITES = tuple(m for m in ROPE_MODELS if m[0] not in _QK_NORMED)
_QK_NORM_SITES = tuple(m for m in ROPE_MODELS if m[0] in _QK_NORMED)


def _sites(dims) -> tuple:
    """Decode rows: qkv -> rope -> SGLang's KV store (PDL) -> attention, as an unpatched Llama layer runs them; heads
    only a q/k-normed model has get its q/k norm between the qkv GEMM and rope too."""
    return (attention_input_sites(_PLAIN_SITES, dims[1:4], "rope", "KV store")
            or attention_input_sites(_QK_NORM_SITES, dims[1:4], "rope", "KV store", before="q/k norm"))


def _dims(t: int, hq: int, hk: int, d: int, rope: Optional[int] = None) -> Tuple[int, ...]:
    stride = qkv.qkv_stride(hq, hk, d)
    return (t, hq, hk, d, rope or d, stride, stride)


def model_dims(cfg: Dict[str, Any], tokens: int, tp: int = 1) -> Optional[Tuple[int, ...]]:
    """This op's dims in one step of `tokens` tokens of a model (its config.json), per TP rank; the rotary
    width follows partial_rotary_factor (the profile's speedup lookup)."""
    heads = qkv.heads_of_config(cfg, tp)
    factor = float(cfg.get("partial_rotary_factor") or 1.0)
    return _dims(tokens, *heads, rope=int(heads[2] * factor)) if heads else None


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


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    from astra_sglang.spec import torch_dtype

    t, hq, hk, d, r, qs, ks = dims
    dt = torch_dtype(dtype)
    scale = 16.0 if dist == "large" else 1.0
    q = (torch.randn((t, qs), generator=gen, device=device) * scale).to(dt)
    k = (torch.randn((t, ks), generator=gen, device=device) * scale).to(dt)
    cache = qkv.cos_sin_cache(r, MAX_POSITION, device)
    if dist == "uniform":  # any fp32 cache, not only unit-circle pairs
        cache = torch.rand((MAX_POSITION, r), generator=gen, device=device) * 2 - 1
    pos = qkv.positions(t, MAX_POSITION, gen, device)
    if t > 1:
        pos[-1] = MAX_POSITION - 1  # the last cache row
    return {"q": q, "k": k, "cos_sin_cache": cache, "positions": pos}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    # works on the harness's [tokens, stride] buffers and on the patch's [tokens, heads, rope_dim] views
    _, hq, hk, d, r = dims[:5]
    neox = bool(int(scalars.get("is_neox", 1)))
    q, k = inp["q"].double(), inp["k"].double()
    cos, sin = qkv.cos_sin(inp, r)
    # a patch view [T, H, r] of heads d apart arrives here as a contiguous [T, H, r] copy
    dq = d if q.dim() == 2 else q.shape[-1]
    dk = d if k.dim() == 2 else k.shape[-1]
    qo = qkv.rotate(q.reshape(q.shape[0], -1), hq, dq, r, cos, sin, neox).reshape(q.shape)
    ko = qkv.rotate(k.reshape(k.shape[0], -1), hk, dk, r, cos, sin, neox).reshape(k.shape)
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


_ROPE = "csrc/elementwise/rope.cuh"
DIM_NAMES = ("num_tokens", "num_q_heads", "num_kv_heads", "head_size", "rope_dim", "q_stride", "k_stride")

SPEC = qkv.spec(
    name="rope",
    summary="rotary embedding of q and k in place (NeoX or GPT-J style), cos/sin rows from an fp32 cache",
    dim_names=DIM_NAMES,
    pointers=(("q", "inout"), ("k", "inout"), ("cos_sin_cache", "in"), ("positions", "in")),
    scalar_args=(("is_neox", "i64"),),
    variant=qkv.jit_variant(
        _ROPE,
        description="SGLang JIT FusedRopeKernel::run (fused_rope_kernel), int64 positions",
        provenance="sglang/kernels/ops/attention/rope.py apply_rope_with_cos_sin_cache_inplace -> apply_rope_inplace "
        "-> _jit_fused_rope_module(is_neox, rope_dim, dtype, q_dtype).run_rope -> csrc/elementwise/rope.cuh "
        "FusedRopeKernel<is_neox, rope_dim, pdl, T>::run (called from sglang/srt/layers/rotary_embedding/"
        "base.py RotaryEmbedding.forward_cuda)",
        source_facts=(
            (
                _ROPE,
                r"struct FusedRopeParams \{\s*void\* __restrict__ q_ptr;\s*void\* __restrict__ k_ptr;[^\n]*\s*"
                r"const void\* __restrict__ cos_sin_cache_ptr;\s*const void\* __restrict__ positions;\s*"
                r"int64_t q_stride_bytes;\s*int64_t k_stride_bytes;\s*int64_t head_stride_bytes;\s*"
                r"uint32_t num_qo_heads;\s*uint32_t num_kv_heads;\s*uint32_t num_tokens;\s*\};",
                "FusedRopeParams fields, in the order the launcher sets them (strides in bytes)",
            ),
            (
                _ROPE,
                r"const int64_t k_offset = static_cast<int64_t>\(num_qo_heads\) \* head_stride_bytes;",
                "k is passed pre-offset by -num_qo_heads * head_stride bytes",
            ),
            (
                _ROPE,
                r"constexpr uint32_t kBlockSize = (?P<BLOCK_SIZE>\d+);",
                "threads per block",
            ),
            (
                _ROPE,
                r"needed_blocks = div_ceil\(num_works, \(kBlockSize / kWorkThreads\)\);\s*"
                r"const auto num_blocks = std::min\(max_blocks, needed_blocks\);",
                "persistent grid: min(SMs * occupancy, div_ceil(heads, heads per block))",
            ),
            (
                _ROPE,
                r"template <bool kIsNeox, int64_t kRopeDim, bool kUsePDL, typename DType, typename QDType = DType>\s*"
                r"struct FusedRopeKernel",
                "FusedRopeKernel's template parameters",
            ),
        ),
        supports=_supports,
    ),
    corpus=qkv.corpus(ROPE_MODELS, _dims),
    edge_shapes=EDGE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=qkv.neox_scalars(_GPTJ),
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "uniform"),
    replaces=(
        "sglang.kernels.ops.attention.rope:apply_rope_with_cos_sin_cache_inplace",
        "sglang.kernels.ops.attention.rope:apply_rope_inplace",
    ),
    # the kernels a profiler shows: SGLang's JIT kernel, ours (namespace in kernel.cu)
    kernel_symbols=(r"fused_rope_kernel", r"astra_rope_k::"),
    context_sites=_sites,
)
