"""kv_store: write each token's key and value rows into the paged KV cache (SGLang's JIT store_cache).

k_cache[indices[t]] = k[t, :k_row]; v_cache[indices[t]] = v[t, :v_row] for every token t whose slot is not
reserved_skip_index (slot 0, CUDA-graph padding, by default). k and v are column blocks of the qkv output:
token rows k_stride / v_stride elements apart. An exact copy: outputs must match bit for bit.
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

ROW_BYTES = (256, 512, 1024, 2048, 4096)  # K (= V) row widths the launchers instantiate
RESERVED_SKIP = 0  # SGLang's store_cache default: slot 0 is the CUDA-graph padding slot

# Models whose attention stores K/V through MHATokenToKVPool.set_kv_buffer (config.json): name, q heads,
# kv heads, head_dim, TP degrees. KV heads are replicated past TP = kv heads.
KV_MODELS: Tuple[Tuple[str, int, int, int, Tuple[int, ...]], ...] = (
    ("llama-3-8b", 32, 8, 128, (1, 2)),
    ("llama-3-70b", 64, 8, 128, (4, 8)),
    ("qwen3-8b", 32, 8, 128, (1,)),
    ("qwen3-32b", 64, 8, 128, (2, 4)),
    ("qwen2.5-7b", 28, 4, 128, (1,)),
)


def cache_slots(tokens: int) -> int:
    """KV-pool rows in the harness: room for the batch twice over, at least 4096 (the real pool is larger;
    only the touched rows cost anything)."""
    return max(4096, 2 * tokens)


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, hq, hk, d, tps in KV_MODELS:
        for tp in tps:
            q, k = hq // tp, max(1, hk // tp)
            row, stride = k * d, (q + 2 * k) * d
            src = f"{name} tp{tp}"
            dims = lambda t: (t, row, row, stride, stride)  # noqa: E731
            shapes += [Shape(dims(t), ("decode",), src) for t in DECODE_TOKENS]
            shapes += [Shape(dims(t), ("prefill",), src) for t in PREFILL_TOKENS]
    return dedupe_shapes(shapes)


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
    kc, vc = inp["k_cache"].clone(), inp["v_cache"].clone()
    k = inp["k"].reshape(t, -1)[:, :kr]
    v = inp["v"].reshape(t, -1)[:, :vr]
    kc.reshape(kc.shape[0], -1)[idx[keep]] = k[keep]
    vc.reshape(vc.shape[0], -1)[idx[keep]] = v[keep]
    return {"k_cache": kc, "v_cache": vc}


def bytes_moved(dims, dtype: str) -> int:
    t, kr, vr = dims[:3]
    return 2 * t * (kr + vr) * DTYPE_BYTES[dtype] + 8 * t  # rows read and written, indices


def _supports(dims, dtype: str) -> Optional[str]:
    t, kr, vr, ks, vs = dims
    b = DTYPE_BYTES[dtype]
    if kr != vr or kr * b not in ROW_BYTES:
        return f"K/V rows of {kr * b}/{vr * b} bytes (the launcher instantiates equal rows of {ROW_BYTES})"
    return None


SPEC = OpSpec(
    name="kv_store",
    summary="store each token's K and V rows into the KV cache at its slot (skips the reserved padding slot)",
    dim_names=("num_tokens", "k_row", "v_row", "k_stride", "v_stride"),
    abi=(
        AbiArg("k", "ptr", "in"),
        AbiArg("v", "ptr", "in"),
        AbiArg("k_cache", "ptr", "inout"),
        AbiArg("v_cache", "ptr", "inout"),
        AbiArg("indices", "ptr", "in"),
        AbiArg("num_tokens", "i64"),
        AbiArg("k_row", "i64"),
        AbiArg("v_row", "i64"),
        AbiArg("k_stride", "i64"),
        AbiArg("v_stride", "i64"),
        AbiArg("size_limit", "i64"),
        AbiArg("reserved_skip_index", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="jit",
            description="SGLang JIT StoreKVCacheKernel (0.5.17: store_kvcache, split warps per row; "
            "0.5.23: store_kvcache_kernel, kNumThreads per row), int64 indices",
            provenance="sglang/kernels/ops/kvcache/kvcache.py store_cache -> _jit_kvcache_module(row_bytes, ...)"
            ".store_cache -> csrc/elementwise/kvcache.cuh StoreKVCacheKernel<...>::run (called from "
            "sglang/srt/mem_cache/memory_pool.py _set_kv_buffer_impl, MHATokenToKVPool.set_kv_buffer)",
            sources=(SourceFile("sglang_jit", "csrc/elementwise/kvcache.cuh"),),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit.cu.in",
            flag_profile="sglang_jit",
            source_facts=(
                (
                    "csrc/elementwise/kvcache.cuh",
                    r"struct StoreKVCacheParams \{\s*const void\* __restrict__ k;\s*const void\* __restrict__ v;\s*"
                    r"void\* __restrict__ k_cache;\s*void\* __restrict__ v_cache;\s*const void\* __restrict__ indices;\s*"
                    r"int64_t stride_k_bytes;\s*int64_t stride_v_bytes;\s*(?://[^\n]*\s*)*"
                    r"int64_t stride_k_cache_bytes;\s*int64_t stride_v_cache_bytes;\s*int64_t stride_indices;\s*"
                    r"uint32_t batch_size;\s*int64_t size_limit;\s*int64_t reserved_skip_index;\s*\};",
                    "StoreKVCacheParams fields, in the order the launcher sets them (strides in bytes)",
                ),
                (
                    "csrc/elementwise/kvcache.cuh",
                    # 0.5.17: store_kvcache<K, V, kSplit, pdl, T>, kNumWarps-warp blocks;
                    # 0.5.23: store_kvcache_kernel<K, V, kNumThreads, pdl, T>, (32, num_warps) blocks
                    r"__global__ void (?P<KV_KERNEL>store_kvcache_kernel|store_kvcache)\(",
                    "which store kernel generation the source has (the launcher carries both launch paths)",
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
