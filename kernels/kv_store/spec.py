"""kv_store: write each token's key and value rows into the paged KV cache (SGLang's JIT store_cache).

k_cache[indices[t]] = k[t, :k_row]; v_cache[indices[t]] = v[t, :v_row] for every token t whose slot is not
reserved_skip_index (slot 0, CUDA-graph padding, by default). k and v are column blocks of the qkv output:
token rows k_stride / v_stride elements apart. An exact copy: outputs must match bit for bit.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.spec import DTYPE_BYTES, Shape, Tolerance

ROW_BYTES = (256, 512, 1024, 2048, 4096, 8192)  # K (= V) row widths the launchers instantiate
RESERVED_SKIP = 0  # SGLang's store_cache default: slot 0 is the CUDA-graph padding slot
cache_slots = qkv.cache_slots  # a module global: CPU tests shrink it

# Models whose attention stores K/V through MHATokenToKVPool.set_kv_buffer, and the TP degrees.
KV_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("llama-3-8b", (1, 2)),
    ("llama-3-70b", (4, 8)),
    ("qwen3-8b", (1,)),
    ("qwen3-32b", (2, 4)),
    ("qwen2.5-7b", (1,)),
)


def _dims(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    row, stride = hk * d, qkv.qkv_stride(hq, hk, d)
    return (t, row, row, stride, stride)


model_dims = qkv.model_dims_of(_dims)  # the profile's speedup lookup: dims from a model's config.json


EDGE = (
    Shape((1, 1024, 1024, 6144, 6144), ("edge",), "one token (slot drawn at random)"),
    Shape((3, 128, 128, 128, 128), ("edge",), "contiguous k and v, one kv head of 128"),
    Shape((5, 2048, 2048, 2048, 2048), ("edge",), "4096-byte rows"),
    Shape((7, 512, 512, 4608, 4608), ("edge",), "qwen2.5-7b rows, odd batch"),
)


def scalars(dims) -> Dict[str, Any]:
    return {"size_limit": cache_slots(dims[0]), "reserved_skip_index": RESERVED_SKIP}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    from astra_sglang.spec import torch_dtype

    t, kr, vr, ks, vs = dims
    dt = torch_dtype(dtype)
    n = cache_slots(t)

    def draw(shape):
        x = torch.randn(shape, generator=gen, device=device)
        if dist == "special":  # a copy moves any bit pattern: infinities and NaNs too
            x.view(-1)[::97] = float("inf")
            x.view(-1)[1::89] = float("nan")
        return x.to(dt)

    idx = torch.randperm(n, generator=gen, device=device)[:t].to(torch.int64)
    if t > 1:
        idx[0] = RESERVED_SKIP  # the padding slot: never written
    return {"k": draw((t, ks)), "v": draw((t, vs)), "k_cache": draw((n, kr)), "v_cache": draw((n, vr)),
            "indices": idx}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    t = dims[0]
    kr, vr = dims[1], dims[2]
    skip = int(scalars.get("reserved_skip_index", RESERVED_SKIP))
    idx = inp["indices"].long().reshape(-1)
    keep = idx != skip
    k = inp["k"].reshape(t, -1)[:, :kr]
    v = inp["v"].reshape(t, -1)[:, :vr]
    return {"k_cache": qkv.store_rows(inp["k_cache"], idx[keep], k[keep]),
            "v_cache": qkv.store_rows(inp["v_cache"], idx[keep], v[keep])}


def bytes_moved(dims, dtype: str) -> int:
    t, kr, vr = dims[:3]
    return 2 * t * (kr + vr) * DTYPE_BYTES[dtype] + 8 * t  # rows read and written, indices


def _supports(dims, dtype: str) -> Optional[str]:
    t, kr, vr, ks, vs = dims
    b = DTYPE_BYTES[dtype]
    if kr != vr or kr * b not in ROW_BYTES:
        return f"K/V rows of {kr * b}/{vr * b} bytes (the launcher instantiates equal rows of {ROW_BYTES})"
    return None


def store_row_problem(kv_heads: int, head_dim: int, dtype: str) -> Optional[str]:
    """Why this launcher's store cannot take KV rows of kv_heads * head_dim elements, or None: for the fused ops whose
    production ends with this store (qknorm_rope_store's jit_dense, dense_rope_store)."""
    row = kv_heads * head_dim * DTYPE_BYTES[dtype]
    return None if row in ROW_BYTES else f"KV rows of {row} bytes (the store's launcher instantiates {ROW_BYTES})"


_KV = "csrc/elementwise/kvcache.cuh"
DIM_NAMES = ("num_tokens", "k_row", "v_row", "k_stride", "v_stride")

SPEC = qkv.spec(
    name="kv_store",
    summary="store each token's K and V rows into the KV cache at its slot (skips the reserved padding slot)",
    dim_names=DIM_NAMES,
    pointers=(("k", "in"), ("v", "in"), ("k_cache", "inout"), ("v_cache", "inout"), ("indices", "in")),
    scalar_args=(("size_limit", "i64"), ("reserved_skip_index", "i64")),
    variant=qkv.jit_variant(
        _KV,
        description="SGLang JIT StoreKVCacheKernel (0.5.17: store_kvcache, split warps per row; "
        "0.5.23: store_kvcache_kernel, kNumThreads per row), int64 indices",
        provenance="sglang/kernels/ops/kvcache/kvcache.py store_cache -> _jit_kvcache_module(row_bytes, ...)"
        ".store_cache -> csrc/elementwise/kvcache.cuh StoreKVCacheKernel<...>::run (called from "
        "sglang/srt/mem_cache/memory_pool.py _set_kv_buffer_impl, MHATokenToKVPool.set_kv_buffer)",
        source_facts=(
            (
                _KV,
                r"struct StoreKVCacheParams \{\s*const void\* __restrict__ k;\s*const void\* __restrict__ v;\s*"
                r"void\* __restrict__ k_cache;\s*void\* __restrict__ v_cache;\s*const void\* __restrict__ indices;\s*"
                r"int64_t stride_k_bytes;\s*int64_t stride_v_bytes;\s*(?://[^\n]*\s*)*"
                r"int64_t stride_k_cache_bytes;\s*int64_t stride_v_cache_bytes;\s*int64_t stride_indices;\s*"
                r"uint32_t batch_size;\s*int64_t size_limit;\s*int64_t reserved_skip_index;\s*\};",
                "StoreKVCacheParams fields, in the order the launcher sets them (strides in bytes)",
            ),
            (
                _KV,
                # 0.5.17: store_kvcache<K, V, kSplit, pdl, T>, kNumWarps-warp blocks;
                # 0.5.23: store_kvcache_kernel<K, V, kNumThreads, pdl, T>, (32, num_warps) blocks
                r"__global__ void (?P<KV_KERNEL>store_kvcache_kernel|store_kvcache)\(",
                "which store kernel generation the source has (the launcher carries both launch paths)",
            ),
        ),
        supports=_supports,
    ),
    corpus=qkv.corpus(KV_MODELS, _dims),
    edge_shapes=EDGE,
    # an exact copy: outputs must match bit for bit
    tolerance=Tolerance(k=1.0, floor={"fp32": 0.0, "fp16": 0.0, "bf16": 0.0}),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "special"),
    replaces=("sglang.kernels.ops.kvcache.kvcache:store_cache",),
    # the kernels a profiler shows: SGLang's JIT kernel, ours (namespace in kernel.cu)
    kernel_symbols=(r"store_kvcache", r"astra_kv_k::"),
)
