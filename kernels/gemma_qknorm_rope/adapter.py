"""The patch adapter of a fused op: SGLang's Gemma3Attention.forward_native (0.5.17, 0.5.23; Gemma3Attention.forward
runs it on CUDA). Its body is the qkv GEMM, q_norm and k_norm (Gemma3RMSNorm on the per-head q and k views, [1, heads,
tokens, head_dim] in 0.5.17, token-major in 0.5.23: torch ops),
apply_rotary_pos_emb (torch.compile'd) with the layer's cos/sin rows, the attention (whose backend stores the KV)
and o_proj. The method is replaced; `expand` checks first that the kernel takes the call (else the method runs as
before), then runs the layer's own qkv GEMM and hands q, k (column views of its output), a fresh contiguous q_out, the
norms' weights and the cos/sin rows to the kernel, which norms and rotates k in place and q into q_out; `returns` runs
the attention on q_out, k, v and o_proj as the method does. patch/adapters.py holds the machinery and says what each
field means.

Why q_out: handed the column view of qkv (rows q_size + 2 kv_size apart), SGLang 0.5.17's fa3 backend copies q
(q.contiguous()), one more kernel a layer from batch 2 on (108 us of a 6.65 ms Gemma-3-12B step at batch 2, H200,
results/2026-11-30-h200/session25/); SGLang's own path hands it a token-major q. With q_out separate the kernel never
writes q, so a failed self-check (patch/ops.py: it restores the in-place outputs, here k, then reruns SGLang's
sequence) has SGLang's own inputs to rerun on."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.qknorm.adapter import _qknorm_normalize
from astra_sglang.patch.adapters import OpAdapter, attention_q, env_switch, new_q_out, q_out_stride

from .spec import HEAD_DIMS

# ASTRA_GQKR_Q_OUT=0 (dev): q back in place in the qkv output (q_out is q's own view, q_out_stride = q_stride) and the
# attention handed the column view as before q_out existed: arm A of the step A/B that measures the copy q_out saves
# (`e2e --step ... --arm-env A:ASTRA_GQKR_Q_OUT=0`). Read when the adapter is imported (a worker's environment), as
# the other adapters' switches. Off, a failed self-check restores k but not q (patch/ops.py snapshots only in-place
# outputs, and q is an input): SGLang's sequence then reruns on the q the kernel already wrote, so that one call's q
# is wrong before the op disables itself. On (the default) q is never written.
Q_OUT = env_switch("ASTRA_GQKR_Q_OUT", True)
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to run expand on the CPU)


def _rows_problem(name: str, x, t: int, d: int, dtype) -> str:
    """Why a cos/sin table is not the contiguous [1, t, d] of the model's dtype Gemma3RotaryEmbedding makes ('')."""
    import torch

    if not isinstance(x, torch.Tensor) or x.dtype != dtype or tuple(x.shape) != (1, t, d) or not x.is_contiguous():
        what = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        return f"{name} {what} is not a contiguous [1, {t}, {d}] of the model's dtype"
    return ""


def _norm_problem(norm, d: int, dtype) -> str:
    w = getattr(norm, "weight", None)
    if type(norm).__name__ != "Gemma3RMSNorm" or w is None or tuple(w.shape) != (d,) or w.dtype != dtype:
        return f"q/k norm {type(norm).__name__} is not a Gemma3RMSNorm with a ({d},) weight of the model's dtype"
    return ""


def _expand(a: Dict[str, Any]):
    """forward_native(self, positions, hidden_states, position_embeddings, forward_batch, **kwargs) -> canonical
    arguments, or why SGLang keeps it. Every reason to decline comes before the qkv GEMM: after it, SGLang's own
    sequence serves what the kernel does not take (patch/apply.py not_covered)."""
    import torch

    attn, hs, pe = a["self"], a["hidden_states"], a["position_embeddings"]
    if not isinstance(hs, torch.Tensor) or hs.device.type not in DEVICES or hs.dim() != 2:
        return "hidden_states is not a 2-D CUDA tensor"
    if not isinstance(pe, (tuple, list)) or len(pe) != 2:
        return "position_embeddings is not a (cos, sin) pair"
    d, hq, hk, t = attn.head_dim, attn.num_heads, attn.num_kv_heads, hs.shape[0]
    if d not in HEAD_DIMS:
        return f"head_dim {d} not in {HEAD_DIMS}"
    why = (_rows_problem("cos", pe[0], t, d, hs.dtype) or _rows_problem("sin", pe[1], t, d, hs.dtype)
           or _norm_problem(attn.q_norm, d, hs.dtype) or _norm_problem(attn.k_norm, d, hs.dtype))
    if why:
        return why
    if float(attn.q_norm.eps) != float(attn.k_norm.eps):
        return "q_norm and k_norm have different eps"
    qkv, _ = attn.qkv_proj(hs)
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.view(t, hq, d)
    return {
        "q": q, "q_out": new_q_out(q, Q_OUT), "k": k.view(t, hk, d), "q_weight": attn.q_norm.weight,
        "k_weight": attn.k_norm.weight,
        "cos": pe[0][0], "sin": pe[1][0], "eps": float(attn.q_norm.eps),
        # for returns: the rest of the method (attention, o_proj); for sequence: the layer's own norms
        "layer": attn, "forward_batch": a["forward_batch"], "qkv": qkv,
        "sizes": [attn.q_size, attn.kv_size, attn.kv_size], "q_norm": attn.q_norm, "k_norm": attn.k_norm,
    }


