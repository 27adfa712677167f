"""The patch adapter of a fused op with two call sites, both replaced methods (patch/adapters.py holds the machinery
and says what each field means):
- SGLang's Qwen3MoeAttention.apply_qk_norm_rope (0.5.17, 0.5.23), whose body on a CUDA server with a bf16 KV cache is
  two kernels back to back, the JIT q/k RMSNorm in place (models.utils.apply_qk_norm -> fused_inplace_qknorm) and the
  JIT rope + KV store (RotaryEmbedding.forward_cuda with a fused_set_kv_buffer_arg -> apply_rope_inplace_with_kvcache);
- dense Qwen3's Qwen3Attention.forward: the qkv GEMM, the same q/k norm, the JIT rope, then the attention, whose
  backend stores the KV first (MHATokenToKVPool.set_kv_buffer -> store_cache) and o_proj. Replaced, it runs the GEMM,
  this op's kernel (the store included) and the attention with save_kv_cache=False, as SGLang's own Qwen3-MoE path
  does, wherever SGLang would fuse the store there (enable_fused_set_kv_buffer: a bf16 MHA pool, no SWA, no
  context parallelism).
`expand` reads the tensors the kernels would get from the attention module and the batch, and declines (the method
runs as before) wherever SGLang would take another path. At both sites the kernel norms and rotates k in place (and
stores it with v) and q into a fresh contiguous q_out, which `returns` hands on as the q the attention gets (MoE: the
method's q; dense: the attention's).

Why q_out: handed the column view of qkv (rows q_size + 2 kv_size apart), SGLang 0.5.17's fa3 backend copies q
(q.contiguous()), one more kernel a layer from batch 2 on; SGLang's own Qwen3 path pays it too (its q/k norm and rope
are in place). With q_out separate the kernel never writes q, so a failed self-check (patch/ops.py restores the
in-place outputs, here k and the cache rows, then reruns SGLang's sequence) has SGLang's own q to rerun on."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.rope_store.adapter import _rope_store_normalize
from astra_sglang.patch.adapters import OpAdapter, attention_q, env_switch, new_q_out, q_for_sglang, q_out_stride

# ASTRA_QKRS_Q_OUT=0 (dev): q back in place in the qkv output (q_out is q's own view, q_out_stride = q_stride) and the
# method / the attention handed the column view as before q_out existed: arm A of the step A/B that measures the copy
# q_out saves (`e2e --step ... --arm-env A:ASTRA_QKRS_Q_OUT=0`). Read when the adapter is imported (a worker's
# environment), as the other adapters' switches. Off, a failed self-check restores k but not q (q is an input, not
# snapshotted): SGLang's sequence then reruns on the q the kernel already normed and rotated, so that one call's q is
# wrong before the op disables itself. On (the default) q is never written.
Q_OUT = env_switch("ASTRA_QKRS_Q_OUT", True)
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to run expand on the CPU)


def _with_q_out(c: Dict[str, Any]) -> Dict[str, Any]:
    """c with the attention's q: its own token-major [t, hq, d] buffer, or (switch off) q itself, in place."""
    c["q_out"] = new_q_out(c["q"], Q_OUT)
    return c


def _qknorm_path(attn, head_dim: int, dtype) -> Any:
    """None where apply_qk_norm would run SGLang's fused in-place q/k norm (the kernel this op fuses), else why
    not. The conditions are apply_qk_norm's own, read through the names its module binds."""
    from sglang.srt.models import utils as mutils

    qn, kn = attn.q_norm, attn.k_norm
    if qn.variance_epsilon != kn.variance_epsilon:
        return "q and k norms have different eps (SGLang runs two RMSNorm layers)"
    try:
        if mutils.envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get():
            return "deterministic inference (SGLang runs two RMSNorm layers)"
        if mutils.get_exec().graph.cuda_graph_config.prefill.tc_compiler == "inductor":
            return "inductor compiles the q/k norm"
    except ValueError:  # runtime config not published (outside a server): apply_qk_norm's defaults
        pass
    if not mutils.can_use_fused_inplace_qknorm(head_dim, dtype):
        return f"SGLang's fused q/k norm does not take head_dim {head_dim} / {dtype}"
    return None


