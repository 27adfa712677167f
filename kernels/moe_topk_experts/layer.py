"""The SGLang code `validate` drives for this fused op: Qwen3MoeSparseMoeBlock.forward_normal itself (the method
patch replaces), looked up on the class at call time, on a block made without its __init__ (that needs SGLang's
parallel state and a model config), at TP 1:
- gate: a stand-in returning the case's router logits (the gate's GEMM is not what is validated: the replacement
  calls the block's own);
- topk: SGLang's TopK holding the plain renormalized softmax TopKConfig Qwen3-MoE builds, whose forward is, for this
  instance, what TopK.forward_cuda runs with the STANDARD format (select_experts; its symmetric-memory context needs
  the TP group);
- experts: SGLang's FusedMoE holding the case's weights, its UnquantizedFusedMoEMethod on a Triton MoeRunner and a
  StandardDispatcher (what the adapter checks), whose forward is, for this instance, what FusedMoE.forward runs at TP 1
  with the standard dispatcher: fused_experts, as fused_experts_none_to_triton calls it (moe_experts' layer)."""


def _topk(top_k: int):
    import torch
    from sglang.srt.layers.moe import topk as tk

    topk = tk.TopK.__new__(tk.TopK)
    torch.nn.Module.__init__(topk)
    topk.topk_config = tk.TopKConfig(top_k=top_k, renormalize=True, use_grouped_topk=False)
    topk.layer_id = 0
    topk.forward = lambda hidden_states, router_logits, **kw: tk.select_experts(
        hidden_states=hidden_states, router_logits=router_logits, topk_config=topk.topk_config, layer_id=0)
    return topk


def _experts(inp, cfg):
    import torch
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.moe_runner import MoeRunner
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatcher
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    experts = FusedMoE.__new__(FusedMoE)
    torch.nn.Module.__init__(experts)
    experts.w13_weight, experts.w2_weight = inp["w13"], inp["w2"]
    experts.moe_tp_size, experts.moe_ep_size, experts.layer_id = 1, 1, 0
    experts.moe_runner_config = cfg
    qm = UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod)
    qm.runner, qm._aiter_runner = MoeRunner.__new__(MoeRunner), None
    qm.runner.runner_backend = MoeRunnerBackend.TRITON
    experts.quant_method = qm
    experts.dispatcher = StandardDispatcher.__new__(StandardDispatcher)

    def forward(hidden_states, topk_output, **kw):
        return fm.fused_experts(hidden_states=hidden_states, w1=experts.w13_weight, w2=experts.w2_weight,
                                topk_output=topk_output, moe_runner_config=cfg)

    experts.forward = forward
    return experts


class _Gate:
    """gate's stand-in: (the case's logits, no bias)."""

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, x):
        return self.logits, None


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.models.qwen3_moe import Qwen3MoeSparseMoeBlock

    from astra_sglang.patch.layers import moe_server_defaults, write_back

    s = float(scalars.get("routed_scaling_factor", 1.0))
    # in place, as FusedMoE's default; the block's input is a copy (fused_experts overwrites it)
    cfg = MoeRunnerConfig(activation="silu", is_gated=True, inplace=True, routed_scaling_factor=s)
    block = Qwen3MoeSparseMoeBlock.__new__(Qwen3MoeSparseMoeBlock)
    torch.nn.Module.__init__(block)
    block.tp_size, block.ep_size, block.layer_id = 1, 1, 0
    block.gate = _Gate(inp["router_logits"])
    block.topk = _topk(int(dims[4]))
    block.experts = _experts(inp, cfg)
    with torch.no_grad(), moe_server_defaults():
        out = Qwen3MoeSparseMoeBlock.forward_normal(block, inp["x"].clone())
    write_back(inp["out"], out)
    return {"out": inp["out"]}
