"""moe_route_align: the MoE router and moe_align_block_size as ONE op, what SGLang runs back to back on every
MoE layer of a decode step (Qwen3-MoE, Mixtral, gpt-oss without triton_kernels):

    topk_weights, topk_ids = fused_topk(router_logits, topk, renormalize)     # moe_router's contract
    sorted_token_ids, expert_ids, num_tokens_post_pad
        = moe_align_block_size(topk_ids, block_size, E)                        # moe_align's contract

Where (SGLang 0.5.17): TopK.forward_cuda -> select_experts -> fused_topk -> the Triton router (plus a zero-bias
fill); later FusedMoE -> the Triton runner -> fused_experts -> _prepare_fused_moe_run -> moe_align_block_size
(srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py: allocates the three outputs, then
sgl_kernel's align, one launch below 1024 ids and 65 buckets, else align + count_and_sort). block_size is the
Triton config's BLOCK_SIZE_M for that many tokens. At Qwen3-30B-A3B batch 1 (H200, 2026-11-26, with astra's
moe_router and moe_align patched) the two kernels took 2.2 + 3.15 us of every layer, about 3% of the step.

The op's outputs are both contracts' outputs, compared as each is: the ids exactly (moe_router's one-hot
canonical form), the weights within tolerance, the alignment exactly in moe_align's canonical form (atomic order
inside an expert's segment is not deterministic in production either). Decode sizes only: the fused kernel
holds every id in one block (tokens * topk <= 4096); prefill keeps the two ops (moe_router, moe_align).

dims: (num_tokens, num_experts, topk, block_m, max_num_tokens_padded). max_num_tokens_padded is SGLang's
length of sorted_token_ids rounded up to 4 (moe_align.spec.sorted_len: production's int4 padding writes that far).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.kernels.moe_align import spec as align_spec
from astra_sglang.kernels.moe_router import spec as router_spec
from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes

DECODE = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_NUMEL = 4096  # the shipped kernel: every id in one block

# (name, experts, topk, block table or the block sizes to cover), the models whose decode step takes both kernels
ROUTE_ALIGN_MODELS: Tuple[Tuple[str, int, int, Any], ...] = tuple(
    m for m in align_spec.MOE_MODELS if m[0] in {r[0] for r in router_spec.ROUTER_MODELS})


def dims_for(tokens: int, experts: int, topk: int, block: int) -> Tuple[int, int, int, int, int]:
    return (tokens, experts, topk, block, align_spec.sorted_len(tokens * topk, experts, block))


def _corpus() -> Tuple[Shape, ...]:
    out = []
    for name, e, k, blocks in ROUTE_ALIGN_MODELS:
        for t in DECODE:
            if t * k > MAX_NUMEL:
                continue
            tags = ("decode",) + next(r[4] for r in router_spec.ROUTER_MODELS if r[0] == name)
            for b in ((align_spec.block_for(blocks, t),) if isinstance(blocks, dict) else blocks):
                out.append(Shape(dims_for(t, e, k, b), tags, name))
    return dedupe_shapes(out)


EDGE = (
    Shape(dims_for(1, 60, 4, 16), ("edge",), "qwen1.5-moe-a2.7b: 60 experts, renormalize off"),
    Shape(dims_for(3, 8, 8, 16), ("edge",), "topk == experts"),
    Shape(dims_for(33, 128, 8, 16), ("edge",), "odd token count"),
    Shape(dims_for(7, 1000, 16, 16), ("edge",), "1000 experts, top 16"),
    Shape(dims_for(512, 128, 8, 64), ("edge", "largest"), "4096 ids: the most one block takes"),
    Shape(dims_for(64, 256, 8, 1), ("edge",), "block_size 1 (no padding)"),
)


def renormalize_of(dims) -> int:
    return int(router_spec.RENORMALIZE.get((int(dims[1]), int(dims[2])), True))


def scalars(dims) -> Dict[str, Any]:
    return {"block_size": int(dims[3]), "renormalize": renormalize_of(dims)}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """scores as moe_router's (normal, ties, peaked); expert_ids starts as random ints (the blocks past the total
    must keep theirs)."""
    import torch

    t, e, k, bs, n_sorted = dims
    inp = router_spec.make_inputs((t, e, k), dtype, gen, dist, device)
    n_blocks = -(-n_sorted // bs)
    inp["sorted_token_ids"] = torch.empty((n_sorted,), device=device, dtype=torch.int32)
    inp["expert_ids"] = torch.randint(-1, max(e, 1), (n_blocks,), generator=gen, device=device, dtype=torch.int32)
    inp["num_tokens_post_pad"] = torch.empty((1,), device=device, dtype=torch.int32)
    return inp


def _align_dims(dims):
    t, e, k, bs, n_sorted = (int(x) for x in dims[:5])
    return (t, k, e + 1, bs, n_sorted)


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    t, e, k = (int(x) for x in dims[:3])
    rn = bool(scalars.get("renormalize", renormalize_of(dims)))
    w, ids = router_spec.route(inp["scores"].to(torch.float64), k, rn)
    adims = _align_dims(dims)
    aligned = align_spec.reference({"topk_ids": ids.to(torch.int32), "expert_ids": inp["expert_ids"]}, adims,
                                   {"num_experts": e + 1, "block_size": int(dims[3]), "pad_sorted_token_ids": 1})
    return {"topk_weights": w, "topk_ids": router_spec.one_hot_ids(ids, e, torch.float64), **aligned}


def canonical(outs: Dict[str, Any], dims) -> Dict[str, Any]:
    outs = router_spec.canonical(outs, tuple(dims[:3]))
    return align_spec.canonical(outs, _align_dims(dims))


def bytes_moved(dims, dtype: str) -> int:
    t, e, k, bs, n_sorted = dims
    return t * (e * DTYPE_BYTES[dtype] + k * 8) + 4 * (n_sorted + -(-n_sorted // bs) + 1)


_TOPK = "srt/layers/moe/topk.py"
_WRAP = "srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py"
_FUSED = "srt/layers/moe/moe_runner/triton_utils/fused_moe.py"

SPEC = OpSpec(
    name="moe_route_align",
    summary="MoE softmax top-k router + moe_align_block_size in one launch (fused: moe_router, moe_align)",
    dim_names=("num_tokens", "num_experts", "topk", "block_m", "max_num_tokens_padded"),
    abi=(
        AbiArg("scores", "ptr", "in"),
        AbiArg("topk_weights", "ptr", "out"),
        AbiArg("topk_ids", "ptr", "out"),
        AbiArg("sorted_token_ids", "ptr", "out"),
        AbiArg("expert_ids", "ptr", "inout"),  # blocks past the total keep what they held
        AbiArg("num_tokens_post_pad", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("num_experts", "i64"),  # E (the kernel aligns into E + 1 buckets, SGLang's +1 convention)
        AbiArg("topk", "i64"),
        AbiArg("max_num_tokens_padded", "i64"),
        AbiArg("block_size", "i64"),
        AbiArg("renormalize", "i32"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="installed",
            description="SGLang's installed sequence: fused_topk (zero-bias fill + Triton router), then the in-place "
            "moe_align_block_size its Triton MoE wrapper calls",
            provenance="sglang/srt/layers/moe/topk.py select_experts -> fused_topk -> moe_fused_gate "
            "(_router_triton_kernel); srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py "
            "moe_align_block_size -> sglang.kernels.ops.moe.moe_align_block_size (sgl_kernel's align kernels)",
            sources=(),
            launcher="",
            flag_profile="sglang_jit",
            source_facts=router_spec.SPEC.variant("installed").source_facts + (
                (_TOPK, r"^def build_precomputed_topk_output\(",
                 "SGLang's own wrapper of a router's (weights, ids) as select_experts' output (capture hook and "
                 "expert-distribution recorder included)"),
                (_TOPK, r"^def precomputed_topk_postprocess_is_noop\(",
                 "SGLang's test of when select_experts' post-processing is a no-op (the fused route's guard)"),
                (_WRAP, r"if topk_ids\.numel\(\) < num_experts \+ 1:\s*max_num_tokens_padded = topk_ids\.numel\(\) "
                        r"\* block_size\s*else:\s*max_num_tokens_padded = topk_ids\.numel\(\) \+ \(num_experts \+ 1\) "
                        r"\* \(block_size - 1\)\s*sorted_ids = torch\.empty\(\s*\(max_num_tokens_padded,\)",
                 "the wrapper's sorted_token_ids length (0.5.17: not rounded; the adapter allocates the same)"),
                (_WRAP, r"sgl_moe_align_block_size\(\s*topk_ids,\s*num_experts \+ 1,\s*block_size,\s*sorted_ids,\s*"
                        r"expert_ids,\s*num_tokens_post_pad,\s*cumsum_buffer,\s*True,\s*ignore_invalid_expert,\s*\)",
                 "the wrapper's align call: E + 1 buckets, padding on"),
                (_FUSED, r"moe_align_block_size\(\s*topk_ids, config\[\"BLOCK_SIZE_M\"\], E\s*\)",
                 "the Triton MoE path aligns the router's topk_ids with its config's BLOCK_SIZE_M"),
            ),
            dtypes=("fp32", "fp16", "bf16"),
            requires_root="sglang_py",
            callable="sglang.srt.layers.moe.topk:select_experts",
        ),
    ),
    default_variant=lambda roots: "installed",
    dtypes=("fp32", "fp16", "bf16"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0, floor={"fp32": 1e-5, "fp16": 1e-5, "bf16": 1e-5, "int32": 0.0}),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "ties", "peaked"),
    replaces=(
        "sglang.srt.layers.moe.topk:select_experts",
        "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size:moe_align_block_size",
    ),
    # astra's kernel only: SGLang's router and align kernels stay its members' (profile, prediction)
    kernel_symbols=(r"astra_mra::",),
    fuses=("moe_router", "moe_align"),
    canonical=canonical,
)