def _rope_path(rope) -> Any:
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    if type(rope).forward_cuda is not RotaryEmbedding.forward_cuda:
        return f"{type(rope).__name__} has its own forward_cuda"
    if getattr(rope, "_force_native", False):  # 0.5.23: an RL on-policy target pins SGLang's native rope
        return "the rotary embedding is pinned to its native path (an RL on-policy target)"
    if getattr(rope, "use_fallback_kernel", False):
        return "the rotary embedding uses its fallback kernel"
    if rope.head_size != rope.rotary_dim:
        return f"partial rotary ({rope.rotary_dim} of {rope.head_size})"
    return None


def _expand_moe(a: Dict[str, Any]):
    """apply_qk_norm_rope(self, qkv, positions, forward_batch) -> canonical arguments, or why SGLang keeps it."""
    import torch
    from sglang.srt.models import utils as mutils

    attn, qkv, positions, fb = a["self"], a["qkv"], a["positions"], a["forward_batch"]
    if getattr(attn, "use_fused_qk_norm_rope", False) or getattr(attn, "use_fused_qk_norm_rope_cpu", False):
        return "SGLang's own fused q/k norm + rope path is enabled"
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 2 or qkv.device.type not in DEVICES:
        return "qkv is not a 2-D CUDA tensor"
    d, hq, hk = attn.head_dim, attn.num_heads, attn.num_kv_heads
    why = _qknorm_path(attn, d, qkv.dtype) or _rope_path(attn.rotary_emb)
    if why:
        return why
    if not (attn.compatible_with_fused_kv_buffer and mutils.enable_fused_set_kv_buffer(fb)):
        return "no fused KV store on this call (SGLang stores the KV in attention)"
    rope = attn.rotary_emb
    t = qkv.shape[0]
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    arg = mutils.create_fused_set_kv_buffer_arg(value=v, layer=attn.attn, forward_batch=fb)
    return _with_q_out({
        "q": q.view(t, hq, d), "k": k.view(t, hk, d), "v": v, "k_cache": arg.k_buffer, "v_cache": arg.v_buffer,
        "q_weight": attn.q_norm.weight, "k_weight": attn.k_norm.weight, "cos_sin_cache": rope.cos_sin_cache,
        "positions": positions, "out_loc": arg.cache_loc, "is_neox": rope.is_neox_style,
        "eps": float(attn.q_norm.variance_epsilon),
        # for returns: the method's result and its side effect
        "layer": attn, "qkv": qkv, "sizes": [attn.q_size, attn.kv_size, attn.kv_size],
    })


def _dense_store_path(attn, fb) -> Any:
    """None where the dense attention's KV store is the plain row store this op fuses (the store SGLang's own fused
    Qwen3-MoE path replaces), else why not."""
    from sglang.srt.models import utils as mutils

    layer = attn.attn
    if getattr(layer, "is_cross_attention", False) or layer.k_scale is not None or layer.v_scale is not None:
        return "cross attention or a scaled KV cache"
    if not mutils.enable_fused_set_kv_buffer(fb):
        return "no fused KV store on this call (SGLang fuses it only into a bf16 MHA pool without SWA or CP)"
    pool = mutils.get_token_to_kv_pool()
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    if isinstance(pool, MHATokenToKVPool) and type(pool) is not MHATokenToKVPool:
        return f"{type(pool).__name__} stores rows its own way"
    if getattr(pool, "use_hnd", False) or getattr(pool, "kv_cache_layout", "nhd") != "nhd":
        return "the KV pool is not in the NHD row layout"
    if getattr(pool, "store_dtype", pool.dtype) != pool.dtype:
        return "the KV pool stores another dtype"
    return None


