"""rope_store: rotary embedding of q and k in place, with the rotated k and the untouched v stored into the KV
cache at each token's slot (SGLang's JIT fused_rope_store_kernel: the path Qwen3-MoE attention takes on a bf16
KV cache, replacing rope + the separate KV store).

q, k: NeoX or GPT-J rotation of every head (rope_dim = head_dim, as SGLang's fused kernel requires) by row
positions[t] of the fp32 cos_sin_cache; k_cache[out_loc[t]] = rotated k[t]; v_cache[out_loc[t]] = v[t].
q/k/v are column blocks of the qkv output (token strides q_stride / k_stride / v_stride, heads head_dim apart);
the caches are contiguous [slots, num_kv_heads * head_dim] views of the pool layer. No reserved slot is skipped.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.spec import DTYPE_BYTES, Shape

HEAD_DIMS = (64, 128, 256)  # head_dim instantiations the launchers carry (SGLang: rope_dim = head_dim)
MAX_POSITION = 8192  # cos_sin_cache rows in the harness (module globals: CPU tests shrink both)
cache_slots = qkv.cache_slots

# Models whose attention calls the fused rope + KV store on a bf16 KV cache, and the TP degrees.
FUSED_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("qwen3-30b-a3b", (1, 2, 4)),
    ("qwen3-235b-a22b", (4, 8)),
)


def _dims(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    s = qkv.qkv_stride(hq, hk, d)  # q, k and v are column blocks of the fused qkv output
    return (t, hq, hk, d, s, s, s)


_GPTJ = {(5, 8, 2, 128, 1536, 1536, 1536)}

EDGE = (
    Shape((1, 1, 1, 128, 384, 384, 384), ("edge",), "one q head, one kv head"),
    Shape((3, 64, 8, 64, 5120, 5120, 5120), ("edge",), "gpt-oss heads (64 q, 8 kv, head_dim 64), bf16 pool"),
    Shape((5, 8, 2, 128, 1536, 1536, 1536), ("edge",), "GPT-J (interleaved) style"),
    Shape((7, 4, 2, 256, 2048, 2048, 2048), ("edge",), "head_dim 256"),
    Shape((9, 8, 2, 128, 1024, 256, 256), ("edge",), "contiguous q, k and v (separate tensors)"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    from astra_sglang.spec import torch_dtype

    t, hq, hk, d, qs, ks, vs = dims
    dt = torch_dtype(dtype)
    n = cache_slots(t)
    scale = 16.0 if dist == "large" else 1.0

    def draw(shape):
        return (torch.randn(shape, generator=gen, device=device) * scale).to(dt)

    cache = qkv.cos_sin_cache(d, MAX_POSITION, device)
    pos = qkv.positions(t, MAX_POSITION, gen, device)
    loc = torch.randperm(n, generator=gen, device=device)[:t].to(torch.int64)
    return {"q": draw((t, qs)), "k": draw((t, ks)), "v": draw((t, vs)), "k_cache": draw((n, hk * d)),
            "v_cache": draw((n, hk * d)), "cos_sin_cache": cache, "positions": pos, "out_loc": loc}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    # harness: [tokens, stride] row buffers; patch: [tokens, heads, head_dim] views (sampled copies)
    t, hq, hk, d = dims[:4]
    neox = bool(int(scalars.get("is_neox", 1)))
    q, k, v = inp["q"].double(), inp["k"].double(), inp["v"].double()
    loc = inp["out_loc"].long()
    cos, sin = qkv.cos_sin(inp, d)
    n = q.shape[0]
    qo = qkv.rotate(q.reshape(n, -1), hq, d, d, cos, sin, neox).reshape(q.shape)
    ko = qkv.rotate(k.reshape(n, -1), hk, d, d, cos, sin, neox).reshape(k.shape)
    kc = qkv.store_rows(inp["k_cache"], loc, ko.reshape(n, -1)[:, : hk * d])
    vc = qkv.store_rows(inp["v_cache"], loc, v.reshape(n, -1)[:, : hk * d])
    return {"q": qo, "k": ko, "k_cache": kc, "v_cache": vc}


def bytes_moved(dims, dtype: str) -> int:
    t, hq, hk, d = dims[:4]
    e = DTYPE_BYTES[dtype]
    # q, k read + written, k and v written again into the cache, v read; positions, slots, cos/sin rows
    return t * ((2 * hq + 3 * hk + 2 * hk) * d * e + 16 + d * 4)


def _supports(dims, dtype: str) -> Optional[str]:
    t, hq, hk, d, qs, ks, vs = dims
    if d not in HEAD_DIMS:
        return f"head_dim {d} (the launcher instantiates {HEAD_DIMS})"
    if qs < hq * d or ks < hk * d or vs < hk * d:
        return "a row stride shorter than its heads"
    return None


_ROPE = "csrc/elementwise/rope.cuh"
DIM_NAMES = ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride", "v_stride")

SPEC = qkv.spec(
    name="rope_store",
    summary="rope of q and k in place, rotated k and v stored into the KV cache (SGLang's fused rope + KV store)",
    dim_names=DIM_NAMES,
    pointers=(("q", "inout"), ("k", "inout"), ("v", "in"), ("k_cache", "inout"), ("v_cache", "inout"),
              ("cos_sin_cache", "in"), ("positions", "in"), ("out_loc", "in")),
    scalar_args=(("is_neox", "i64"),),
    variant=qkv.jit_variant(
        _ROPE,
        description="SGLang JIT FusedRopeKernel::run_fused (fused_rope_store_kernel), int64 positions and slots",
        provenance="sglang/kernels/ops/attention/rope.py apply_rope_with_cos_sin_cache_inplace(fused_args=...) -> "
        "apply_rope_inplace_with_kvcache -> _jit_fused_rope_module(...).run_rope_store -> "
        "csrc/elementwise/rope.cuh FusedRopeKernel<is_neox, rope_dim, pdl, T>::run_fused (called from "
        "RotaryEmbedding.forward_cuda with fused_set_kv_buffer_arg: Qwen3-MoE, gpt-oss, Bailing/Llada2 on a "
        "bf16 KV cache)",
        source_facts=(
            (
                _ROPE,
                r"struct FusedRopeStoreParams \{\s*FusedRopeParams base_params;\s*void\* v_ptr;\s*"
                r"void\* __restrict__ k_cache;\s*void\* __restrict__ v_cache;\s*const void\* __restrict__ out_loc;\s*"
                r"int64_t v_stride_bytes;\s*int64_t cache_stride_bytes;\s*\};",
                "FusedRopeStoreParams fields, in the order the launcher sets them",
            ),
            (
                _ROPE,
                r"struct FusedRopeParams \{\s*void\* __restrict__ q_ptr;\s*void\* __restrict__ k_ptr;[^\n]*\s*"
                r"const void\* __restrict__ cos_sin_cache_ptr;\s*const void\* __restrict__ positions;\s*"
                r"int64_t q_stride_bytes;\s*int64_t k_stride_bytes;\s*int64_t head_stride_bytes;\s*"
                r"uint32_t num_qo_heads;\s*uint32_t num_kv_heads;\s*uint32_t num_tokens;\s*\};",
                "FusedRopeParams fields (strides in bytes)",
            ),
            (
                _ROPE,
                r"\.k_cache = pointer::offset\(k_cache\.data_ptr\(\), -k_offset\),",
                "k and k_cache are passed pre-offset by -num_qo_heads heads",
            ),
            (
                _ROPE,
                r"constexpr uint32_t kBlockSize = (?P<BLOCK_SIZE>\d+);",
                "threads per block",
            ),
            (
                _ROPE,
                r"num_total_works = \(num_qo_heads \+ 2 \* num_kv_heads\) \* num_tokens;\s*"
                r"const auto needed_blocks = div_ceil\(num_total_works, \(kBlockSize / kWorkThreads\)\);",
                "grid: min(SMs * occupancy, div_ceil((q + 2 kv heads) * tokens, heads per block))",
            ),
        ),
        supports=_supports,
    ),
    corpus=qkv.corpus(FUSED_MODELS, _dims),
    edge_shapes=EDGE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=qkv.neox_scalars(_GPTJ),
    bytes_moved=bytes_moved,
    distributions=("normal", "large"),
    replaces=("sglang.kernels.ops.attention.rope:apply_rope_inplace_with_kvcache",),
    # the kernels a profiler shows: SGLang's JIT kernel, ours (namespace in kernel.cu)
    kernel_symbols=(r"fused_rope_store_kernel", r"astra_ropest::"),
)
