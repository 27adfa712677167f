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

HEAD_DIMS = (64, 128, 256)  # head_dim instantiations the launchers carry (SGLang: rope_dim = head_dim)
MAX_POSITION = 8192  # cos_sin_cache rows in the harness

# Models whose attention calls the fused rope + KV store on a bf16 KV cache (config.json): name, q heads,
# kv heads, head_dim, TP degrees; KV heads replicated past TP = kv heads.
FUSED_MODELS: Tuple[Tuple[str, int, int, int, Tuple[int, ...]], ...] = (
    ("qwen3-30b-a3b", 32, 4, 128, (1, 2, 4)),
    ("qwen3-235b-a22b", 64, 4, 128, (4, 8)),
)


def cache_slots(tokens: int) -> int:
    return max(4096, 2 * tokens)


def _dims(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    s = (hq + 2 * hk) * d  # q, k and v are column blocks of the fused qkv output
    return (t, hq, hk, d, s, s, s)


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, hq, hk, d, tps in FUSED_MODELS:
        for tp in tps:
            q, k = hq // tp, max(1, hk // tp)
            src = f"{name} tp{tp}"
            shapes += [Shape(_dims(t, q, k, d), ("decode",), src) for t in DECODE_TOKENS]
            shapes += [Shape(_dims(t, q, k, d), ("prefill",), src) for t in PREFILL_TOKENS]
    return dedupe_shapes(shapes)


_GPTJ = {(5, 8, 2, 128, 1536, 1536, 1536)}

EDGE = (
    Shape((1, 1, 1, 128, 384, 384, 384), ("edge",), "one q head, one kv head"),
    Shape((3, 64, 8, 64, 5120, 5120, 5120), ("edge",), "gpt-oss heads (64 q, 8 kv, head_dim 64), bf16 pool"),
    Shape((5, 8, 2, 128, 1536, 1536, 1536), ("edge",), "GPT-J (interleaved) style"),
    Shape((7, 4, 2, 256, 2048, 2048, 2048), ("edge",), "head_dim 256"),
    Shape((9, 8, 2, 128, 1024, 256, 256), ("edge",), "contiguous q, k and v (separate tensors)"),
)


def scalars(dims) -> Dict[str, Any]:
    return {"is_neox": 0 if tuple(dims) in _GPTJ else 1}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    from astra_sglang.spec import torch_dtype

    t, hq, hk, d, qs, ks, vs = dims
    dt = torch_dtype(dtype)
    n = cache_slots(t)
    scale = 16.0 if dist == "large" else 1.0

    def draw(shape):
        return (torch.randn(shape, generator=gen, device=device) * scale).to(dt)

    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    ang = torch.arange(MAX_POSITION, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float()
    pos = torch.randint(0, MAX_POSITION, (t,), generator=gen, device=device, dtype=torch.int64)
    loc = torch.randperm(n, generator=gen, device=device)[:t].to(torch.int64)
    return {"q": draw((t, qs)), "k": draw((t, ks)), "v": draw((t, vs)), "k_cache": draw((n, hk * d)),
            "v_cache": draw((n, hk * d)), "cos_sin_cache": cache, "positions": pos, "out_loc": loc}


def _rotate(x, heads: int, d: int, cos, sin, neox: bool):
    """x: [tokens, >= heads * d]; rotate every head (rope_dim = d)."""
    t = x.shape[0]
    out = x.clone()
    h = out[:, : heads * d].reshape(t, heads, d).clone()
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = h[..., : d // 2].clone(), h[..., d // 2 :].clone()
        h[..., : d // 2], h[..., d // 2 :] = a * c - b * s, a * s + b * c
    else:
        a, b = h[..., 0::2].clone(), h[..., 1::2].clone()
        h[..., 0::2], h[..., 1::2] = a * c - b * s, a * s + b * c
    out[:, : heads * d] = h.reshape(t, heads * d)
    return out


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    # harness: [tokens, stride] row buffers; patch: [tokens, heads, head_dim] views (sampled copies)
    t, hq, hk, d = dims[:4]
    neox = bool(int(scalars.get("is_neox", 1)))
    q, k, v = inp["q"].double(), inp["k"].double(), inp["v"].double()
    pos, loc = inp["positions"].long(), inp["out_loc"].long()
    cs = inp["cos_sin_cache"].double()[pos]
    cos, sin = cs[:, : d // 2], cs[:, d // 2 : d]
    n = q.shape[0]
    qo = _rotate(q.reshape(n, -1), hq, d, cos, sin, neox).reshape(q.shape)
    ko = _rotate(k.reshape(n, -1), hk, d, cos, sin, neox).reshape(k.shape)
    kc, vc = inp["k_cache"].clone(), inp["v_cache"].clone()
    kc2, vc2 = kc.reshape(kc.shape[0], -1), vc.reshape(vc.shape[0], -1)
    kc2[loc] = ko.reshape(n, -1)[:, : hk * d]
    vc2[loc] = v.reshape(n, -1)[:, : hk * d]
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


SPEC = OpSpec(
    name="rope_store",
    summary="rope of q and k in place, rotated k and v stored into the KV cache (SGLang's fused rope + KV store)",
    dim_names=("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride", "v_stride"),
    abi=(
        AbiArg("q", "ptr", "inout"),
        AbiArg("k", "ptr", "inout"),
        AbiArg("v", "ptr", "in"),
        AbiArg("k_cache", "ptr", "inout"),
        AbiArg("v_cache", "ptr", "inout"),
        AbiArg("cos_sin_cache", "ptr", "in"),
        AbiArg("positions", "ptr", "in"),
        AbiArg("out_loc", "ptr", "in"),
        AbiArg("num_tokens", "i64"),
        AbiArg("num_q_heads", "i64"),
        AbiArg("num_kv_heads", "i64"),
        AbiArg("head_dim", "i64"),
        AbiArg("q_stride", "i64"),
        AbiArg("k_stride", "i64"),
        AbiArg("v_stride", "i64"),
        AbiArg("is_neox", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="jit",
            description="SGLang JIT FusedRopeKernel::run_fused (fused_rope_store_kernel), int64 positions and slots",
            provenance="sglang/kernels/ops/attention/rope.py apply_rope_with_cos_sin_cache_inplace(fused_args=...) -> "
            "apply_rope_inplace_with_kvcache -> _jit_fused_rope_module(...).run_rope_store -> "
            "csrc/elementwise/rope.cuh FusedRopeKernel<is_neox, rope_dim, pdl, T>::run_fused (called from "
            "RotaryEmbedding.forward_cuda with fused_set_kv_buffer_arg: Qwen3-MoE, gpt-oss, Bailing/Llada2 on a "
            "bf16 KV cache)",
            sources=(SourceFile("sglang_jit", "csrc/elementwise/rope.cuh"),),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit.cu.in",
            flag_profile="sglang_jit",
            source_facts=(
                (
                    "csrc/elementwise/rope.cuh",
                    r"struct FusedRopeStoreParams \{\s*FusedRopeParams base_params;\s*void\* v_ptr;\s*"
                    r"void\* __restrict__ k_cache;\s*void\* __restrict__ v_cache;\s*const void\* __restrict__ out_loc;\s*"
                    r"int64_t v_stride_bytes;\s*int64_t cache_stride_bytes;\s*\};",
                    "FusedRopeStoreParams fields, in the order the launcher sets them",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"struct FusedRopeParams \{\s*void\* __restrict__ q_ptr;\s*void\* __restrict__ k_ptr;[^\n]*\s*"
                    r"const void\* __restrict__ cos_sin_cache_ptr;\s*const void\* __restrict__ positions;\s*"
                    r"int64_t q_stride_bytes;\s*int64_t k_stride_bytes;\s*int64_t head_stride_bytes;\s*"
                    r"uint32_t num_qo_heads;\s*uint32_t num_kv_heads;\s*uint32_t num_tokens;\s*\};",
                    "FusedRopeParams fields (strides in bytes)",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"\.k_cache = pointer::offset\(k_cache\.data_ptr\(\), -k_offset\),",
                    "k and k_cache are passed pre-offset by -num_qo_heads heads",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"constexpr uint32_t kBlockSize = (?P<BLOCK_SIZE>\d+);",
                    "threads per block",
                ),
                (
                    "csrc/elementwise/rope.cuh",
                    r"num_total_works = \(num_qo_heads \+ 2 \* num_kv_heads\) \* num_tokens;\s*"
                    r"const auto needed_blocks = div_ceil\(num_total_works, \(kBlockSize / kWorkThreads\)\);",
                    "grid: min(SMs * occupancy, div_ceil((q + 2 kv heads) * tokens, heads per block))",
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
    distributions=("normal", "large"),
    replaces=("sglang.kernels.ops.attention.rope:apply_rope_inplace_with_kvcache",),
    # the kernels a profiler shows: SGLang's JIT kernel, ours (namespace in kernel.cu)
    kernel_symbols=(r"fused_rope_store_kernel", r"astra_ropest::"),
)
