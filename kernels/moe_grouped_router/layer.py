"""The SGLang code `validate` drives for this op: the grouped biased router as select_experts calls it for
DeepSeek-V3 / R1 and Kimi-K2 (`biased_grouped_topk`, looked up on the topk module at call time so the patch is what
runs; hidden_states only sets the row count). The rest of TopK.forward_cuda (expert-location remapping, the
padded-row mask, the distribution recorder) is identity for these models without EPLB and needs a runtime context."""


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.moe import topk as tk

    x = inp["scores"]
    with torch.no_grad():
        w, ids = tk.biased_grouped_topk(
            hidden_states=x, gating_output=x, correction_bias=inp["bias"], topk=int(scalars["topk"]),
            renormalize=bool(scalars["renormalize"]), num_expert_group=int(scalars["num_expert_group"]),
            topk_group=int(scalars["topk_group"]),
            num_fused_shared_experts=int(scalars["num_fused_shared_experts"]),
            routed_scaling_factor=float(scalars["routed_scaling_factor"]),
            apply_routed_scaling_factor_on_output=bool(scalars["apply_routed_scaling_factor_on_output"]))
    inp["topk_weights"].copy_(w)
    inp["topk_ids"].copy_(ids)
    return {"topk_weights": inp["topk_weights"], "topk_ids": inp["topk_ids"]}
