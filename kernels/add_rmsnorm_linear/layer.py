"""The SGLang code `validate` drives for this fused op: LlamaDecoderLayer.forward itself (the method patch replaces),
looked up on the class at call time, on a LlamaDecoderLayer made without its __init__ (that needs SGLang's parallel
state): input_layernorm is SGLang's own RMSNorm holding the case's weight and eps; self_attn is a stand-in whose
forward is LlamaAttention.forward_prepare_native's first step, qkv_proj(hidden_states), on a real QKVParallelLinear
holding the case's weight and SGLang's UnquantizedLinearMethod (the attention itself is not what is validated); it
records the hidden_states it got (the normed row). post_attention_layernorm passes its arguments through and mlp is an
identity, so the forward returns (the projection, the residual). Not yet run (no GPU since the op was built)."""
from types import SimpleNamespace

from astra_sglang.patch.layers import construct, write_back


def _qkv_proj(weight, method):
    import torch
    from sglang.srt.layers.linear import QKVParallelLinear

    qkv = QKVParallelLinear.__new__(QKVParallelLinear)
    torch.nn.Module.__init__(qkv)
    qkv.weight, qkv.bias, qkv.quant_method = weight, None, method
    qkv.gather_output, qkv.skip_bias_add = False, False
    qkv.input_size, qkv.output_size = weight.shape[1], weight.shape[0]
    qkv.tp_rank, qkv.tp_size, qkv.tp_group = 0, 1, None
    return qkv


class _Attention:
    """self_attn's stand-in: qkv_proj on its hidden_states (as forward_prepare_native starts), the input recorded."""

    def __init__(self, qkv):
        self.qkv_proj, self.seen = qkv, []

    def __call__(self, positions, hidden_states, forward_batch):
        self.seen.append(hidden_states.clone())
        out, _ = self.qkv_proj(hidden_states)
        return out


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
    from sglang.srt.models.llama import LlamaDecoderLayer

    x, r = inp["x"], inp["residual"]
    h = dims[1]
    norm = construct(RMSNorm, h, eps=float(scalars.get("eps", 1e-5))).to(device=x.device, dtype=x.dtype)
    norm.weight.data.copy_(inp["norm_weight"])
    layer = LlamaDecoderLayer.__new__(LlamaDecoderLayer)
    torch.nn.Module.__init__(layer)
    layer.input_layernorm = norm
    attn = _Attention(_qkv_proj(inp["weight"], UnquantizedLinearMethod()))
    layer.self_attn = attn
    layer.post_attention_layernorm = lambda hs, res: (hs, res)
    layer.mlp = lambda hs: hs
    hs, res = x.clone(), r.clone()  # SGLang's norm works in place: the case's inputs stay as they were
    with torch.no_grad():
        out, res_out = LlamaDecoderLayer.forward(layer, None, hs, SimpleNamespace(), res)
    write_back(inp["out"], out)
    write_back(inp["residual_out"], res_out)
    write_back(inp["normed"], attn.seen[-1])
    return {"out": inp["out"], "residual_out": inp["residual_out"], "normed": inp["normed"]}
