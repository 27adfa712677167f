"""The patch adapter: how SGLang's q/k norm callables (sglang.kernels.ops.layernorm.norm.fused_inplace_qknorm,
its custom-op registration in sglang.srt.models.utils, the JIT qknorm module) map onto this op's kernel ABI.
patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter

from .spec import HEAD_DIMS


def _qknorm_normalize(c):
    """q [T, Hq, D] and k [T, Hk, D] with unit element and head strides (views into the qkv output);
    the token strides may be anything, as in SGLang's kernel."""
    q, k, qw, kw = c["q"], c["k"], c["q_weight"], c["k_weight"]
    if q.dim() != 3 or k.dim() != 3:
        return f"q {tuple(q.shape)} / k {tuple(k.shape)} are not [tokens, heads, head_dim]"
    t, hq, d = q.shape
    if k.shape[0] != t or k.shape[2] != d:
        return f"k shape {tuple(k.shape)} does not match q {tuple(q.shape)}"
    if d not in HEAD_DIMS:
        return f"head_dim {d} not in {HEAD_DIMS}"
    if tuple(qw.shape) != (d,) or tuple(kw.shape) != (d,):
        return f"weights {tuple(qw.shape)} / {tuple(kw.shape)} are not ({d},)"
    if not (qw.is_contiguous() and kw.is_contiguous()):
        return "a weight is not contiguous"
    for n, x in (("q", q), ("k", k)):
        if x.stride(2) != 1 or (x.shape[1] > 1 and x.stride(1) != d):
            return f"{n} strides {tuple(x.stride())} are not (row, head_dim, 1)"
    hk = k.shape[1]
    qs = q.stride(0) if t > 1 else hq * d
    ks = k.stride(0) if t > 1 else hk * d
    views = {"q": q, "k": k, "q_weight": qw, "k_weight": kw}
    return views, (t, hq, hk, d, qs, ks)


ADAPTER = OpAdapter(
    op="qknorm",
    data="q",
    same_dtype=("q", "k", "q_weight", "k_weight"),
    rowwise=("q", "k"),
    # head_dim is q.size(-1) in every SGLang call (apply_qk_norm views q as [T, -1, head_dim]);
    # normalize reads it from the tensor.
    ignorable=frozenset({"head_dim"}),
    normalize=_qknorm_normalize,
    returns=lambda c: None,
    jit_routes={
        # sglang.kernels.ops.layernorm.norm._jit_qknorm_module(head_dim, dtype).qknorm(q, k, q_weight, k_weight, eps)
        "elementwise/qknorm.cuh": (JitRoute("qknorm", ("q", "k", "q_weight", "k_weight", "eps")),),
    },
)
