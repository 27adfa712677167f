"""The SGLang code `validate` drives for this op: the Triton fused_moe path's moe_align_block_size
(sglang/srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py), which allocates SGLang's buffers and
calls the kernel wrapper this op patches. Its outputs are mapped onto the op's: expert_ids past the used blocks
keep the case's input (SGLang leaves them unwritten). sorted_token_ids is mapped onto the case's length: cut
where SGLang's buffer is longer (0.5.23 rounds it up to a multiple of 4), and where it is shorter (0.5.17 does
not round; the corpus does) the missing tail is the padding value, numel, as if the buffer went on."""


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size import moe_align_block_size

    t, k, nb, bs, n_sorted = dims
    return on_case(moe_align_block_size(inp["topk_ids"], bs, nb - 1), inp["expert_ids"], bs, n_sorted, t * k)


def on_case(aligned, expert_ids_in, bs, n_sorted, numel):
    """SGLang's (sorted_token_ids, expert_ids, num_tokens_post_pad) mapped onto a case's outputs (see above)."""
    s, e, total = aligned
    n = int(total.reshape(-1)[0].item())
    eids = expert_ids_in.clone()
    eids[: n // bs] = e[: n // bs]
    sorted_ids = s.new_full((n_sorted,), numel)
    m = min(n_sorted, s.numel())
    sorted_ids[:m] = s[:m]
    return {"sorted_token_ids": sorted_ids, "expert_ids": eids, "num_tokens_post_pad": total[:1]}
