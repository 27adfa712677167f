"""moe_router: the softmax top-k router SGLang runs for Qwen3-MoE (and Mixtral, gpt-oss where it takes this path).

    topk_ids[t]     = the topk experts of scores[t, :] by descending fp32 logit, ties to the LOWEST expert id
    topk_weights[t] = softmax(scores[t, :])[topk_ids[t]]          (fp32; with renormalize: / their sum)

scores are the router GEMM's logits [tokens, experts] in the model dtype (bf16 / fp16; fp32 where a gate is fp32);
topk_weights fp32 [tokens, topk], topk_ids int32 [tokens, topk], slot k = the k-th largest. Nothing else is written.

What SGLang 0.5.17 runs (CUDA, the default SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK=1): TopK.forward_cuda ->
select_experts -> fused_topk(hidden_states, router_logits, topk, renormalize) (topk.py; correction_bias,
routed_scaling_factor and num_fused_shared_experts are not passed on for softmax) ->
  zero_bias = torch.zeros(E, float32)                 # a FillFunctor<float> kernel on every call (0.97 µs on H200)
  moe_fused_gate(gating_output, zero_bias, topk, scoring_func="softmax", renormalize=renormalize)
    -> _router_triton_kernel (kernels/ops/moe/moe_fused_gate.py): BLOCK_M = max(1, min(4, 256 // BLOCK_N)) rows
       per program, one warp (4 above 512 experts), PDL; logit + bias, softmax in fp32 (tl.exp), NaN ranked as
       -1e30, K rounds of row argmax where `lane_id = where(is_max, n, N + 1)`, `min(lane_id)`: the lowest expert
       id wins ties; the winner's lane is set to -inf; renormalize divides by the routed sum (1 when it is 0).
0.5.23: the same kernel, fused_topk passes bias=None (no fill) and routes on `_is_cuda` alone.

Models (config.json) whose decode step takes this path on Hopper: Qwen3-30B-A3B and Qwen3-235B-A22B (128 experts,
top 8, norm_topk_prob: renormalize), Mixtral-8x7B (8, top 2, renormalize). gpt-oss-20b / 120b (32 / 128 experts,
top 4, renormalize) only when SGLang's triton_kernels MoE runner is not used: its override picks
moe_runner_backend=triton_kernel when the `triton_kernels` package imports (then TopK returns a
TritonKernelTopKOutput from triton_kernels' own `routing`, not this kernel); without it, the Triton runner and this
router. Those rows carry the tag `if-no-triton-kernels`. Qwen1.5-MoE-A2.7B (60 experts, top 4, norm_topk_prob
false) is the edge shape without renormalize. DeepSeek-V3's grouped, biased sigmoid routing goes through
biased_grouped_topk_gpu, a different op.

Production cannot be extracted into CUDA (a Triton kernel): the only variant is `installed`, SGLang's
fused_topk itself through the adapter (harness/installed.py): the zero-bias fill + the Triton router, exactly what
a decode step pays per layer, both eager and in CUDA graphs.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes

# (name, experts, topk, renormalize, tags)
ROUTER_MODELS: Tuple[Tuple[str, int, int, bool, Tuple[str, ...]], ...] = (
    ("qwen3-30b-a3b", 128, 8, True, ()),
    ("qwen3-235b-a22b", 128, 8, True, ()),
    ("gpt-oss-20b", 32, 4, True, ("if-no-triton-kernels",)),
    ("gpt-oss-120b", 128, 4, True, ("if-no-triton-kernels",)),
    ("mixtral-8x7b", 8, 2, True, ()),
)
DECODE = (1, 8, 32, 64, 256)
PREFILL = (1024, 4096, 16384)
MAX_EXPERTS = 1024  # the shipped kernel holds a row in one warp's registers (32 values a lane)

# renormalize per (experts, topk): the harness's scalars depend on the shape alone
RENORMALIZE: Dict[Tuple[int, int], bool] = {(e, k): r for _, e, k, r, _ in ROUTER_MODELS}
RENORMALIZE[(60, 4)] = False  # Qwen1.5-MoE-A2.7B: norm_topk_prob false


def _corpus() -> Tuple[Shape, ...]:
    out = []
    for name, e, k, _, tags in ROUTER_MODELS:
        for t in DECODE + PREFILL:
            out.append(Shape((t, e, k), ("decode" if t in DECODE else "prefill",) + tags, name))
    return dedupe_shapes(out)


EDGE = (
    Shape((1, 60, 4), ("edge",), "qwen1.5-moe-a2.7b: 60 experts (not a power of 2), renormalize off"),
    Shape((3, 1, 1), ("edge",), "one expert, top 1"),
    Shape((5, 8, 8), ("edge",), "topk == experts"),
    Shape((33, 128, 8), ("edge",), "odd token count"),
    Shape((7, 1000, 16), ("edge",), "1000 experts (> 512: production's 4-warp programs), top 16"),
    Shape((2, 1024, 32), ("edge", "largest-row"), "the widest row the shipped kernel takes, top 32"),
    Shape((16384, 128, 8), ("edge", "largest"), "qwen3-moe prefill chunk"),
)


def renormalize_of(dims) -> int:
    return int(RENORMALIZE.get((int(dims[1]), int(dims[2])), True))


def scalars(dims) -> Dict[str, Any]:
    return {"topk": int(dims[2]), "renormalize": renormalize_of(dims)}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """scores: router logits. normal: N(0, 1) (bf16 rounding alone makes ties common at 128 experts);
    ties: integers in [-2, 2] (most of a row tied: the tie rule decides the ids); peaked: N(0, 8) (softmax
    weights span many orders of magnitude, tiny ones underflow)."""
    import torch

    from astra_sglang.spec import torch_dtype

    t, e, k = dims
    x = torch.randn((t, e), generator=gen, device=device, dtype=torch.float32)
    if dist == "ties":
        x = torch.randint(-2, 3, (t, e), generator=gen, device=device).to(torch.float32)
        if not bool((x != 0).any()):
            x[..., 0] = 1.0
    elif dist == "peaked":
        x = x * 8.0
    return {
        "scores": x.to(torch_dtype(dtype)),
        "topk_weights": torch.empty((t, k), device=device, dtype=torch.float32),
        "topk_ids": torch.empty((t, k), device=device, dtype=torch.int32),
    }


def one_hot_ids(ids, num_experts: int, dtype=None):
    """topk_ids [t, k] as one-hot rows [t, k, E] (0/1; an id outside [0, E) gives an all-zero row). The oracle's
    relative error of one differing id is then ~100 x sqrt(E), far above any tolerance: ids must match exactly."""
    import torch

    ids = ids.to(torch.int64)
    ok = (ids >= 0) & (ids < num_experts)
    oh = torch.zeros(tuple(ids.shape) + (num_experts,), dtype=dtype or torch.float32, device=ids.device)
    oh.scatter_(-1, torch.where(ok, ids, 0).unsqueeze(-1), ok.unsqueeze(-1).to(oh.dtype))
    return oh


def route(scores, topk: int, renormalize: bool):
    """(weights fp64, ids int64) of fp64 `scores` [t, E] holding the kernel's fp32 values exactly: the order is
    SGLang's (descending, ties to the lowest id: a stable sort), the weights exact softmax probabilities."""
    import torch

    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :topk]
    p = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    w = torch.gather(p, -1, order)
    den = w.sum(-1, keepdim=True) if renormalize else p.sum(-1, keepdim=True)
    return w / torch.where(den > 0, den, torch.ones_like(den)), order


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    t, e, k = dims
    # scalars may be absent (validate compares with tensors only): the shape's own renormalize then
    w, ids = route(inp["scores"].to(torch.float64), int(k), bool(scalars.get("renormalize", renormalize_of(dims))))
    return {"topk_weights": w, "topk_ids": one_hot_ids(ids, e, torch.float64)}


