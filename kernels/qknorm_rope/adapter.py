"""The patch adapter of a fused op: SGLang's dense Qwen3Attention.forward_prepare_native (0.5.17, 0.5.23), whose body
on CUDA is the qkv GEMM, then two kernels back to back: the JIT q/k RMSNorm in place (models.utils.apply_qk_norm ->
fused_inplace_qknorm) and the JIT rope in place (RotaryEmbedding.forward_cuda -> apply_rope_with_cos_sin_cache_inplace,
no KV store: attention stores the KV later). The method is replaced; `expand` checks first that SGLang would take that
path (else the method runs as before), then runs the layer's own qkv GEMM and hands the two kernels' tensors to the
fused kernel. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.qknorm.adapter import _qknorm_normalize
from astra_sglang.kernels.qknorm_rope_store.adapter import _qknorm_path, _rope_path
from astra_sglang.patch.adapters import OpAdapter

from .spec import HEAD_DIMS


def _expand(a: Dict[str, Any]):
    """forward_prepare_native(self, positions, hidden_states) -> canonical arguments, or why SGLang keeps it."""
    import torch

    attn, positions, hs = a["self"], a["positions"], a["hidden_states"]
    if not isinstance(hs, torch.Tensor) or hs.device.type != "cuda" or hs.dim() != 2:
        return "hidden_states is not a 2-D CUDA tensor"
    d, hq, hk = attn.head_dim, attn.num_heads, attn.num_kv_heads
    # every reason to decline comes before the GEMM: after it, SGLang's kernel sequence serves what the kernel
    # does not take (patch/apply.py not_covered)
    why = _qknorm_path(attn, d, hs.dtype) or _rope_path(attn.rotary_emb)
    if why:
        return why
    if d not in HEAD_DIMS:
        return f"head_dim {d} not in {HEAD_DIMS}"
    qkv, _ = attn.qkv_proj(hs)
    t = qkv.shape[0]
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    rope = attn.rotary_emb
    return {
        "q": q.view(t, hq, d), "k": k.view(t, hk, d), "q_weight": attn.q_norm.weight, "k_weight": attn.k_norm.weight,
        "cos_sin_cache": rope.cos_sin_cache, "positions": positions, "is_neox": int(bool(rope.is_neox_style)),
        "eps": float(attn.q_norm.variance_epsilon),
        "qkv": qkv, "sizes": [attn.q_size, attn.kv_size, attn.kv_size],  # for returns
    }


def _normalize(c):
    """qknorm's checks of q, k and the weights (the same views and dims), then the rope's cache and positions."""
    import torch

    res = _qknorm_normalize(c)
    if isinstance(res, str):
        return res
    views, dims = res
    t, d = dims[0], dims[3]
    cache, pos = c["cos_sin_cache"], c["positions"]
    if cache.dim() != 2 or cache.shape[1] != d or not cache.is_contiguous():
        return f"cos_sin_cache {tuple(cache.shape)} is not a contiguous [max_position, {d}] (rope_dim = head_dim)"
    if pos.dtype != torch.int64 or tuple(pos.shape) != (t,) or not pos.is_contiguous():
        return f"positions {pos.dtype} {tuple(pos.shape)} is not a contiguous int64 [{t}]"
    views.update(cos_sin_cache=cache, positions=pos)
    return views, dims


def _sequence(c: Dict[str, Any]) -> None:
    """SGLang's two kernels on canonical tensors: the fused q/k norm in place, then the rope in place."""
    from sglang.kernels.ops.attention.rope import apply_rope_with_cos_sin_cache_inplace
    from sglang.kernels.ops.layernorm.norm import fused_inplace_qknorm

    q, k = c["q"], c["k"]
    fused_inplace_qknorm(q=q, k=k, q_weight=c["q_weight"], k_weight=c["k_weight"], eps=float(c["eps"]),
                         head_dim=q.shape[-1])
    apply_rope_with_cos_sin_cache_inplace(q=q, k=k, cos_sin_cache=c["cos_sin_cache"], positions=c["positions"],
                                          is_neox=bool(int(c["is_neox"])))


def _returns(c: Dict[str, Any]):
    return c["qkv"].split(c["sizes"], dim=-1)  # the method's q, k, v: column views of qkv


ADAPTER = OpAdapter(
    op="qknorm_rope",
    data="q",
    same_dtype=("q", "k", "q_weight", "k_weight"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "k", "positions"),
    normalize=_normalize,
    returns=_returns,
    expand=_expand,
    sequence=_sequence,
)
