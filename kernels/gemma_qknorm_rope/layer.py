"""The SGLang code `validate` drives for this fused op: Gemma3Attention.forward_native itself (the method patch
replaces), called on an attention stand-in that holds SGLang's own Gemma3RMSNorm layers with the op's weights. The
qkv GEMM, the attention and o_proj are not what is validated: the stand-in's qkv_proj returns the case's q/k/v row
buffer, its attention records the q and k it is handed (and returns zeros), its o_proj passes them through. The q the
attention gets is the op's q_out (patched: the kernel's own buffer; unpatched: what SGLang's rope returns), so that is
what validate compares, with k; the row buffer's q columns are the op's input."""
from types import SimpleNamespace

from .adapter import gemma3_norm


def _call_method(inp, dims, scalars):
    import torch
    from sglang.srt.models.gemma3_causal import Gemma3Attention

    t, hq, hk, d, qs, ks = dims[:6]   # q_out_stride (7th) is the op's output layout, not the layer's
    eps = float(scalars.get("eps", 1e-6))
    norms = [gemma3_norm(inp[w].clone(), eps) for w in ("q_weight", "k_weight")]
    # q and k column blocks of one row buffer, v after them (untouched by the op)
    qkv = torch.cat([inp["q"][:, : hq * d], inp["k"][:, : hk * d], torch.zeros_like(inp["k"][:, : hk * d])], dim=1)
    seen = {}

    def attention(q, k, v, forward_batch=None, **kwargs):
        seen["q"], seen["k"] = q, k
        return torch.zeros((t, hq * d), device=q.device, dtype=q.dtype)

    attn = SimpleNamespace(
        head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d, q_norm=norms[0],
        k_norm=norms[1], qkv_proj=lambda h: (qkv, None), attn=attention, o_proj=lambda x: (x, None))
    hidden = torch.empty((t, 8), device=qkv.device, dtype=qkv.dtype)  # what the stand-in GEMM ignores
    positions = torch.arange(t, device=qkv.device)  # forward_native rotates by position_embeddings, not these
    pe = (inp["cos"].unsqueeze(0), inp["sin"].unsqueeze(0))
    with torch.no_grad():
        Gemma3Attention.forward_native(attn, positions, hidden, pe, None)
    return seen["q"], seen["k"]


def run_layer(inp, dims, scalars):
    t, hq, hk, d = dims[:4]
    q, k = _call_method(inp, dims, scalars)
    inp["q_out"][:, : hq * d].copy_(q.reshape(t, hq * d))
    inp["k"][:, : hk * d].copy_(k.reshape(t, hk * d))
    return {"q_out": inp["q_out"], "k": inp["k"]}
