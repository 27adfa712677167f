"""The SGLang code `validate` drives for this op: select_experts as TopK.forward_cuda calls it for Qwen3-MoE
(softmax, renormalize), then the Triton MoE path's moe_align_block_size wrapper on the ids it returned, with the
case's block size. Twice: the first pass teaches the patched router the block size (as SGLang's warm-up does in a
server), the second is the one compared; unpatched, both passes are SGLang's. Outputs are mapped onto the op's as
moe_align's layer maps them (expert_ids past the used blocks keep the case's input; sorted_token_ids on the case's
length, its missing tail the padding value)."""


def run_layer(inp, dims, scalars):
    import importlib

    import torch
    from sglang.srt.layers.moe import topk as tk

    from astra_sglang.kernels.moe_align.layer import on_case

    t, e, k, bs, n_sorted = dims
    wrapper = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size")
    cfg = tk.TopKConfig(top_k=k, renormalize=bool(scalars["renormalize"]))
    x = inp["scores"]
    with torch.no_grad():
        for _ in range(2):
            out = tk.select_experts(hidden_states=x, router_logits=x, topk_config=cfg)
            aligned = wrapper.moe_align_block_size(out.topk_ids, bs, e)
    inp["topk_weights"].copy_(out.topk_weights)
    inp["topk_ids"].copy_(out.topk_ids)
    return {"topk_weights": inp["topk_weights"], "topk_ids": inp["topk_ids"],
            **on_case(aligned, inp["expert_ids"], bs, n_sorted, t * k)}
