"""The SGLang code `validate` drives for this fused op: Gemma2DecoderLayer.forward itself (the method patch replaces),
looked up on the class at call time, on a Gemma2DecoderLayer made without its __init__ whose post_attention_layernorm
and pre_feedforward_layernorm are SGLang's own GemmaRMSNorm holding the case's weights; input_layernorm passes its
arguments through, self_attn returns the case's input (the attention is not what is validated), mlp and
post_feedforward_layernorm are identities, so the forward returns (the op's output, the residual)."""
from astra_sglang.patch.layers import construct, write_back


class _Through:
    """input_layernorm stand-in: x, or (x, residual) unchanged."""

    def __call__(self, x, residual=None):
        return x if residual is None else (x, residual)


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.layernorm import GemmaRMSNorm
    from sglang.srt.models.gemma2 import Gemma2DecoderLayer

    x, r = inp["input"], inp["residual"]
    h = dims[1]

    def norm(w, eps):
        n = construct(GemmaRMSNorm, h, eps=float(eps)).to(device=x.device, dtype=x.dtype)
        n.weight.data.copy_(w)  # the stored (w - 1); the kernels add the 1
        return n

    layer = Gemma2DecoderLayer.__new__(Gemma2DecoderLayer)
    torch.nn.Module.__init__(layer)
    layer.post_attention_layernorm = norm(inp["weight1"], scalars.get("eps1", 1e-6))
    layer.pre_feedforward_layernorm = norm(inp["weight2"], scalars.get("eps2", 1e-6))
    layer.input_layernorm = _Through()
    attn_out = x.clone()  # what the attention returns: a fresh tensor, as o_proj's output is
    layer.self_attn = lambda positions, hidden_states, forward_batch: attn_out
    layer.mlp = lambda t: t
    layer.post_feedforward_layernorm = lambda t: t
    dummy = torch.empty_like(x)  # the stand-in attention ignores its input
    with torch.no_grad():
        out, res = Gemma2DecoderLayer.forward(layer, None, dummy, None, r)
    write_back(x, out)
    write_back(r, res)
    return {"input": x, "residual": r}