def _normalize(c):
    """qknorm's checks of q, k and the weights (the same views and dims), then q_out's (q_out_stride the last dim) and
    the cos/sin rows."""
    res = _qknorm_normalize(c)
    if isinstance(res, str):
        return res
    views, dims = res
    qos = q_out_stride(c, dims)
    if isinstance(qos, str):
        return qos
    views["q_out"] = c["q_out"]
    t, d = dims[0], dims[3]
    for n in ("cos", "sin"):
        x = c[n]
        if tuple(x.shape) != (t, d) or not x.is_contiguous():
            return f"{n} {tuple(x.shape)} is not a contiguous [{t}, {d}]"
        views[n] = x
    return views, dims + (qos,)


def gemma3_norm(weight, eps: float):
    """SGLang's Gemma3RMSNorm around `weight` (its own, not a copy), built on the CPU: no CUDA work, so the harness
    may call this inside a graph capture (and validate's layer builds its norms so)."""
    import torch
    from sglang.srt.layers.layernorm import Gemma3RMSNorm

    from astra_sglang.patch.layers import construct

    norm = construct(Gemma3RMSNorm, weight.shape[0], eps=float(eps))
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return norm


def _gemma3_norm(c: Dict[str, Any], which: str):
    """The layer's own Gemma3RMSNorm where the call came from a layer; else SGLang's around the op's weight."""
    if c.get(f"{which}_norm") is not None:
        return c[f"{which}_norm"]
    return gemma3_norm(c[f"{which}_weight"], c["eps"])


def _sequence(c: Dict[str, Any]) -> None:
    """SGLang's own sequence on canonical tensors: the two norms on [1, heads, tokens, head_dim] views as
    forward_native makes them, apply_rotary_pos_emb, the results written into q_out (the kernel's q destination; q
    itself when the two are one) and back into k."""
    from sglang.srt.layers.rotary_embedding import apply_rotary_pos_emb

    q, qo, k = c["q"], c["q_out"], c["k"]
    if q.dim() == 2:  # the harness's [tokens, stride] row buffers (abi_dims: harness/installed.py): the heads' views
        t, hq, hk, d = c["abi_dims"][:4]
        q, qo, k = q[:, : hq * d].view(t, hq, d), qo[:, : hq * d].view(t, hq, d), k[:, : hk * d].view(t, hk, d)
    qn = _gemma3_norm(c, "q")(q.transpose(0, 1).unsqueeze(0))
    kn = _gemma3_norm(c, "k")(k.transpose(0, 1).unsqueeze(0))
    qr, kr = apply_rotary_pos_emb(qn, kn, c["cos"].unsqueeze(0), c["sin"].unsqueeze(0))
    qo.copy_(qr[0].transpose(0, 1))
    k.copy_(kr[0].transpose(0, 1))


def _returns(c: Dict[str, Any]):
    """The rest of forward_native once q and k are ready: the attention on q_out ([tokens, q_size], contiguous), k, v
    (column views of qkv), then o_proj, as the method calls them. Where q_out is q itself (ASTRA_GQKR_Q_OUT=0) the
    attention gets q's column view of qkv, as before q_out."""
    attn = c["layer"]
    q, k, v = c["qkv"].split(c["sizes"], dim=-1)
    out = attn.attn(attention_q(c, q), k, v, forward_batch=c["forward_batch"])
    if out.dim() == 4 and out.shape[0] == 1:  # 0.5.17's: the triton backend may return [1, s, h, head_dim]
        out = out.squeeze(0).flatten(-2, -1)
    out = out.reshape(-1, attn.q_size)  # 0.5.23's
    output, _ = attn.o_proj(out)
    return output


ADAPTER = OpAdapter(
    op="gemma_qknorm_rope",
    data="q",
    same_dtype=("q", "q_out", "k", "q_weight", "k_weight", "cos", "sin"),
    rowwise=("q", "q_out", "k", "cos", "sin"),
    normalize=_normalize,
    returns=_returns,
    expand=_expand,
    sequence=_sequence,
)
