"""The patch adapter of a fused op: SGLang's Qwen3MoeAttention.apply_qk_norm_rope (0.5.17, 0.5.23), whose body on a
CUDA server with a bf16 KV cache is two kernels back to back, the JIT q/k RMSNorm in place (models.utils.apply_qk_norm
-> fused_inplace_qknorm) and the JIT rope + KV store (RotaryEmbedding.forward_cuda with a fused_set_kv_buffer_arg ->
apply_rope_inplace_with_kvcache). The method is replaced; `expand` reads the tensors the two kernels would get from the
attention module and the batch, and declines (the method runs as before) wherever SGLang would take another path.
patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.rope_store.adapter import _rope_store_normalize
from astra_sglang.patch.adapters import OpAdapter


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
    if getattr(rope, "use_fallback_kernel", False):
        return "the rotary embedding uses its fallback kernel"
    if rope.head_size != rope.rotary_dim:
        return f"partial rotary ({rope.rotary_dim} of {rope.head_size})"
    return None


def _expand(a: Dict[str, Any]):
    """apply_qk_norm_rope(self, qkv, positions, forward_batch) -> canonical arguments, or why SGLang keeps it."""
    import torch
    from sglang.srt.models import utils as mutils

    attn, qkv, positions, fb = a["self"], a["qkv"], a["positions"], a["forward_batch"]
    if getattr(attn, "use_fused_qk_norm_rope", False) or getattr(attn, "use_fused_qk_norm_rope_cpu", False):
        return "SGLang's own fused q/k norm + rope path is enabled"
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 2 or qkv.device.type != "cuda":
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
    return {
        "q": q.view(t, hq, d), "k": k.view(t, hk, d), "v": v, "k_cache": arg.k_buffer, "v_cache": arg.v_buffer,
        "q_weight": attn.q_norm.weight, "k_weight": attn.k_norm.weight, "cos_sin_cache": rope.cos_sin_cache,
        "positions": positions, "out_loc": arg.cache_loc, "is_neox": rope.is_neox_style,
        "eps": float(attn.q_norm.variance_epsilon),
        # for returns: the method's result and its side effect
        "layer": attn, "qkv": qkv, "sizes": [attn.q_size, attn.kv_size, attn.kv_size],
    }


def _normalize(c):
    w = c["q"].shape[-1]
    for n in ("q_weight", "k_weight"):
        x = c[n]
        if tuple(x.shape) != (w,) or not x.is_contiguous():
            return f"{n} {tuple(x.shape)} is not a contiguous ({w},)"
    res = _rope_store_normalize(c)
    if isinstance(res, str):
        return res
    views, dims = res
    views.update(q_weight=c["q_weight"], k_weight=c["k_weight"])
    return views, dims


def _sequence(c: Dict[str, Any]) -> None:
    """SGLang's two kernels on canonical tensors: the fused q/k norm in place, then rope + KV store."""
    from sglang.kernels.ops.attention.rope import apply_rope_inplace_with_kvcache
    from sglang.kernels.ops.layernorm.norm import fused_inplace_qknorm

    q, k, v = c["q"], c["k"], c["v"]
    t, hk, d = k.shape[0], k.shape[1], k.shape[2]
    fused_inplace_qknorm(q=q, k=k, q_weight=c["q_weight"], k_weight=c["k_weight"], eps=float(c["eps"]),
                         head_dim=d)
    apply_rope_inplace_with_kvcache(q, k, v.reshape(t, hk, d), c["k_cache"], c["v_cache"], c["cos_sin_cache"],
                                    c["positions"], c["out_loc"], is_neox=bool(int(c["is_neox"])))


def _returns(c: Dict[str, Any]):
    # the method's non-fused branch: q, k, v column views of qkv, and the flag forward_core reads to skip the
    # attention's own KV store (the store happened here)
    c["layer"]._used_fused_qk_norm_rope_last_call = False
    return c["qkv"].split(c["sizes"], dim=-1)


ADAPTER = OpAdapter(
    op="qknorm_rope_store",
    data="q",
    same_dtype=("q", "k", "v", "k_cache", "v_cache", "q_weight", "k_weight"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "k", "v", "positions", "out_loc"),
    normalize=_normalize,
    returns=_returns,
    expand=_expand,
    sequence=_sequence,
    slot_indexed={"k_cache": "out_loc", "v_cache": "out_loc"},
)
