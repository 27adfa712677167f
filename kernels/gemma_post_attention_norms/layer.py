"""The SGLang code `validate` drives for this fused op: a two-layer stack through SGLang's own Gemma2Model.forward and
Gemma2DecoderLayer.forward (looked up on the classes at call time, objects made without their __init__), so that the
patched run exercises both the pair inside a layer and the hand-off across the layer boundary, and the case's tensors
meet the op across the boundary (where the two are one computation):
- the model's embedding scale is 1 (config.hidden_size 1: `hidden_states *= 1.0`), so layer 0's residual is the
  case's residual tensor itself;
- both layers' post_attention_layernorm is SGLang's GemmaRMSNorm with weight -1 (x * (1 + w) is exactly 0), so the
  pair inside each layer leaves the residual as it is (0 + r), whatever their attention (ones) and pre-feedforward norm;
- layer 0's mlp returns the case's input (a fresh tensor, as down_proj's output is); its post_feedforward_layernorm is
  a GemmaRMSNorm holding weight1 / eps1, layer 1's input_layernorm one holding weight2 / eps2: unpatched, SGLang runs
  gemma_rmsnorm(input, weight1) and then gemma_fused_add_rmsnorm(y, residual, weight2), which is the op's pair;
  patched, layer 0 returns the raw input and layer 1 runs the op's kernel on it and the residual, in place;
- layer 1's attention records what it is given (the op's `input` output); layer 1's own pair leaves the residual as
  it is; its mlp and post_feedforward_layernorm and the model's final norm pass their arguments through.
Patched with the hand-off on (ASTRA_GPAN_ACROSS_LAYERS), a run that did not take it is an error, not a pass."""
from astra_sglang.patch.layers import construct, write_back


class _Through:
    """A norm stand-in that returns its arguments: x, or (x, residual)."""

    def __call__(self, x, residual=None):
        return x if residual is None else (x, residual)


def run_layer(inp, dims, scalars):
    import types

    import torch
    from sglang.srt.layers.layernorm import GemmaRMSNorm
    from sglang.srt.models.gemma2 import Gemma2DecoderLayer, Gemma2Model

    from astra_sglang.errors import AstraError
    from astra_sglang.registry import op_part

    x, r = inp["input"], inp["residual"]
    h = dims[1]

    def norm(w=None, eps=1e-6, fill=None):
        n = construct(GemmaRMSNorm, h, eps=float(eps)).to(device=x.device, dtype=x.dtype)
        if w is not None:
            n.weight.data.copy_(w)  # the stored (w - 1); the kernels add the 1
        else:
            n.weight.data.fill_(fill)
        return n

    def layer(mlp, post_ff, input_ln, seen=None):
        ly = Gemma2DecoderLayer.__new__(Gemma2DecoderLayer)
        torch.nn.Module.__init__(ly)
        ly.input_layernorm = input_ln
        ly.post_attention_layernorm = norm(fill=-1.0)  # (1 + w) = 0: this layer's pair keeps the residual
        ly.pre_feedforward_layernorm = norm(fill=0.0)

        def attn(positions, hidden_states, forward_batch):
            if seen is not None:
                seen.append(hidden_states.clone())
            return torch.ones_like(hidden_states)

        ly.self_attn = attn
        ly.mlp = mlp
        ly.post_feedforward_layernorm = post_ff
        return ly

    seen = []
    l0 = layer(lambda t: x.clone(), norm(inp["weight1"], scalars.get("eps1", 1e-6)), _Through())
    l1 = layer(lambda t: t, _Through(), norm(inp["weight2"], scalars.get("eps2", 1e-6)), seen)
    model = Gemma2Model.__new__(Gemma2Model)
    torch.nn.Module.__init__(model)
    model.config = types.SimpleNamespace(hidden_size=1)  # the embedding scale sqrt(1): r stays r
    model.layers = torch.nn.ModuleList([l0, l1])
    model.norm = _Through()
    ad = op_part("gemma_post_attention_norms", "adapter")
    patched = getattr(Gemma2DecoderLayer.forward, "__astra_op__", None) == "gemma_post_attention_norms"
    fused = ad.ACROSS_COUNTS["fused"]
    with torch.no_grad():
        Gemma2Model.forward(model, None, None, None, r)
    if patched and ad.ACROSS and ad.ACROSS_COUNTS["fused"] != fused + 1:
        raise AstraError("gemma_post_attention_norms: layer 0 did not hand its post_feedforward_layernorm to layer 1 "
                         f"(ASTRA_GPAN_ACROSS_LAYERS is on): {ad.ACROSS_WHY['last'] or 'layer 1 did not take it'}")
    write_back(x, seen[0])
    return {"input": x, "residual": r}
