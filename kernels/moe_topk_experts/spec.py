"""moe_topk_experts: a FUSED op. A Qwen3-MoE layer from the gate's logits to its output at one decode token: the
softmax top-k router (moe_router's contract) and the routed experts (moe_experts' contract), in two launches:

    topk_weights, topk_ids = fused_topk(router_logits, K, renormalize=True)      # ties to the lowest expert id
    out = fused_experts(x, w13, w2, (topk_weights, topk_ids))                    # moe_experts' spec says how it rounds

The ids and weights never leave the kernels (nothing in the layer reads them after the experts): the op's
only output is `out`, compared as moe_experts compares it. A tie the rule decides differently, or one id off, moves a
whole expert's contribution, far past the tolerance; `ties` (most of a row tied) makes the rule decide.

What SGLang runs (0.5.17 and 0.5.23, CUDA, an unquantized bf16 / fp16 Qwen3-MoE at EP 1 with the standard dispatcher
and the Triton runner, the default on Hopper): Qwen3MoeSparseMoeBlock.forward_normal calls self.gate (the router
GEMM), then self.topk (TopK.forward_cuda -> select_experts -> fused_topk: moe_router's production, the Triton
router), then self.experts (FusedMoE.forward -> ... -> fused_experts: moe_experts' production). Production of this op
is the last two back to back; a speedup is over their sum. The only variant is `installed`, SGLang's fused_topk then
fused_experts_impl run by the adapter's `sequence`. The gate stays outside the op (the patch calls the block's own
self.gate: astra's moe_gate where that op is on).

dims as moe_experts': (num_tokens, hidden, inter, num_experts, topk); every shape has E <= 128 and K <= 16 (the
kernels route a row in one warp), H and I multiples of 8.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from astra_sglang.kernels.moe_experts import spec as experts_spec
from astra_sglang.kernels.moe_router import spec as router_spec
from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Variant, dedupe_shapes

# (model and TP, H, I / TP, E, K) of the models whose MoE block the patch replaces (Qwen3MoeSparseMoeBlock; at TP > 1
# a rank computes its shard of every expert's columns, EP stays SGLang's), from moe_experts' table
MODELS = tuple((f"{m} tp{tp}", h, i // tp, e, k) for m, h, i, e, k, tps in experts_spec.MOE_MODELS
               if m.startswith("qwen3-") for tp in tps)
DECODE = (1, 2)  # 2 tokens: a row the adapter leaves to SGLang (kernel 1 routes every token of its window there)


def corpus():
    return dedupe_shapes([Shape((t, h, i, e, k), ("decode",) if t > 1 else ("decode", "validate"), model)
                          for model, h, i, e, k in MODELS for t in DECODE])


EDGE = (
    Shape((1, 8, 8, 4, 1), ("edge",), "one vector per row, top-1 of 4 experts"),
    Shape((1, 264, 40, 16, 3), ("edge",), "rows shorter than a warp's vectors, top-3"),
    Shape((1, 2056, 1000, 8, 8), ("edge",), "every expert routed (K = E); H a partial 4-vector sweep; I % 64 != 0"),
    Shape((1, 1032, 264, 100, 6), ("edge",), "100 experts (a partial last lane group), top-6"),
    Shape((3, 512, 128, 64, 8), ("edge",), "3 tokens: a window routes each token in every warp"),
)

scalars = experts_spec.scalars
model_dims = experts_spec.model_dims


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """x, w13, w2, act and out as moe_experts' (its routing dropped); router_logits as moe_router's scores in the
    model dtype (normal: N(0, 1), bf16 rounding makes ties common at 128 experts; ties: integers in [-2, 2])."""
    t, h, inter, e, k = dims
    inp = experts_spec.make_inputs(dims, dtype, gen, "normal", device)
    del inp["topk_weights"], inp["topk_ids"]
    inp["router_logits"] = router_spec.make_inputs((t, e, k), dtype, gen, dist, device)["scores"]
    return inp


def route(logits, topk: int):
    """(weights fp64, ids int32) of the router: moe_router's reference order (descending, ties to the lowest id) and
    renormalized softmax weights, in fp64."""
    import torch

    w, ids = router_spec.route(logits.to(torch.float64), int(topk), True)
    return w, ids.to(torch.int32)


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any], model_dtype=None) -> Dict[str, Any]:
    """moe_router's fp64 route of the logits, then moe_experts' reference (rounded where SGLang stores)."""
    w, ids = route(inp["router_logits"], int(dims[4]))
    routed = {**inp, "topk_weights": w, "topk_ids": ids}
    return experts_spec.reference(routed, dims, scalars, model_dtype)


def bytes_moved(dims, dtype: str) -> int:
    """moe_experts' bytes with the logits read in place of the router's weights and ids."""
    t, h, inter, e, k = dims
    return experts_spec.bytes_moved(dims, dtype) - t * k * 8 + t * e * DTYPE_BYTES[dtype]


_MOE = "srt/models/qwen3_moe.py"
_TOPK = "srt/layers/moe/topk.py"

ABI = (
    AbiArg("x", "ptr", "in"),              # [T, H]
    AbiArg("router_logits", "ptr", "in"),  # [T, E]: the gate's output (dtype)
    AbiArg("w13", "ptr", "in"),            # [E, 2I, H]: gate rows, then up rows
    AbiArg("w2", "ptr", "in"),             # [E, H, I]
    AbiArg("act", "ptr", "inout"),         # [T, K, I] scratch; never compared
    AbiArg("out", "ptr", "out"),           # [T, H]
    AbiArg("num_tokens", "i64"),
    AbiArg("hidden", "i64"),
    AbiArg("inter", "i64"),
    AbiArg("num_experts", "i64"),
    AbiArg("topk", "i64"),
    AbiArg("routed_scaling_factor", "f64"),
    AbiArg("dtype", "i32"),
)

# What the adapter and the installed sequence rely on in SGLang's Python (0.5.17 and 0.5.23), besides moe_experts'
# and moe_router's facts (both sequences are theirs)
FACTS = experts_spec.FACTS + router_spec.SPEC.variant("installed").source_facts + (
    (_MOE, r"class Qwen3MoeSparseMoeBlock\(nn\.Module\):", "Qwen3-MoE's MoE block (the method patch replaces)"),
    (_MOE, r"^    def forward_normal\(\s*self,\s*hidden_states: torch\.Tensor,\s*\) -> torch\.Tensor:\n"
           r"        num_tokens, hidden_dim = hidden_states\.shape\n"
           r"        hidden_states = hidden_states\.view\(-1, hidden_dim\)\n",
     "forward_normal(self, hidden_states) flattens the tokens"),
    (_MOE, r"router_logits, _ = self\.gate\(hidden_states\)\n\s*topk_output = self\.topk\(hidden_states, "
           r"router_logits\)\n[\s\S]{0,160}?final_hidden_states = self\.experts\(hidden_states, topk_output\)\n",
     "forward_normal: gate, then topk on its logits, then the experts (the replacement runs the gate, then the op)"),
    (_MOE, r"return final_hidden_states\.view\(num_tokens, hidden_dim\)\n",
     "forward_normal returns the experts' output as [tokens, hidden]"),
    (_MOE, r"self\.topk = TopK\(\s*top_k=config\.num_experts_per_tok,\s*renormalize=norm_topk_prob,\s*"
           r"use_grouped_topk=False,", "the block's TopK: plain softmax top-k, renormalized by norm_topk_prob"),
    (_TOPK, r"def capture_routed_experts_if_allowed\(", "select_experts' routed-experts capture (the adapter reads "
     "whether it is on)"),
)

VARIANT = Variant(
    name="installed",
    description="SGLang's Qwen3-MoE block after the gate: fused_topk (the Triton router), then fused_experts for an "
    "unquantized silu-gated MoE (moe_align_block_size, two Triton fused_moe_kernel GEMMs, silu_and_mul, the top-k "
    "sum)",
    provenance="sglang/srt/models/qwen3_moe.py Qwen3MoeSparseMoeBlock.forward_normal -> self.topk (srt/layers/moe/"
    "topk.py TopK.forward_cuda -> select_experts -> fused_topk) -> self.experts (FusedMoE.forward -> "
    "UnquantizedFusedMoEMethod -> MoeRunner -> fused_experts_none_to_triton -> fused_experts -> fused_experts_impl)",
    sources=(),
    launcher="",
    flag_profile="sglang_jit",
    extra_flags=("--use_fast_math",),  # moe_experts' (silu's expf as SGLang builds it)
    source_facts=FACTS,
    dtypes=("fp16", "bf16"),
    requires_root="sglang_py",
    callable="sglang.srt.models.qwen3_moe:Qwen3MoeSparseMoeBlock.forward_normal",
)

SPEC = OpSpec(
    name="moe_topk_experts",
    summary="FUSED softmax top-k router + routed experts of a Qwen3-MoE layer at 1 decode token, from the gate's "
            "logits (moe_experts' two launches, each routing the logits itself; replaces SGLang's fused_topk and "
            "fused_experts, speedups are over both)",
    dim_names=experts_spec.SPEC.dim_names,
    abi=ABI,
    variants=(VARIANT,),
    default_variant=lambda roots: VARIANT.name,
    dtypes=("fp16", "bf16"),
    corpus=corpus(),
    edge_shapes=EDGE,
    tolerance=experts_spec.SPEC.tolerance,
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "ties"),
    replaces=("sglang.srt.models.qwen3_moe:Qwen3MoeSparseMoeBlock.forward_normal",),
    kernel_symbols=(r"astra_mtx::",),
    fuses=("moe_router", "moe_experts"),
)
