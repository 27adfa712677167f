"""dense_rope_store: a FUSED op. Rotary embedding of k in place and of q into its own buffer q_out, with the rotated k
and the untouched v stored into the KV cache at each token's slot, in one launch, where dense (Llama-style) attention
on a bf16 KV cache runs two SGLang kernels: the JIT rope (csrc/elementwise/rope.cuh FusedRopeKernel::run, op rope),
then, inside the attention backend, the JIT KV store (csrc/elementwise/kvcache.cuh StoreKVCacheKernel, op kv_store).
Production is those two launches on one stream, exactly as SGLang makes them; a speedup of this op is over their SUM.

The computation is rope_store's (SGLang's own fused rope + KV store, which it runs only in MoE attention such as
Qwen3-MoE's); its contract, inputs, reference and bytes are taken from there, but for q: read from q (a column block of
the qkv output) and written to q_out (token stride q_out_stride, the last dim), the q the attention gets. A column
view of qkv costs SGLang 0.5.17's fa3 backend a q.contiguous() copy a layer from batch 2 on; the patch hands it its own
contiguous [tokens, q heads * head_dim] q_out instead (RESULTS.md). The kernel also takes q_out = q, q_out_stride =
q_stride (in place: the adapter's ASTRA_DRS_Q_OUT=0). Production (the launcher) copies q's rows into q_out, then runs
SGLang's rope in place there. The patch replaces the forward of
`LlamaAttention` (Llama, Mistral), `Gemma2Attention`, `GemmaAttention` (Gemma-1), `Qwen2Attention` (Qwen2 /
Qwen2.5), `Qwen2MoeAttention` and `MixtralAttention`: one body in all six (qkv GEMM, split, rope, attention, o_proj;
Gemma-2's sliding window lives in the attention and its KV pool is a plain one), replaced by the qkv GEMM, this op's
kernel, the attention with save_kv_cache=False (as SGLang's Qwen3-MoE path calls it), o_proj.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.kernels.kv_store import spec as _kv_store_spec
from astra_sglang.kernels.rope import spec as _rope_spec
from astra_sglang.kernels.rope_store import spec as _rope_store_spec
from astra_sglang.spec import Shape, SourceFile, Variant

HEAD_DIMS = _rope_store_spec.HEAD_DIMS

# Models whose attention is one of REPLACES (rope, then the attention's KV store), and the TP degrees. Gemma-2's rows
# (head_dim 256 on the 2b and 9b) came after the Llama-only records of 2026-11-26; Qwen2.5's and Mixtral's on
# 2026-11-29 (Mixtral-8x7B at TP 2 has Llama-3-8B's TP-2 heads, so it adds no row of its own); Gemma-1's on
# 2026-12-01 (the 2b's one kv head of 256; the 7b's 16, whose 8192-byte KV rows the store launchers instantiate since
# then, as SGLang's JIT store does any width; first run on an H200 the same day, results/2026-12-01-h200/session34/).
DENSE_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("llama-3-8b", (1, 2)),
    ("llama-3-70b", (4, 8)),
    ("gemma-2-2b", (1,)),
    ("gemma-2-9b", (1,)),
    ("gemma-2-27b", (1, 2)),
    ("gemma-2b", (1,)),
    ("gemma-7b", (1,)),
    ("qwen2.5-7b", (1,)),
    ("mixtral-8x7b", (2,)),
)

# The attention forwards the patch replaces: the same body in 0.5.17 and 0.5.23 (tests/test_op_dense_rope_store.py
# reads each from the installed sources).
REPLACES: Tuple[str, ...] = (
    "sglang.srt.models.llama:LlamaAttention.forward",
    "sglang.srt.models.gemma2:Gemma2Attention.forward",
    "sglang.srt.models.gemma:GemmaAttention.forward",
    "sglang.srt.models.qwen2:Qwen2Attention.forward",
    "sglang.srt.models.qwen2_moe:Qwen2MoeAttention.forward",
    "sglang.srt.models.mixtral:MixtralAttention.forward",
)

# rope_store's seven dims, then q_out's token stride (hq * head_dim for the patch's contiguous q_out)
DIM_NAMES = _rope_store_spec.DIM_NAMES + ("q_out_stride",)


def _dims(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    """rope_store's dims (q, k, v column blocks of the qkv output), q_out its own contiguous [t, hq * d] buffer."""
    return qkv.with_q_out(_rope_store_spec._dims(t, hq, hk, d))


model_dims = qkv.model_dims_of(_dims)  # the profile's speedup lookup: dims from a model's config.json


def _supports(dims, dtype: str) -> Optional[str]:
    if len(dims) != len(DIM_NAMES):
        return f"{len(dims)} dims, not {len(DIM_NAMES)}"
    if dims[7] < dims[1] * dims[3]:
        return "a row stride shorter than its heads (q_out)"
    return _rope_store_spec._supports(dims[:7], dtype) or _kv_store_spec.store_row_problem(dims[2], dims[3], dtype)


