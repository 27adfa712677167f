"""The SGLang code `validate` drives for this fused op: Qwen3Attention.forward_prepare_native itself (the dense Qwen3
method patch replaces), called on an attention stand-in that holds SGLang's own submodules (two RMSNorm layers with
the op's weights, a RotaryEmbedding with the op's cos/sin cache). The qkv GEMM is not what is validated: the stand-in's
qkv_proj returns the case's q/k/v row buffer, so both sides start from the same activations.

Outside a server SGLang's runtime config is not published; the values the method reads from it are supplied as a
server without those flags has them (patch/layers.py server_defaults). The q the method returns (the attention's) is
the op's q_out (patched: the kernel's own buffer; unpatched: q's column view, normed and rotated in place), so that
is what validate compares, with k; the row buffer's q columns are the op's input."""
from types import SimpleNamespace

from astra_sglang.patch.layers import qk_norms_and_rope, server_defaults


def _call_method(inp, dims, scalars):
    import torch
    from sglang.srt.models.qwen3 import Qwen3Attention

    t, hq, hk, d = dims[:4]  # the strides (and q_out_stride, the 7th) are the op's layout, not the layer's
    eps = float(scalars.get("eps", 1e-6))
    neox = bool(int(scalars.get("is_neox", 1)))
    q_norm, k_norm, rope = qk_norms_and_rope(inp, d, eps, neox)
    # q and k column blocks of one row buffer, v after them (untouched by the op)
    qkv = torch.cat([inp["q"][:, : hq * d], inp["k"][:, : hk * d], torch.zeros_like(inp["k"][:, : hk * d])], dim=1)
    attn = SimpleNamespace(
        head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d, q_norm=q_norm,
        k_norm=k_norm, rotary_emb=rope, alt_stream=None, qkv_proj=lambda h: (qkv, None))
    hidden = torch.empty((t, 8), device=qkv.device, dtype=qkv.dtype)  # what the stand-in GEMM ignores
    with torch.no_grad():
        return Qwen3Attention.forward_prepare_native(attn, inp["positions"], hidden)


def run_layer(inp, dims, scalars):
    t, hq, hk, d = dims[:4]
    with server_defaults():
        q, k, _ = _call_method(inp, dims, scalars)
    inp["q_out"][:, : hq * d].copy_(q.reshape(t, hq * d))
    inp["k"][:, : hk * d].copy_(k.reshape(t, hk * d))
    return {"q_out": inp["q_out"], "k": inp["k"]}
