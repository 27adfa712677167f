"""The SGLang code `validate` drives for this fused op: fused_experts itself (looked up on its module at call time,
so the patch is what runs), as fused_experts_none_to_triton calls it, with a MoeRunnerConfig of the plain silu-gated
MoE (in place, as FusedMoE's default) and the case's routing as a StandardTopKOutput. num_experts is left unset, as
SGLang's filtered path then runs (the spec's `ep` ids are -1). In place the call overwrites its input: it gets a
copy."""
from astra_sglang.patch.layers import moe_server_defaults, write_back


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    s = float(scalars.get("routed_scaling_factor", 1.0))
    cfg = MoeRunnerConfig(activation="silu", is_gated=True, inplace=True, routed_scaling_factor=s)
    topk = StandardTopKOutput(inp["topk_weights"], inp["topk_ids"], None)
    with torch.no_grad(), moe_server_defaults():
        out = fm.fused_experts(hidden_states=inp["x"].clone(), w1=inp["w13"], w2=inp["w2"], topk_output=topk,
                               moe_runner_config=cfg)
    write_back(inp["out"], out)
    return {"out": inp["out"]}
