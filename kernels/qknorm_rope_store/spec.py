"""qknorm_rope_store: a FUSED op. Qwen3's per-head q/k RMSNorm, then rotary embedding of k in place and of q into
its own buffer q_out, with the rotated k and the untouched v stored into the KV cache at each token's slot, in one
launch.

It replaces SGLang's q/k norm, rope and KV store at both places Qwen3 attention runs them on a bf16 KV cache:
- Qwen3-MoE (`Qwen3MoeAttention.apply_qk_norm_rope`, the path SGLang does not fuse itself): two kernels, the JIT q/k
  norm in place (csrc/elementwise/qknorm.cuh, op qknorm), then the JIT fused rope + KV store (csrc/elementwise/rope.cuh
  FusedRopeKernel::run_fused, op rope_store). Production variant "jit".
- dense Qwen3 (`Qwen3Attention.forward`): three kernels, the same q/k norm, the JIT rope (FusedRopeKernel::run, op
  rope) and, inside the attention backend, the JIT KV store (csrc/elementwise/kvcache.cuh, op kv_store). Production
  variant "jit_dense"; the patch stores the KV here and calls the attention with save_kv_cache=False, as SGLang's
  own Qwen3-MoE path does.
Production is those launches on one stream, exactly as SGLang makes them; a speedup of this op is over their SUM.

Per token t, every q head h:  q_out[t,h,:] = rope(rmsnorm(q[t,h,:]) * q_weight)   (rmsnorm: x * rsqrt(mean(x^2) +
eps)); every kv head h:  k[t,h,:] likewise with k_weight, written in place and into k_cache[out_loc[t], h*D:(h+1)*D];
v_cache[out_loc[t]] = v[t] (its first num_kv_heads * head_dim columns). rope: NeoX (is_neox=1) or GPT-J by row
positions[t] of the fp32 cos_sin_cache [max_position, head_dim] = [cos | sin], rope_dim = head_dim.
q/k/v are column blocks of the qkv output (token strides q_stride / k_stride / v_stride, heads head_dim apart);
the caches are contiguous [slots, num_kv_heads * head_dim] views of the pool layer; positions and out_loc are int64.
q_out (token stride q_out_stride, the last dim) is the q the attention gets: its own contiguous [tokens, q heads *
head_dim] buffer here and in the patch, since a column view of qkv costs SGLang 0.5.17's fa3 backend a q.contiguous()
copy a layer from batch 2 on (RESULTS.md). The kernel also takes q_out = q, q_out_stride = q_stride (in place: the
adapter's ASTRA_QKRS_Q_OUT=0). Production (both launchers) copies q's rows into q_out, then runs SGLang's kernels in
place there.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.kernels.kv_store import spec as _kv_store_spec
from astra_sglang.kernels.qknorm import spec as _qknorm_spec
from astra_sglang.kernels.qknorm_rope import spec as _qknorm_rope_spec
from astra_sglang.kernels.rope_store import spec as _rope_store_spec
from astra_sglang.spec import DTYPE_BYTES, Shape, SourceFile, Variant

EPS = 1e-6  # Qwen3 rms_norm_eps (config.json)
HEAD_DIMS = (64, 128, 256)  # head_dim instantiations the launchers carry (the fused rope store: rope_dim = head_dim)
MAX_POSITION = 8192  # cos_sin_cache rows in the harness (module globals: CPU tests shrink both)
cache_slots = qkv.cache_slots

# Models whose attention runs q/k norm then the fused rope + KV store on a bf16 KV cache (Qwen3-MoE), and the
# TP degrees: rope_store's FUSED_MODELS.
FUSED_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("qwen3-30b-a3b", (1, 2, 4)),
    ("qwen3-235b-a22b", (4, 8)),
)
# Dense Qwen3 (q/k norm, rope, and the attention's KV store): qknorm_rope's models.
DENSE_MODELS = _qknorm_rope_spec.DENSE_MODELS


def _dims(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    """q, k and v column blocks of the fused qkv output, q_out its own contiguous [t, hq * d] buffer (the last dim)."""
    s = qkv.qkv_stride(hq, hk, d)
    return qkv.with_q_out((t, hq, hk, d, s, s, s))


model_dims = qkv.model_dims_of(_dims)  # the profile's speedup lookup: dims from a model's config.json

_GPTJ = {qkv.with_q_out((5, 8, 2, 128, 1536, 1536, 1536))}

# q_out contiguous in every shape (q_out_stride = q heads * head_dim, qkv.with_q_out): the harness poisons all of
# q_out and checks every element was written, so a wider q_out row would leave poison; the in-place q_out = q is the
# patch's alone
EDGE = tuple(Shape(qkv.with_q_out(dims), ("edge",), why) for dims, why in (
    ((1, 1, 1, 128, 384, 384, 384), "one q head, one kv head"),
    ((3, 5, 1, 64, 448, 448, 448), "head_dim 64, odd head count"),
    ((3, 64, 8, 64, 5120, 5120, 5120), "head_dim 64, 64 q / 8 kv heads (gpt-oss heads)"),
    ((5, 8, 2, 128, 1536, 1536, 1536), "GPT-J (interleaved) style"),
    ((7, 4, 2, 256, 2048, 2048, 2048), "head_dim 256"),
    ((9, 8, 2, 128, 1024, 256, 256), "contiguous q, k and v (separate tensors)"),
))


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    from astra_sglang.spec import torch_dtype

    t, hq, hk, d, qs, ks, vs, qos = dims
    dt = torch_dtype(dtype)
    n = cache_slots(t)
    scale = 16.0 if dist == "large" else 1.0

    def draw(shape):
        return (torch.randn(shape, generator=gen, device=device) * scale).to(dt)

    # the whole row travels (the columns outside q / k / v are other heads' data the kernel must not touch)
    q, k, v = draw((t, qs)), draw((t, ks)), draw((t, vs))
    qw, kw = qkv.norm_weights(d, dt, gen, device)
    cache = qkv.cos_sin_cache(d, MAX_POSITION, device)
    pos = qkv.positions(t, MAX_POSITION, gen, device)
    loc = torch.randperm(n, generator=gen, device=device)[:t].to(torch.int64)
    return {"q": q, "q_out": torch.empty((t, qos), device=device, dtype=dt),  # an output: the harness poisons it
            "k": k, "v": v, "k_cache": draw((n, hk * d)), "v_cache": draw((n, hk * d)),
            "q_weight": qw, "k_weight": kw, "cos_sin_cache": cache, "positions": pos, "out_loc": loc}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64 of the whole chain, no intermediate rounding: q/k norm, then rotate, then the store. q's heads so as q_out
    (in q_out's shape; q is an input), k with its heads so and its other columns as they were.
    Works on the harness's [tokens, stride] row buffers and on the patch's [tokens, heads, head_dim] views."""
    hq, hk, d = dims[1], dims[2], dims[3]
    neox = bool(int(scalars.get("is_neox", 1)))
    qo, ko = qkv.norm_rotate(inp, dims, neox, float(scalars.get("eps", EPS)))
    v, loc, n = inp["v"].double(), inp["out_loc"].long(), inp["q"].shape[0]
    kc = qkv.store_rows(inp["k_cache"], loc, ko.reshape(n, -1)[:, : hk * d])
    vc = qkv.store_rows(inp["v_cache"], loc, v.reshape(n, -1)[:, : hk * d])
    # q_out's shape; a caller that hands inputs only (harness/oracle.py reference_walk) gets q's heads' shape
    q = inp["q"]
    shape = inp["q_out"].shape if "q_out" in inp else (q.shape if q.dim() == 3 else (n, hq * d))
    return {"q_out": qo.reshape(n, -1)[:, : hq * d].reshape(shape), "k": ko, "k_cache": kc, "v_cache": vc}