def _with_q_out(s: Shape) -> Shape:
    return Shape(qkv.with_q_out(s.dims), s.tags, s.source)


# q_out contiguous in every shape (q_out_stride = q heads * head_dim): the harness poisons all of q_out and checks
# every element was written, so a wider q_out row would leave poison; the in-place q_out = q is the patch's alone
EDGE = tuple(e for e in (_with_q_out(s) for s in _rope_store_spec.EDGE) if _supports(e.dims, "fp16") is None)
_GPTJ = {qkv.with_q_out(d) for d in _rope_store_spec._GPTJ}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """rope_store's inputs (its module's MAX_POSITION and cache_slots), and q_out [tokens, q_out_stride]."""
    import torch

    inp = _rope_store_spec.make_inputs(dims[:7], dtype, gen, dist, device)
    inp["q_out"] = torch.empty((dims[0], dims[7]), device=device, dtype=inp["q"].dtype)  # an output: poisoned
    return inp


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """rope_store's fp64 reference, q's rotated heads as q_out (in q_out's shape) instead of q: q is an input.
    Works on the harness's [tokens, stride] row buffers and on the patch's [tokens, heads, head_dim] views."""
    hq, d = dims[1], dims[3]
    ref = dict(_rope_store_spec.reference(inp, dims[:7], scalars))
    qo = ref.pop("q")
    n = qo.shape[0]
    # q_out's shape; a caller that hands inputs only (harness/oracle.py reference_walk) gets q's heads' shape
    q = inp["q"]
    shape = inp["q_out"].shape if "q_out" in inp else (q.shape if q.dim() == 3 else (n, hq * d))
    ref["q_out"] = qo.reshape(n, -1)[:, : hq * d].reshape(shape)
    return ref


# The launcher relies in each header on what its sibling launchers rely on: rope's and kv_store's facts.
SOURCE_FACTS = _rope_spec.SPEC.variant("jit").source_facts + _kv_store_spec.SPEC.variant("jit").source_facts

JIT = Variant(
    name="jit",
    description="SGLang's two JIT kernels back to back on one stream, as dense attention runs them: "
    "FusedRopeKernel::run (fused_rope_kernel, rope_dim = head_dim, no store), then the attention backend's "
    "StoreKVCacheKernel (0.5.17: store_kvcache; 0.5.23: store_kvcache_kernel), int64 positions and slots, PDL "
    "between them on sm_90+",
    provenance="sglang/srt/models/llama.py LlamaAttention.forward -> forward_prepare_native -> "
    "self.rotary_emb(positions, q, k) -> RotaryEmbedding.forward_cuda -> "
    "apply_rope_with_cos_sin_cache_inplace(fused_args=None) -> csrc/elementwise/rope.cuh FusedRopeKernel::run; then "
    "self.attn(q, k, v, forward_batch) -> attention backend -> MHATokenToKVPool.set_kv_buffer -> _set_kv_buffer_impl "
    "-> store_cache -> csrc/elementwise/kvcache.cuh StoreKVCacheKernel",
    sources=(SourceFile("sglang_jit", "csrc/elementwise/rope.cuh"),
             SourceFile("sglang_jit", "csrc/elementwise/kvcache.cuh")),
    include_roots=("tvm_ffi", "dlpack"),
    launcher="launch_jit.cu.in",
    flag_profile="sglang_jit",
    source_facts=SOURCE_FACTS,
    dtypes=qkv.DTYPES,
    supports=_supports,
)

SPEC = qkv.spec(
    name="dense_rope_store",
    summary="FUSED rope + KV store of dense (Llama, Gemma-2, Qwen2, Mixtral) attention in one launch, q into its own "
    "contiguous q_out (replaces SGLang's rope kernel, then the attention backend's KV store; speedups are over the sum "
    "of the two kernels)",
    dim_names=DIM_NAMES,
    # q an input (check fails a kernel that changes it), q_out an output (poisoned, compared), k in place
    pointers=(("q", "in"), ("q_out", "out"), ("k", "inout"), ("v", "in"), ("k_cache", "inout"),
              ("v_cache", "inout"), ("cos_sin_cache", "in"), ("positions", "in"), ("out_loc", "in")),
    scalar_args=(("is_neox", "i64"),),
    variant=JIT,
    corpus=qkv.corpus(DENSE_MODELS, _dims),
    edge_shapes=EDGE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=qkv.neox_scalars(_GPTJ),
    bytes_moved=_rope_store_spec.bytes_moved,  # q read, q_out written: the bytes of q in place
    distributions=("normal", "large"),
    replaces=REPLACES,
    # only ours: SGLang's two kernels are attributed to the rope and kv_store ops
    kernel_symbols=(r"astra_drs::",),
    fuses=("rope", "kv_store"),
    launcher_only=qkv.launcher_q_copy,  # bench: at 1 token serving makes no q copy (fa3 takes the row as it is)
)