def _dense_canonical(attn, positions, hs, fb) -> Dict[str, Any]:
    """A dense attention forward's own work up to the fused kernel: the qkv GEMM and the split; -> the canonical
    tensors of a rope + KV store (the pool layer's caches and slots as SGLang's fused path takes them) and what
    `_attend_without_store` needs. Called once every reason to decline is behind."""
    from sglang.srt.models import utils as mutils

    d, hq, hk = attn.head_dim, attn.num_heads, attn.num_kv_heads
    qkv, _ = attn.qkv_proj(hs)
    t = qkv.shape[0]
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    arg = mutils.create_fused_set_kv_buffer_arg(value=v, layer=attn.attn, forward_batch=fb)
    rope = attn.rotary_emb
    return {
        "q": q.view(t, hq, d), "k": k.view(t, hk, d), "v": v, "k_cache": arg.k_buffer, "v_cache": arg.v_buffer,
        "cos_sin_cache": rope.cos_sin_cache, "positions": positions, "out_loc": arg.cache_loc,
        "is_neox": rope.is_neox_style,
        # for returns: the rest of the method (attention without its own store, o_proj)
        "site": "dense", "layer": attn, "forward_batch": fb, "qkv": qkv,
        "sizes": [attn.q_size, attn.kv_size, attn.kv_size],
    }


def _expand_dense(a: Dict[str, Any]):
    """Qwen3Attention.forward(self, positions, hidden_states, forward_batch) -> canonical arguments, or why SGLang
    keeps it. Every reason to decline comes before the qkv GEMM: after it, SGLang's kernel sequence serves what the
    kernel does not take (patch/apply.py not_covered)."""
    import torch
    from sglang.srt.models import utils as mutils

    attn, positions, hs, fb = a["self"], a["positions"], a["hidden_states"], a["forward_batch"]
    if not isinstance(hs, torch.Tensor) or hs.device.type not in DEVICES or hs.dim() != 2:
        return "hidden_states is not a 2-D CUDA tensor"
    try:
        if mutils.get_exec().deterministic.rl_on_policy_target is not None:
            return "RL on-policy target (the method casts q and k to bf16)"
    except ValueError:  # runtime config not published (outside a server): the method's default
        pass
    if getattr(attn, "use_fused_qk_norm_mrope", False) or getattr(attn, "use_fused_qk_norm_rope", False):
        return "SGLang's own fused q/k norm + rope + KV store path (aiter) is enabled"
    why = _dense_store_path(attn, fb) or _qknorm_path(attn, attn.head_dim, hs.dtype) or _rope_path(attn.rotary_emb)
    if why:
        return why
    return _with_q_out({**_dense_canonical(attn, positions, hs, fb), "q_weight": attn.q_norm.weight,
                        "k_weight": attn.k_norm.weight, "eps": float(attn.q_norm.variance_epsilon)})


def _expand_either(a: Dict[str, Any]):
    """The call site by its parameters: dense Qwen3Attention.forward has hidden_states, the MoE method qkv."""
    return _expand_dense(a) if "hidden_states" in a else _expand_moe(a)


def _normalize(c):
    """The weights, rope_store's checks of q, k, v, the caches, positions and slots, then q_out's (q_out_stride the
    last dim)."""
    w = c["q"].shape[-1]
    for n in ("q_weight", "k_weight"):
        x = c[n]
        if tuple(x.shape) != (w,) or not x.is_contiguous():
            return f"{n} {tuple(x.shape)} is not a contiguous ({w},)"
    res = _rope_store_normalize(c)
    if isinstance(res, str):
        return res
    views, dims = res
    qos = q_out_stride(c, dims)
    if isinstance(qos, str):
        return qos
    # the call site travels with the views: the self-check's expected result runs that site's kernel sequence
    views.update(q_out=c["q_out"], q_weight=c["q_weight"], k_weight=c["k_weight"], site=c.get("site", "moe"))
    return views, dims + (qos,)