def bytes_moved(dims, dtype: str) -> int:
    """What the fused kernel must move: q read and q_out written, k read + written, k and v written again into the
    cache, v read; per token its position, slot and cos/sin row (fp32); the two weight vectors once."""
    t, hq, hk, d = dims[:4]
    e = DTYPE_BYTES[dtype]
    return t * ((2 * hq + 3 * hk + 2 * hk) * d * e + 16 + d * 4) + 2 * d * e


def _supports(dims, dtype: str) -> Optional[str]:
    if len(dims) != len(DIM_NAMES):
        return f"{len(dims)} dims, not {len(DIM_NAMES)}"
    t, hq, hk, d, qs, ks, vs, qos = dims
    if d not in HEAD_DIMS:
        return f"head_dim {d} (the launcher instantiates {HEAD_DIMS})"
    if qs < hq * d or ks < hk * d or vs < hk * d:
        return "a row stride shorter than its heads"
    if qos < hq * d:
        return "a row stride shorter than its heads (q_out)"
    return None


def _supports_dense(dims, dtype: str) -> Optional[str]:
    return _supports(dims, dtype) or _kv_store_spec.store_row_problem(dims[2], dims[3], dtype)


_NEOX = qkv.neox_scalars(_GPTJ)


def _scalars(dims) -> Dict[str, Any]:
    return {**_NEOX(dims), "eps": EPS}


_QKN = "csrc/elementwise/qknorm.cuh"
_ROPE = "csrc/elementwise/rope.cuh"
# rope_store's seven dims, then q_out's token stride (hq * head_dim for the patch's contiguous q_out)
DIM_NAMES = _rope_store_spec.DIM_NAMES + ("q_out_stride",)

# What launch_jit.cu.in relies on in each header is what the two sibling launchers rely on: their variants' facts,
# taken from their specs, so a change to either sibling's facts reaches this launcher too.
QKNORM_FACTS = _qknorm_spec.SPEC.variant("jit").source_facts
ROPE_STORE_FACTS = _rope_store_spec.SPEC.variant("jit").source_facts
# the dense sequence: qknorm_rope's launches (q/k norm, then the non-fused rope) and kv_store's
DENSE_FACTS = _qknorm_rope_spec.SPEC.variant("jit").source_facts + _kv_store_spec.SPEC.variant("jit").source_facts

