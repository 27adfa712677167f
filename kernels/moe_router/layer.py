"""The SGLang code `validate` drives for this op: fused_topk as select_experts calls it for Qwen3-MoE, Mixtral and
gpt-oss (softmax scoring; hidden_states only sets the row count), looked up on the topk module at call time so the
patch is what runs. The rest of TopK.forward_cuda (expert-location remapping, the distribution recorder, waterfill)
is identity for these models and needs a runtime context."""


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.moe import topk as tk

    x = inp["scores"]
    with torch.no_grad():
        w, ids = tk.fused_topk(hidden_states=x, gating_output=x, topk=int(scalars["topk"]),
                               renormalize=bool(scalars["renormalize"]))
    inp["topk_weights"].copy_(w)
    inp["topk_ids"].copy_(ids)
    return {"topk_weights": inp["topk_weights"], "topk_ids": inp["topk_ids"]}