def canonical(outs: Dict[str, Any], dims) -> Dict[str, Any]:
    if "topk_ids" in outs and outs["topk_ids"].dim() == 2:
        outs["topk_ids"] = one_hot_ids(outs["topk_ids"], int(dims[1]))
    return outs


def bytes_moved(dims, dtype: str) -> int:
    t, e, k = dims
    return t * (e * DTYPE_BYTES[dtype] + k * 8)


_TOPK = "srt/layers/moe/topk.py"
_GATE = "kernels/ops/moe/moe_fused_gate.py"

SPEC = OpSpec(
    name="moe_router",
    summary="MoE softmax top-k router: topk_ids by descending logit (ties: lowest id), softmax weights "
    "(renormalized over the top k when asked)",
    dim_names=("num_tokens", "num_experts", "top_k"),
    abi=(
        AbiArg("scores", "ptr", "in"),
        AbiArg("topk_weights", "ptr", "out"),
        AbiArg("topk_ids", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("num_experts", "i64"),
        AbiArg("topk", "i64"),
        AbiArg("renormalize", "i32"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="installed",
            description="SGLang's installed fused_topk (the per-call zero-bias fill + the Triton router)",
            provenance="sglang/srt/layers/moe/topk.py fused_topk (softmax, CUDA) -> torch.zeros(E) [0.5.17] -> "
            "sglang/kernels/ops/moe/moe_fused_gate.py moe_fused_gate -> _router_triton_kernel (Triton, PDL)",
            sources=(),
            launcher="",
            flag_profile="sglang_jit",
            source_facts=(
                (_TOPK, r"^def fused_topk\(\s*hidden_states: torch\.Tensor,\s*gating_output: torch\.Tensor,\s*"
                        r"topk: int,\s*renormalize: bool,\s*correction_bias: Optional\[torch\.Tensor\] = None,\s*"
                        r"scoring_func: str = \"softmax\",",
                 "fused_topk(hidden_states, gating_output, topk, renormalize, correction_bias=None, "
                 "scoring_func='softmax', ...): the parameters the adapter binds"),
                (_TOPK, r"elif (?P<ROUTE>_is_cuda and envs\.SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK\.get\(\)|"
                        r"_is_cuda or use_rocm_triton):\s*# Unified Triton router",
                 "on CUDA the softmax branch of fused_topk takes the unified Triton router (ROUTE: its condition)"),
                (_TOPK, r"topk_weights, topk_ids = _jit_moe_fused_gate\(\s*gating_output,\s*"
                        r"(?P<SOFTMAX_BIAS>zero_bias|None),\s*topk,\s*scoring_func=\"softmax\",\s*"
                        r"renormalize=renormalize,\s*\)",
                 "the softmax router gets a zero (or no) bias and renormalize only: no correction bias, no "
                 "routed scaling, no shared experts (SOFTMAX_BIAS: zero_bias = a fill per call)"),
                (_GATE, r"weights = torch\.empty\(\(M, K\), dtype=torch\.float32, device=scores\.device\)\s*"
                        r"indices = torch\.empty\(\(M, K\), dtype=torch\.int32, device=scores\.device\)",
                 "outputs: topk_weights fp32 [M, K], topk_ids int32 [M, K], returned"),
                (_GATE, r"lane_id = tl\.where\(is_max, offs_n\[None, :\], N \+ 1\)\s*# lowest expert id wins ties\s*"
                        r"win_lane = tl\.min\(lane_id, axis=1\)",
                 "ties: the lowest expert id among equal scores wins each round"),
                (_GATE, r"(?P<TAKEN>cur = tl\.where\(offs_n\[None, :\] == win_lane, -float\(\"inf\"\), cur\)|"
                        r"remaining = remaining & \(offs_n\[None, :\] != win_lane\))",
                 "a winner leaves the race (0.5.17: its score becomes -inf, 0.5.23: excluded for good; the same "
                 "ids whenever the row has at least topk finite logits)"),
                (_GATE, r"activated = exp_row / row_sum",
                 "softmax weights: exp(logit - row max) / row sum, in fp32"),
                (_GATE, r"norm = tl\.where\(routed_sum > 0\.0, routed_sum, 1\.0\)",
                 "renormalize divides by the routed sum, by 1 when it is 0"),
                (_GATE, r"if \(\s*scoring_func\.lower\(\) == \"sigmoid\"",
                 "the radix-select fast path is sigmoid-only: softmax always runs the Triton kernel"),
            ),
            dtypes=("fp32", "fp16", "bf16"),
            requires_root="sglang_py",
            callable="sglang.srt.layers.moe.topk:fused_topk",
        ),
    ),
    default_variant=lambda roots: "installed",
    dtypes=("fp32", "fp16", "bf16"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    # weights: fp32 outputs (2x production's error, fp32 floor); ids: one-hot canonical form, no slack
    tolerance=Tolerance(k=2.0, floor={"fp32": 1e-5, "fp16": 1e-5, "bf16": 1e-5, "int32": 0.0}),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "ties", "peaked"),
    replaces=("sglang.srt.layers.moe.topk:fused_topk",),
    # SGLang: the Triton router (0.5.23 also its sm120 top-22 variant), the zero-bias fill is a generic
    # FillFunctor (not attributed here: other fills share the name); astra's astra_moer:: kernel
    kernel_symbols=(r"_router_triton_kernel", r"astra_moer::"),
    canonical=canonical,
)