def _sequence(c: Dict[str, Any]) -> None:
    """SGLang's kernels on canonical tensors: the fused q/k norm in place, then rope + KV store (Qwen3-MoE: one
    kernel; dense: the rope, then the store the attention backend makes, store_cache, every slot written as the
    fused kernel writes it). Where q_out is apart from q, q's rows are copied there first and both kernels run in
    place on q_out, q left as it was; where q_out is q (ASTRA_QKRS_Q_OUT=0) or absent, on q itself."""
    from sglang.kernels.ops.attention.rope import apply_rope_inplace_with_kvcache
    from sglang.kernels.ops.layernorm.norm import fused_inplace_qknorm

    q, k, v = q_for_sglang(c), c["k"], c["v"]
    t, hk, d = k.shape[0], k.shape[1], k.shape[2]
    neox = bool(int(c["is_neox"]))
    fused_inplace_qknorm(q=q, k=k, q_weight=c["q_weight"], k_weight=c["k_weight"], eps=float(c["eps"]),
                         head_dim=d)
    if c.get("site") == "dense":
        _rope_then_store({**c, "q": q, "q_out": q})  # the normed q, rotated where it is (no second copy)
    else:
        apply_rope_inplace_with_kvcache(q, k, v.reshape(t, hk, d), c["k_cache"], c["v_cache"], c["cos_sin_cache"],
                                        c["positions"], c["out_loc"], is_neox=neox)


def _rope_then_store(c: Dict[str, Any]) -> None:
    """Dense attention's two SGLang kernels on canonical tensors: the JIT rope in place, then the store the attention
    backend makes (store_cache), every slot written as the fused kernel writes it. Where the canonical dict has a
    q_out apart from q (dense_rope_store: q's own buffer) q's rows are copied there first and the rope rotates them
    in place there, q left as it was; where q_out is q or absent, the rope rotates q itself (qknorm_rope_store's
    dense site hands its already normed q_out as q)."""
    from sglang.kernels.ops.attention.rope import apply_rope_with_cos_sin_cache_inplace
    from sglang.kernels.ops.kvcache.kvcache import store_cache

    q, k, v = q_for_sglang(c), c["k"], c["v"]
    t, hk, d = k.shape[0], k.shape[1], k.shape[2]
    apply_rope_with_cos_sin_cache_inplace(q=q, k=k, cos_sin_cache=c["cos_sin_cache"], positions=c["positions"],
                                          is_neox=bool(int(c["is_neox"])))
    store_cache(k.reshape(t, hk * d), v.reshape(t, hk * d), c["k_cache"], c["v_cache"], c["out_loc"],
                reserved_skip_index=-1)


def _attend_without_store(c: Dict[str, Any]):
    """The rest of a dense attention forward after q/k/v are ready and the KV is stored: the attention reads the KV
    this op stored (save_kv_cache=False, as SGLang's Qwen3-MoE path calls it), then o_proj. The attention's q is
    q_out ([tokens, q_size], contiguous: fa3 copies a strided q) where the canonical dict has one apart from q
    (dense_rope_store, qknorm_rope_store's dense site), else q's column view of qkv."""
    attn = c["layer"]
    q, k, v = c["qkv"].split(c["sizes"], dim=-1)
    out, _ = attn.o_proj(attn.attn(attention_q(c, q), k, v, c["forward_batch"], save_kv_cache=False))
    return out


def _returns(c: Dict[str, Any]):
    if c.get("site") == "dense":
        return _attend_without_store(c)
    # the method's non-fused branch: q, k, v, and the flag forward_core reads to skip the attention's own KV store
    # (the store happened here). q is q_out ([tokens, q_size], contiguous) where it is apart from q, else q's column
    # view of qkv as SGLang returns it; k and v are always column views. The caller (forward_prepare_native) hands
    # q, k, v unchanged to forward_core, which calls self.attn(q, k, v, ...).
    c["layer"]._used_fused_qk_norm_rope_last_call = False
    q, k, v = c["qkv"].split(c["sizes"], dim=-1)
    return attention_q(c, q), k, v


ADAPTER = OpAdapter(
    op="qknorm_rope_store",
    data="q",
    same_dtype=("q", "q_out", "k", "v", "k_cache", "v_cache", "q_weight", "k_weight"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "q_out", "k", "v", "positions", "out_loc"),
    normalize=_normalize,
    returns=_returns,
    expand=_expand_either,
    sequence=_sequence,
    slot_indexed={"k_cache": "out_loc", "v_cache": "out_loc"},
)
