"""The patch adapter of a fused op: SGLang's dense Qwen3Attention.forward_prepare_native (0.5.17, 0.5.23), whose body
on CUDA is the qkv GEMM, then two kernels back to back: the JIT q/k RMSNorm in place (models.utils.apply_qk_norm ->
fused_inplace_qknorm) and the JIT rope in place (RotaryEmbedding.forward_cuda -> apply_rope_with_cos_sin_cache_inplace,
no KV store: attention stores the KV later). The method is replaced; `expand` checks first that SGLang would take that
path (else the method runs as before), then runs the layer's own qkv GEMM and hands the two kernels' tensors and a
fresh contiguous q_out to the fused kernel, which norms and rotates k in place and q into q_out; `returns` gives
(q_out, k, v) as the method's q, k, v. patch/adapters.py holds the machinery and says what each field means.

Why q_out: the method's caller (Qwen3Attention.forward) hands q to self.attn; as the column view of qkv (rows
q_size + 2 kv_size apart) SGLang 0.5.17's fa3 backend copies it (q.contiguous()), one more kernel a layer from batch 2
on; SGLang's own path pays it too (its q/k norm and rope are in place). With q_out separate the kernel never writes q,
so a failed self-check (patch/ops.py restores the in-place outputs, here k, then reruns SGLang's sequence) has
SGLang's own q to rerun on."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.qknorm.adapter import _qknorm_normalize
from astra_sglang.kernels.qknorm_rope_store.adapter import _qknorm_path, _rope_path
from astra_sglang.patch.adapters import OpAdapter, attention_q, env_switch, new_q_out, q_for_sglang, q_out_stride

from .spec import HEAD_DIMS

# ASTRA_QKR_Q_OUT=0 (dev): q back in place in the qkv output (q_out is q's own view, q_out_stride = q_stride) and the
# method returns the column view as before q_out existed: arm A of the step A/B that measures the copy q_out saves
# (`e2e --step ... --arm-env A:ASTRA_QKR_Q_OUT=0`). Read when the adapter is imported (a worker's environment), as
# the other adapters' switches. Off, a failed self-check restores k but not q (q is an input, not snapshotted):
# SGLang's sequence then reruns on the q the kernel already normed and rotated, so that one call's q is wrong before
# the op disables itself. On (the default) q is never written.
Q_OUT = env_switch("ASTRA_QKR_Q_OUT", True)
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to run expand on the CPU)


def _expand(a: Dict[str, Any]):
    """forward_prepare_native(self, positions, hidden_states) -> canonical arguments, or why SGLang keeps it."""
    import torch

    attn, positions, hs = a["self"], a["positions"], a["hidden_states"]
    if not isinstance(hs, torch.Tensor) or hs.device.type not in DEVICES or hs.dim() != 2:
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
    q = q.view(t, hq, d)
    rope = attn.rotary_emb
    return {
        "q": q, "q_out": new_q_out(q, Q_OUT), "k": k.view(t, hk, d), "q_weight": attn.q_norm.weight,
        "k_weight": attn.k_norm.weight,
        "cos_sin_cache": rope.cos_sin_cache, "positions": positions, "is_neox": int(bool(rope.is_neox_style)),
        "eps": float(attn.q_norm.variance_epsilon),
        "qkv": qkv, "sizes": [attn.q_size, attn.kv_size, attn.kv_size],  # for returns
    }


def _normalize(c):
    """qknorm's checks of q, k and the weights (the same views and dims), then q_out's (q_out_stride the last dim) and
    the rope's cache and positions."""
    import torch

    res = _qknorm_normalize(c)
    if isinstance(res, str):
        return res
    views, dims = res
    qos = q_out_stride(c, dims)
    if isinstance(qos, str):
        return qos
    views["q_out"] = c["q_out"]
    t, d = dims[0], dims[3]
    cache, pos = c["cos_sin_cache"], c["positions"]
    if cache.dim() != 2 or cache.shape[1] != d or not cache.is_contiguous():
        return f"cos_sin_cache {tuple(cache.shape)} is not a contiguous [max_position, {d}] (rope_dim = head_dim)"
    if pos.dtype != torch.int64 or tuple(pos.shape) != (t,) or not pos.is_contiguous():
        return f"positions {pos.dtype} {tuple(pos.shape)} is not a contiguous int64 [{t}]"
    views.update(cos_sin_cache=cache, positions=pos)
    return views, dims + (qos,)


def _sequence(c: Dict[str, Any]) -> None:
    """SGLang's two kernels on canonical tensors: the fused q/k norm in place, then the rope in place. Where q_out is
    apart from q, q's rows are copied there first and both kernels run in place on q_out, q left as it was; where
    q_out is q (ASTRA_QKR_Q_OUT=0) or absent, on q itself."""
    from sglang.kernels.ops.attention.rope import apply_rope_with_cos_sin_cache_inplace
    from sglang.kernels.ops.layernorm.norm import fused_inplace_qknorm

    q, k = q_for_sglang(c), c["k"]
    fused_inplace_qknorm(q=q, k=k, q_weight=c["q_weight"], k_weight=c["k_weight"], eps=float(c["eps"]),
                         head_dim=q.shape[-1])
    apply_rope_with_cos_sin_cache_inplace(q=q, k=k, cos_sin_cache=c["cos_sin_cache"], positions=c["positions"],
                                          is_neox=bool(int(c["is_neox"])))


def _returns(c: Dict[str, Any]):
    """The method's q, k, v: q_out ([tokens, q_size], contiguous) as q where it is apart from q, else q's column view of
    qkv as SGLang returns it; k and v column views. The caller (Qwen3Attention.forward, 0.5.17 and 0.5.23) hands them
    to self.attn(q, k, v, forward_batch, ...), under an RL on-policy target after q.to(bfloat16), k likewise (a no-op
    there: forward casts hidden_states to bf16 first)."""
    q, k, v = c["qkv"].split(c["sizes"], dim=-1)
    return attention_q(c, q), k, v


ADAPTER = OpAdapter(
    op="qknorm_rope",
    data="q",
    same_dtype=("q", "q_out", "k", "q_weight", "k_weight"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "q_out", "k", "positions"),
    normalize=_normalize,
    returns=_returns,
    expand=_expand,
    sequence=_sequence,
)
