"""dense_rope_store: a FUSED op. Rotary embedding of q and k in place, with the rotated k and the untouched v stored
into the KV cache at each token's slot, in one launch, where dense (Llama-style) attention on a bf16 KV cache runs two
SGLang kernels: the JIT rope (csrc/elementwise/rope.cuh FusedRopeKernel::run, op rope), then, inside the attention
backend, the JIT KV store (csrc/elementwise/kvcache.cuh StoreKVCacheKernel, op kv_store). Production is those two
launches on one stream, exactly as SGLang makes them; a speedup of this op is over their SUM.

The computation is rope_store's (SGLang's own fused rope + KV store, which it runs only in MoE attention such as
Qwen3-MoE's); its contract, inputs, reference and bytes are taken from there. The patch replaces the forward of
`LlamaAttention` (Llama, Mistral), `Gemma2Attention`, `Qwen2Attention` (Qwen2 / Qwen2.5), `Qwen2MoeAttention` and
`MixtralAttention`: one body in all five (qkv GEMM, split, rope, attention, o_proj; Gemma-2's sliding window lives in
the attention and its KV pool is a plain one), replaced by the qkv GEMM, this op's kernel, the attention with
save_kv_cache=False (as SGLang's Qwen3-MoE path calls it), o_proj.
"""
from __future__ import annotations

from typing import Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.kernels.kv_store import spec as _kv_store_spec
from astra_sglang.kernels.rope import spec as _rope_spec
from astra_sglang.kernels.rope_store import spec as _rope_store_spec
from astra_sglang.spec import SourceFile, Variant

HEAD_DIMS = _rope_store_spec.HEAD_DIMS

# Models whose attention is one of REPLACES (rope, then the attention's KV store), and the TP degrees. Gemma-2's rows
# (head_dim 256 on the 2b and 9b) came after the Llama-only records of 2026-11-26; Qwen2.5's and Mixtral's on
# 2026-11-29 (Mixtral-8x7B at TP 2 has Llama-3-8B's TP-2 heads, so it adds no row of its own).
DENSE_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("llama-3-8b", (1, 2)),
    ("llama-3-70b", (4, 8)),
    ("gemma-2-2b", (1,)),
    ("gemma-2-9b", (1,)),
    ("gemma-2-27b", (1, 2)),
    ("qwen2.5-7b", (1,)),
    ("mixtral-8x7b", (2,)),
)

# The attention forwards the patch replaces: the same body in 0.5.17 and 0.5.23 (tests/test_op_dense_rope_store.py
# reads each from the installed sources).
REPLACES: Tuple[str, ...] = (
    "sglang.srt.models.llama:LlamaAttention.forward",
    "sglang.srt.models.gemma2:Gemma2Attention.forward",
    "sglang.srt.models.qwen2:Qwen2Attention.forward",
    "sglang.srt.models.qwen2_moe:Qwen2MoeAttention.forward",
    "sglang.srt.models.mixtral:MixtralAttention.forward",
)

_dims = _rope_store_spec._dims
model_dims = qkv.model_dims_of(_dims)  # the profile's speedup lookup: dims from a model's config.json


def _supports(dims, dtype: str) -> Optional[str]:
    return _rope_store_spec._supports(dims, dtype) or _kv_store_spec.store_row_problem(dims[2], dims[3], dtype)


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
    summary="FUSED rope + KV store of dense (Llama, Gemma-2, Qwen2, Mixtral) attention in one launch (replaces "
    "SGLang's rope kernel, then the attention backend's KV store; speedups are over the sum of the two kernels)",
    dim_names=_rope_store_spec.DIM_NAMES,
    pointers=(("q", "inout"), ("k", "inout"), ("v", "in"), ("k_cache", "inout"), ("v_cache", "inout"),
              ("cos_sin_cache", "in"), ("positions", "in"), ("out_loc", "in")),
    scalar_args=(("is_neox", "i64"),),
    variant=JIT,
    corpus=qkv.corpus(DENSE_MODELS, _dims),
    edge_shapes=tuple(s for s in _rope_store_spec.EDGE if _supports(s.dims, "fp16") is None),
    make_inputs=_rope_store_spec.make_inputs,
    reference=_rope_store_spec.reference,
    scalars=qkv.neox_scalars(_rope_store_spec._GPTJ),
    bytes_moved=_rope_store_spec.bytes_moved,
    distributions=("normal", "large"),
    replaces=REPLACES,
    # only ours: SGLang's two kernels are attributed to the rope and kv_store ops
    kernel_symbols=(r"astra_drs::",),
    fuses=("rope", "kv_store"),
)
