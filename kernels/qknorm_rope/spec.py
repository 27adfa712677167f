"""qknorm_rope: a FUSED op. Qwen3's per-head q/k RMSNorm, then rotary embedding, in one launch: k in place, q into its
own buffer q_out (dense Qwen3 attention: the KV store comes later, in the attention backend).

It replaces the two kernels SGLang runs back to back in dense Qwen3 attention
(`Qwen3Attention.forward_prepare_native`: qkv_proj, split, apply_qk_norm, then self.rotary_emb(positions, q, k)):
the JIT q/k norm in place (csrc/elementwise/qknorm.cuh, op qknorm), then the JIT rope in place
(RotaryEmbedding.forward_cuda -> apply_rope_with_cos_sin_cache_inplace(fused_args=None) -> csrc/elementwise/
rope.cuh FusedRopeKernel::run, the non-fused fused_rope_kernel, op rope). Production here is those two launches on
one stream, exactly as SGLang makes them; a speedup of this op is over the SUM of the two.

Per token t, every q head h:  q_out[t,h,:] = rope(rmsnorm(q[t,h,:]) * q_weight)   (rmsnorm: x * rsqrt(mean(x^2) +
eps)); every kv head h:  k[t,h,:] likewise with k_weight, in place. rope: NeoX (is_neox=1) or GPT-J by row
positions[t] (int64) of the fp32 cos_sin_cache [max_position, head_dim] = [cos | sin], rope_dim = head_dim.
q/k are column blocks of the qkv output (token strides q_stride / k_stride, heads head_dim apart). q_out (token stride
q_out_stride, the last dim) is the q the attention gets: its own contiguous [tokens, q heads * head_dim] buffer here
and in the patch, since a column view of qkv costs SGLang 0.5.17's fa3 backend a q.contiguous() copy a layer from
batch 2 on (RESULTS.md). The kernel also takes q_out = q, q_out_stride = q_stride (in place: the adapter's
ASTRA_QKR_Q_OUT=0). Production (the launcher) copies q's rows into q_out, then runs SGLang's two kernels in place
there.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.kernels.qknorm import spec as _qknorm_spec
from astra_sglang.kernels.rope import spec as _rope_spec
from astra_sglang.sites import attention_input_sites
from astra_sglang.spec import DTYPE_BYTES, Shape, SourceFile, Variant

EPS = 1e-6  # Qwen3 rms_norm_eps (config.json)
HEAD_DIMS = (64, 128, 256)  # head_dim instantiations the launchers carry (rope_dim = head_dim)
MAX_POSITION = 8192  # cos_sin_cache rows in the harness (a module global: CPU tests shrink it)

# Dense Qwen3 models (the ones the model table knows) and the TP degrees where their heads divide: qknorm's
# dense entries. Qwen3-MoE runs qknorm_rope_store instead (the rope fused with the KV store).
DENSE_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("qwen3-8b", (1, 2)),
    ("qwen3-32b", (2, 4, 8)),
)


def dims_of(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    """The op's dims for tokens t, q heads, kv heads, head_dim: q and k column blocks of the qkv output (qkv.qk_dims),
    q_out its own contiguous [t, hq * d] buffer, as the adapter allocates it."""
    return qkv.with_q_out(qkv.qk_dims(t, hq, hk, d))


model_dims = qkv.model_dims_of(dims_of)  # the profile's speedup lookup: dims from a model's config.json

_GPTJ = {qkv.with_q_out((5, 8, 2, 128, 1536, 1536))}

# q_out contiguous in every shape (q_out_stride = q heads * head_dim, qkv.with_q_out): the harness poisons all of
# q_out and checks every element was written, so a wider q_out row would leave poison; the in-place q_out = q is the
# patch's alone
EDGE = tuple(Shape(qkv.with_q_out(dims), ("edge",), why) for dims, why in (
    ((1, 1, 1, 128, 384, 384), "one q head, one kv head"),
    ((3, 5, 1, 64, 448, 448), "head_dim 64, odd head count"),
    ((3, 64, 8, 64, 5120, 5120), "head_dim 64, 64 q / 8 kv heads (gpt-oss heads)"),
    ((5, 8, 2, 128, 1536, 1536), "GPT-J (interleaved) style"),
    ((7, 4, 2, 256, 2048, 2048), "head_dim 256"),
    ((9, 8, 2, 128, 1024, 256), "contiguous q and k (separate tensors)"),
))


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, d = dims[0], dims[3]
    q, k, dt = qkv.qk_rows(dims, dtype, gen, dist, device)
    q_out = torch.empty((t, dims[6]), device=device, dtype=dt)  # an output: the harness poisons it
    qw, kw = qkv.norm_weights(d, dt, gen, device)
    cache = qkv.cos_sin_cache(d, MAX_POSITION, device)
    pos = qkv.positions(t, MAX_POSITION, gen, device)
    if t > 1:
        pos[-1] = MAX_POSITION - 1  # the last cache row (as rope's inputs)
    return {"q": q, "q_out": q_out, "k": k, "q_weight": qw, "k_weight": kw, "cos_sin_cache": cache,
            "positions": pos}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64 of the whole chain, no intermediate rounding: q/k norm, then rotate. q_out: q's heads so, in q_out's shape
    (q is an input); k: k with its heads so and its other columns as they were.
    Works on the harness's [tokens, stride] row buffers and on the patch's [tokens, heads, head_dim] views."""
    hq, d = dims[1], dims[3]
    neox = bool(int(scalars.get("is_neox", 1)))
    qo, ko = qkv.norm_rotate(inp, dims, neox, float(scalars.get("eps", EPS)))
    # q_out's shape; a caller that hands inputs only (harness/oracle.py reference_walk) gets q's heads' shape
    q, n = inp["q"], inp["q"].shape[0]
    shape = inp["q_out"].shape if "q_out" in inp else (q.shape if q.dim() == 3 else (n, hq * d))
    return {"q_out": qo.reshape(n, -1)[:, : hq * d].reshape(shape), "k": ko}


