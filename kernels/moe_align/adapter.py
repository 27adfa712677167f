"""The patch adapter: how SGLang's in-place moe_align_block_size callables map onto this op's ABI.

Routed (all take the "+1 convention" bucket count, num_experts = E + 1, and SGLang's own buffers):
  sglang.kernels.ops.moe.moe_align_block_size (0.5.17 / 0.5.23: the registry wrapper the Triton fused_moe
    path calls, imported by name as sgl_moe_align_block_size in
    srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py); sgl_kernel.moe_align_block_size (the AOT
    kernel; gguf.py imports it by name); sglang.kernels.ops.moe.moe_align.moe_align_block_size (the JIT backend).
Not routed (SGLang's original serves the call): ignore_invalid_expert=True, 0.5.23's write_inactive_prefix_count /
pad_expert_ids, int64 topk_ids, non-contiguous or non-int32 buffers, more than 8192 buckets, a cumsum buffer
shorter than num_experts + 1. Not patched: 0.5.23's Triton moe_align_small_numel (<= 64 ids, > 64 buckets: it
leaves sorted_token_ids past the total unwritten, a different contract) and the Marlin M == 1
moe_align_single_token (fused_marlin_moe only, not the Triton fused_moe path)."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem

_TENSORS = ("topk_ids", "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "cumsum_buffer")


def _align_normalize(c):
    ids = c["topk_ids"]
    if ids.dim() not in (1, 2):
        return f"topk_ids is {ids.dim()}-d, not [tokens, topk]"
    t, k = (ids.shape[0], ids.shape[1]) if ids.dim() == 2 else (ids.shape[0], 1)
    for n in ("sorted_token_ids", "expert_ids", "num_tokens_post_pad", "cumsum_buffer"):
        if c[n].dim() != 1:
            return f"{n} is not 1-d"
    bad = contiguity_problem(c, _TENSORS)
    if bad:
        return bad
    ne, bs = int(c["num_experts"]), int(c["block_size"])
    if not 0 < ne <= 8192 or bs <= 0:
        return f"num_experts {ne} / block_size {bs} out of range"
    if c["cumsum_buffer"].numel() < ne + 1 or c["num_tokens_post_pad"].numel() < 1:
        return "cumsum_buffer or num_tokens_post_pad too short"
    return {n: c[n] for n in _TENSORS}, (t, k, ne, bs, c["sorted_token_ids"].numel())


# On in `--ops all`. The 2026-11-24 "3.7x slower in its decode graph" was a misreading of the neighbour
# table: the op time of a PDL-launched kernel includes its griddepcontrol.wait on the router before it,
# and SGLang runs two kernels where this runs one. With it (and moe_combine) the Qwen3-30B-A3B decode step
# measured -5.51 / -7.33 / -3.23% at batch 1 / 8 / 32 (H200, 2026-11-26, RESULTS.md).
# DEFAULT_OFF = "reason" takes it out again.
DEFAULT_OFF = ""

# In context the one-block kernel is 1.07-2.97x SGLang's pair up to 1024 ids on 129 or fewer buckets (H200
# 2026-11-27, results/2026-11-27-h200/served-calibrated/moe_align; two one-token rows at 0.999x and 1.013x within
# noise). It lost from ~1024 ids on (0.89x at 2048 ids, 0.94x at 1024 on DeepSeek-V3's 257 buckets) until its padding
# became one coalesced fill (H200 2026-11-29, results/2026-11-29-h200/session19: 1.02-1.33x on those rows, 0 of 35
# decode rows slower).
# SGLang's kernel keeps the calls above MAX_IDS ids (prefill; past 256 tokens at top-8), which no decode row measures.
MAX_IDS = 2048


def _keeps(dims):
    ids = dims[0] * dims[1]
    if ids > MAX_IDS:
        return f"{ids} ids > {MAX_IDS}: SGLang's kernel (astra's is measured on decode rows up to {MAX_IDS} ids)"
    return None


ADAPTER = OpAdapter(
    op="moe_align",
    data="topk_ids",
    same_dtype=_TENSORS,  # all int32
    aliases={"experts_ids": "expert_ids"},  # sgl_kernel's spelling
    normalize=_align_normalize,
    returns=lambda c: None,
    keeps=_keeps,
    token_derived=("max_num_tokens_padded",),
)