TOLERANCE = qkv.NORM_ROPE_TOLERANCE  # why the floors are raised: families/qkv.py

JIT = Variant(
    name="jit",
    description="SGLang's two JIT kernels back to back on one stream, as Qwen3MoeAttention.apply_qk_norm_rope "
    "runs them: QKNormKernel (fused_qknorm_warp; 0.5.23+: fused_qknorm_half_warp for head_dim 128 on "
    "16-byte-aligned tensors), then FusedRopeKernel::run_fused (fused_rope_store_kernel), int64 positions and "
    "slots, PDL between them on sm_90+",
    provenance="sglang/srt/models/qwen3_moe.py Qwen3MoeAttention.apply_qk_norm_rope (non-fused branch, bf16 KV "
    "cache) -> sglang/srt/models/utils.py apply_qk_norm -> fused_inplace_qknorm -> csrc/elementwise/qknorm.cuh "
    "QKNormKernel<head_dim, pdl, T>::run; then RotaryEmbedding.forward_cuda(fused_set_kv_buffer_arg=...) -> "
    "apply_rope_inplace_with_kvcache -> csrc/elementwise/rope.cuh FusedRopeKernel<is_neox, rope_dim, pdl, "
    "T>::run_fused",
    sources=(SourceFile("sglang_jit", _QKN), SourceFile("sglang_jit", _ROPE)),
    include_roots=("tvm_ffi", "dlpack"),
    launcher="launch_jit.cu.in",
    flag_profile="sglang_jit",
    source_facts=QKNORM_FACTS + ROPE_STORE_FACTS,
    dtypes=qkv.DTYPES,
    supports=_supports,
)

JIT_DENSE = Variant(
    name="jit_dense",
    description="SGLang's three JIT kernels back to back on one stream, as dense Qwen3 attention runs them: "
    "QKNormKernel, then FusedRopeKernel::run (fused_rope_kernel, no store), then the attention backend's "
    "StoreKVCacheKernel (0.5.17: store_kvcache; 0.5.23: store_kvcache_kernel), int64 positions and slots, PDL "
    "between them on sm_90+",
    provenance="sglang/srt/models/qwen3.py Qwen3Attention.forward -> forward_prepare_native -> apply_qk_norm -> "
    "fused_inplace_qknorm -> csrc/elementwise/qknorm.cuh QKNormKernel::run; self.rotary_emb(positions, q, k) -> "
    "apply_rope_with_cos_sin_cache_inplace(fused_args=None) -> csrc/elementwise/rope.cuh FusedRopeKernel::run; "
    "then self.attn(q, k, v, forward_batch) -> attention backend -> MHATokenToKVPool.set_kv_buffer -> "
    "_set_kv_buffer_impl -> store_cache -> csrc/elementwise/kvcache.cuh StoreKVCacheKernel",
    sources=(SourceFile("sglang_jit", _QKN), SourceFile("sglang_jit", _ROPE),
             SourceFile("sglang_jit", "csrc/elementwise/kvcache.cuh")),
    include_roots=("tvm_ffi", "dlpack"),
    launcher="launch_jit_dense.cu.in",
    flag_profile="sglang_jit",
    source_facts=DENSE_FACTS,
    dtypes=qkv.DTYPES,
    supports=_supports_dense,
)

SPEC = qkv.spec(
    name="qknorm_rope_store",
    summary="FUSED q/k RMSNorm + rope + KV store in one launch, q into its own contiguous q_out (replaces SGLang's "
    "qknorm then fused rope+KV store in Qwen3-MoE attention; speedups are over the sum of the two kernels)",
    dim_names=DIM_NAMES,
    # q an input (check fails a kernel that changes it), q_out an output (poisoned, compared), k in place
    pointers=(("q", "in"), ("q_out", "out"), ("k", "inout"), ("v", "in"), ("k_cache", "inout"),
              ("v_cache", "inout"), ("q_weight", "in"), ("k_weight", "in"), ("cos_sin_cache", "in"),
              ("positions", "in"), ("out_loc", "in")),
    scalar_args=(("is_neox", "i64"), ("eps", "f64")),
    variant=JIT,
    more_variants=(JIT_DENSE,),
    corpus=qkv.corpus(FUSED_MODELS + DENSE_MODELS, _dims),
    edge_shapes=EDGE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=_scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "large"),
    tolerance=TOLERANCE,
    replaces=("sglang.srt.models.qwen3_moe:Qwen3MoeAttention.apply_qk_norm_rope",
              "sglang.srt.models.qwen3:Qwen3Attention.forward"),
    # only ours: SGLang's kernels are attributed to the qknorm, rope_store, rope and kv_store ops
    kernel_symbols=(r"astra_qkrs::",),
    fuses=(("qknorm", "rope_store"), ("qknorm", "rope", "kv_store")),  # Qwen3-MoE, dense Qwen3
    launcher_only=qkv.launcher_q_copy,  # bench: at 1 token serving makes no q copy (fa3 takes the row as it is)
)