def bytes_moved(dims, dtype: str) -> int:
    """What the fused kernel must move: q read and q_out written, k read + written; per token its position and
    cos/sin row (fp32); the two weight vectors once."""
    t, hq, hk, d = dims[:4]
    e = DTYPE_BYTES[dtype]
    return t * (2 * (hq + hk) * d * e + 8 + d * 4) + 2 * d * e


def _supports(dims, dtype: str) -> Optional[str]:
    if len(dims) != len(DIM_NAMES):
        return f"{len(dims)} dims, not {len(DIM_NAMES)}"
    t, hq, hk, d, qs, ks, qos = dims
    if d not in HEAD_DIMS:
        return f"head_dim {d} (the launcher instantiates {HEAD_DIMS})"
    if qs < hq * d or ks < hk * d:
        return "a row stride shorter than its heads"
    if qos < hq * d:
        return "a row stride shorter than its heads (q_out)"
    return None


_NEOX = qkv.neox_scalars(_GPTJ)


def _scalars(dims) -> Dict[str, Any]:
    return {**_NEOX(dims), "eps": EPS}


_QKN = "csrc/elementwise/qknorm.cuh"
_ROPE = "csrc/elementwise/rope.cuh"
# qknorm's six dims, then q_out's token stride (hq * head_dim for the patch's contiguous q_out): the ABI adds it after
# k_stride
DIM_NAMES = ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride", "q_out_stride")

# What launch_jit.cu.in relies on in each header is what the two sibling launchers rely on: their variants' facts,
# taken from their specs, so a change to either sibling's facts reaches this launcher too.
QKNORM_FACTS = _qknorm_spec.SPEC.variant("jit").source_facts
ROPE_FACTS = _rope_spec.SPEC.variant("jit").source_facts

TOLERANCE = qkv.NORM_ROPE_TOLERANCE  # why the floors are raised: families/qkv.py

JIT = Variant(
    name="jit",
    description="SGLang's two JIT kernels back to back on one stream, as Qwen3Attention.forward_prepare_native "
    "runs them: QKNormKernel (fused_qknorm_warp; 0.5.23+: fused_qknorm_half_warp for head_dim 128 on "
    "16-byte-aligned tensors), then FusedRopeKernel::run (fused_rope_kernel, rope_dim = head_dim), int64 "
    "positions, PDL between them on sm_90+",
    provenance="sglang/srt/models/qwen3.py Qwen3Attention.forward_prepare_native -> sglang/srt/models/utils.py "
    "apply_qk_norm -> fused_inplace_qknorm -> csrc/elementwise/qknorm.cuh QKNormKernel<head_dim, pdl, T>::run; "
    "then self.rotary_emb(positions, q, k) -> RotaryEmbedding.forward_cuda -> "
    "apply_rope_with_cos_sin_cache_inplace(fused_args=None) -> apply_rope_inplace -> csrc/elementwise/rope.cuh "
    "FusedRopeKernel<is_neox, rope_dim, pdl, T>::run",
    sources=(SourceFile("sglang_jit", _QKN), SourceFile("sglang_jit", _ROPE)),
    include_roots=("tvm_ffi", "dlpack"),
    launcher="launch_jit.cu.in",
    flag_profile="sglang_jit",
    source_facts=QKNORM_FACTS + ROPE_FACTS,
    dtypes=qkv.DTYPES,
    supports=_supports,
)

SPEC = qkv.spec(
    name="qknorm_rope",
    summary="FUSED q/k RMSNorm + rope in one launch, k in place, q into its own contiguous q_out (replaces SGLang's "
    "qknorm then rope in dense Qwen3 attention; speedups are over the sum of the two kernels)",
    dim_names=DIM_NAMES,
    # q an input (check fails a kernel that changes it), q_out an output (poisoned, compared), k in place
    pointers=(("q", "in"), ("q_out", "out"), ("k", "inout"), ("q_weight", "in"), ("k_weight", "in"),
              ("cos_sin_cache", "in"), ("positions", "in")),
    scalar_args=(("is_neox", "i64"), ("eps", "f64")),
    variant=JIT,
    corpus=qkv.corpus(DENSE_MODELS, dims_of),
    edge_shapes=EDGE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=_scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "large"),
    tolerance=TOLERANCE,
    replaces=("sglang.srt.models.qwen3:Qwen3Attention.forward_prepare_native",),
    # only ours: SGLang's two kernels are attributed to the qknorm and rope ops
    kernel_symbols=(r"astra_qkr::",),
    fuses=("qknorm", "rope"),
    launcher_only=qkv.launcher_q_copy,  # bench: at 1 token serving makes no q copy (fa3 takes the row as it is)
    # decode rows: qkv -> q/k norm + rope -> SGLang's KV store (PDL, in the attention backend) -> attention, as a
    # patched dense Qwen3 layer runs them; rope's site had the same follower (1.000x -> 1.522x there, H200, 2026-11-29)
    context_sites=lambda dims: attention_input_sites(DENSE_MODELS, dims[1:4], "q/k norm + rope", "KV store"),
)
