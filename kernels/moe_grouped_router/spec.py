"""moe_grouped_router: the grouped, biased sigmoid top-k router SGLang runs for DeepSeek-V3 / R1 (and Kimi-K2, one group).

With s = sigmoid(logit) and b = e_score_correction_bias (both per expert), ranking keys are fp32 values
key[e] = fp32(s[e]) + b[e] (rounded to fp32: what every production path ranks on):

    group score[g]  = the two largest keys of group g, counted with multiplicity, added in fp32 (top1 + top2;
                      a group of one expert scores -inf)
    kept groups     = the topk_group groups of largest score, ties to the LOWEST group id
    topk_ids[t]     = the topk experts of the kept groups by descending key, ties to the LOWEST expert id
    topk_weights[t] = s[topk_ids] (unbiased) / their sum (renormalize; by 1 when the sum is 0), times
                      routed_scaling_factor only when apply_routed_scaling_factor_on_output
    shared columns  = the last n_shared of the topk columns (num_fused_shared_experts, SGLang's fused shared
                      expert): id = num_experts, weight = the routed weights' sum / routed_scaling_factor
                      (SGLang 0.5.17; shared_weight < 0), or fp32(shared_weight) (0.5.23's constant; >= 0)

scores: router logits [tokens, experts] (fp32 in SGLang: MoEGate returns fp32 logits on CUDA; fp16 / bf16 accepted,
SGLang casts them to fp32 exactly); bias fp32 [experts]; topk_weights fp32 [tokens, topk]; topk_ids int32
[tokens, topk], slot k = the k-th largest key (topk counts the shared columns, as SGLang's topk argument does).
Nothing else is written.

What SGLang 0.5.17 runs on Hopper (srt/layers/moe/topk.py; source facts below guard each point):
  DeepseekV2MoE builds TopK(use_grouped_topk=True, num_expert_group=n_group, topk_group, correction_bias=
  gate.e_score_correction_bias (an fp32 Parameter), renormalize=norm_topk_prob, routed_scaling_factor,
  apply_routed_scaling_factor_on_output=experts.should_fuse_routed_scaling_factor_in_topk) -> select_experts ->
  `biased_grouped_topk` (= biased_grouped_topk_gpu off CPU-AMX) ->
  * n_group > 1, SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK (default False) off, flashinfer's fused_topk_deepseek
    importable, experts a power of 2, topk - shared <= 8, experts/group <= 32 and experts/group * topk_group <= 128
    (DeepSeek-V3: 256 / 8 groups, keep 4, top 8: yes) -> flashinfer `fused_topk_deepseek` (NoAuxTc ->
    deepseek_v3_topk_kernel, TensorRT-LLM's noaux_tc kernel; CUDA, JIT-built by flashinfer) on
    gating_output.to(float32) and the bias as is; scaling_factor = routed_scaling_factor only when
    apply_routed_scaling_factor_on_output, else 1.0. 0.5.17 passes `True` in the 9th position, which is
    flashinfer's launch_with_pdl, not renormalize: the kernel always renormalizes (0.5.23 then requires
    renormalize to take this path). flashinfer's tie rules (read in flashinfer 0.7.2's csrc: noAuxTcKernels.cu,
    moeTopKFuncs.cuh; the same in 0.6.15.post1, the version 0.5.17 pins, re-read 2026-11-27): sigmoid
    0.5*tanhf(x/2)+0.5 in fp32, keys packed (value bits, 65535 - index) and reduced by max, so equal values go to
    the lower index; group score = top-2 of the group's keys counted with multiplicity (a tied maximum counts
    twice); weights s * scale / (sum + 1e-20) in double, stored as fp32.
  * n_group > 1 otherwise (the env flag on, or flashinfer missing / shape out of its limits) -> the Triton router
    (kernels/ops/moe/moe_fused_gate.py, N_GROUP > 1): same order and id ties, but its group top-2 drops EVERY
    value equal to the maximum (`vals >= top1`), so a group whose maximum is tied scores differently. The
    adapter leaves those calls to SGLang.
  * n_group == 1 (Kimi-K2: 384 experts): not a power of 2 -> the Triton router ungrouped (fp32 logits; the radix
    fast path covers only 896 experts / top 16): sigmoid + bias keys, lowest id on ties, NaN as -1e30, renormalize
    by the routed sum (1 when 0), then the scale when asked. A power-of-2 expert count <= 384 with topk <= 8 takes
    flashinfer ungrouped instead: same result.
  Fused shared experts: 0.5.17 fuses DeepSeek-V3/R1's shared expert into the MoE by default on NVIDIA sm >= 80
  without EP (num_fused_shared_experts = 1: topk 9). On flashinfer's path SGLang routes topk - 1 experts, then
  F.pads the ids with num_experts and the weights with 0, and sets the shared column to the routed weights' sum /
  routed_scaling_factor: four more kernels after flashinfer's, all in this op. With EP, DeepEP, SBO/TBO or
  --disable-shared-experts-fusion there is no shared column (n_shared 0). Kimi-K2's fused shared expert goes to the
  Triton router, which appends it its own way: those calls stay SGLang's (adapter).

SGLang 0.5.23 (the facts below hold in both): the same paths and contract for calls without a shared column
(flashinfer's branch now also requires renormalize and a 1-D bias; Kimi-K2's Triton router gained options its call
leaves at their defaults). The shared column's weight is instead a constant, fused_shared_expert_weight: 1 when
the scale is applied in top-k, else fp32(1 / routed_scaling_factor), which the routed sum / routed_scaling_factor
misses by an ulp in some rows: the adapter passes SGLang's own value as the ABI scalar shared_weight there
(-1 on 0.5.17: the sum form), and the CONST_SHARED_EDGES edge rows check that path.

Models: DeepSeek-V3 / R1 (config.json: n_routed_experts 256, num_experts_per_tok 8, n_group 8, topk_group 4,
routed_scaling_factor 2.5, norm_topk_prob true, scoring_func sigmoid, topk_method noaux_tc); Kimi-K2 (384, top 8,
n_group 1, topk_group 1, routed_scaling_factor 2.827). The router is replicated under TP: no sharded widths.
With the default Hopper MoE backends (Triton fused_moe, bf16 / fp8) should_fuse_routed_scaling_factor_in_topk is
False: the scale is applied outside, to the MoE output (DeepseekV2MoE), so the corpus rows carry apply = 0.

Production is SGLang's installed biased_grouped_topk_gpu (flashinfer / Triton: nothing to extract into CUDA): the
only variant is `installed`, as moe_router's (harness/installed.py).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes

# (name, experts, routed topk, n_group, topk_group, routed_scaling_factor, fused shared columns as SGLang calls it)
ROUTER_MODELS: Tuple[Tuple[str, int, int, int, int, float, Tuple[int, ...]], ...] = (
    ("deepseek-v3", 256, 8, 8, 4, 2.5, (1, 0)),   # 1: the default on Hopper without EP; 0: EP / DeepEP / disabled
    ("deepseek-r1", 256, 8, 8, 4, 2.5, (1, 0)),
    ("kimi-k2", 384, 8, 1, 1, 2.827, (0,)),      # its fused shared column is the Triton router's (not this op's)
)
DECODE = (1, 8, 32, 64, 256)
PREFILL = (1024, 4096, 16384)
MAX_EXPERTS = 1024  # the shipped kernel: one CTA per token, one thread per expert
MAX_TOPK = 32       # slot r lives in lane r of warp 0
MAX_GROUPS = 32     # group g's score lives in lane g of warp 0
MAX_GROUP_EXPERTS = 32  # a group is one segment of <= 32 lanes (SGLang's flashinfer path has the same limit)

# (routed_scaling_factor, apply_routed_scaling_factor_on_output) per (experts, topk, n_group, topk_group, n_shared)
SCALING: Dict[Tuple[int, ...], Tuple[float, int]] = {
    (e, k + s, g, tg, s): (r, 0) for _, e, k, g, tg, r, shared in ROUTER_MODELS for s in shared}
# edge shapes whose scale is applied in the router (cutlass / flashinfer-trtllm-routed fp8, ModelOpt NVFP4 runners)
SCALED_EDGES = ((7, 256, 8, 8, 4, 0), (6, 256, 9, 8, 4, 1))
# edge shapes with SGLang 0.5.23's constant shared-column weight (fused_shared_expert_weight), dims -> apply ... on_output
CONST_SHARED_EDGES: Dict[Tuple[int, ...], int] = {(9, 256, 9, 8, 4, 1): 0, (11, 256, 9, 8, 4, 1): 1}


def _corpus() -> Tuple[Shape, ...]:
    out = []
    for name, e, k, g, tg, _, shared in ROUTER_MODELS:
        for s in shared:
            for t in DECODE + PREFILL:
                tag = "decode" if t in DECODE else "prefill"
                out.append(Shape((t, e, k + s, g, tg, s), (tag,), name + (" fused shared expert" if s else "")))
    return dedupe_shapes(out)


EDGE = (
    Shape(SCALED_EDGES[0], ("edge", "scaled"),
          "deepseek-v3 with the scale applied in the router (apply ... on_output)"),
    Shape(SCALED_EDGES[1], ("edge", "scaled"), "deepseek-v3, scale applied in the router, fused shared expert"),
    *(Shape(d, ("edge", "shared-constant"), "deepseek-v3, fused shared expert, SGLang 0.5.23's constant shared weight"
            + (", scale applied in the router" if a else "")) for d, a in CONST_SHARED_EDGES.items()),
    Shape((33, 256, 8, 8, 4, 0), ("edge",), "odd token count"),
    Shape((5, 160, 8, 1, 1, 0), ("edge",), "160 experts, one group (not a power of 2: SGLang's Triton path)"),
    Shape((6, 64, 6, 8, 3, 0), ("edge",), "8 experts a group, keep 3 groups, top 6"),
    Shape((3, 64, 8, 8, 3, 2), ("edge",), "8 experts a group, top 6 and two shared columns"),
    Shape((4, 16, 4, 8, 2, 0), ("edge",), "2 experts a group: topk == kept experts"),
    Shape((3, 32, 1, 4, 1, 0), ("edge",), "top 1 in one kept group"),
    Shape((3, 8, 8, 1, 1, 0), ("edge",), "topk == experts"),
    Shape((3, 128, 5, 4, 2, 1), ("edge",), "4 groups of 32, keep 2, top 4 and a fused shared expert"),
    Shape((2, 1024, 32, 32, 8, 0), ("edge", "largest-row"), "the widest row the shipped kernel takes: 32 groups, "
          "top 32"),
)


def scaling_of(dims) -> Tuple[float, int]:
    d = tuple(int(x) for x in dims)
    if d in SCALED_EDGES:
        return 2.5, 1
    if d in CONST_SHARED_EDGES:
        return 2.5, CONST_SHARED_EDGES[d]
    if d[5]:
        return 2.5, 0  # a shared column's weight divides by the scale: never 1 where it is tested
    return SCALING.get(d[1:], (1.0, 0))


def shared_weight(routed_scaling_factor: float, apply: int) -> float:
    """SGLang 0.5.23's fused_shared_expert_weight for a routed_scaling_factor > 0: 1 when the scale is applied in the
    router, else 1 / routed_scaling_factor (F.pad stores it as fp32)."""
    return 1.0 if apply else 1.0 / routed_scaling_factor


def scalars(dims) -> Dict[str, Any]:
    rsf, apply = scaling_of(dims)
    d = tuple(int(x) for x in dims)
    # shared_weight < 0: the shared columns carry the routed sum / routed_scaling_factor (0.5.17); >= 0: that value
    sw = shared_weight(rsf, apply) if d in CONST_SHARED_EDGES else -1.0
    return {"topk": int(dims[2]), "num_expert_group": int(dims[3]), "topk_group": int(dims[4]),
            "num_fused_shared_experts": int(dims[5]), "renormalize": 1, "routed_scaling_factor": float(rsf),
            "apply_routed_scaling_factor_on_output": int(apply), "shared_weight": sw}


scalars_of = scalars  # reference() takes a parameter of that name


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """scores: router logits; bias: the correction bias (fp32).
    normal: logits N(0, 2), bias N(0, 0.1) (DeepSeek-V3's trained biases are of that order);
    ties: logits integers in [0, 3], one bias per group from {1/8, 1/4, 3/8} (never all zero, as inputs must
    not be): most keys tie exactly in every implementation (equal logits in a group), distinct keys and
    distinct group sums stay far apart (tested: a bias varying inside a group would make (s1 + b) + s0 and
    s1 + (s0 + b) equal reals whose fp32 sums depend on the last ulp of each implementation's sigmoid), so
    the tie rules decide;
    peaked: logits N(0, 3) with a quarter at 30 (sigmoid exactly 1.0f in every implementation): saturated keys
    1 + bias, weights over orders of magnitude."""
    import torch

    from astra_sglang.spec import torch_dtype

    t, e = int(dims[0]), int(dims[1])
    k = int(dims[2])
    x = _logits((t, e), gen, device, dist)
    b = torch.randn((e,), generator=gen, device=device, dtype=torch.float32) * 0.1
    if dist == "ties":
        g = int(dims[3])
        x = torch.randint(0, 4, (t, e), generator=gen, device=device).to(torch.float32)
        b = (torch.randint(1, 4, (g,), generator=gen, device=device).to(torch.float32) / 8.0).repeat_interleave(e // g)
    else:   # random keys: redraw the rows a sigmoid's last bits could reorder (near_tie_rows); only those change
        rows = near_tie_rows(x.to(torch_dtype(dtype)), b, dims).nonzero().flatten()
        for _ in range(REDRAWS):
            if rows.numel() == 0:
                break
            x[rows] = _logits((rows.numel(), e), gen, device, dist)
            rows = rows[near_tie_rows(x[rows].to(torch_dtype(dtype)), b, dims)]
    return {
        "scores": x.to(torch_dtype(dtype)),
        "bias": b,
        "topk_weights": torch.empty((t, k), device=device, dtype=torch.float32),
        "topk_ids": torch.empty((t, k), device=device, dtype=torch.int32),
    }


# Random keys closer than this at a decision point are redrawn. flashinfer's router ranks on a fast-math sigmoid
# (0.5 tanhf(x/2) + 0.5, built -use_fast_math) that is off by ~3e-6; keys or group scores nearer than that order
# differently from the correctly rounded reference about once in 2,000 DeepSeek-V3 rows, and bench's re-check, which
# judges production on its own over 16,384 rows, marked every row FAILED for it (H200 2026-11-27). Exact ties are
# the "ties" distribution's business; near ties are rounding, not a tie rule.
NEAR_TIE = 3e-5
REDRAWS = 20


def _logits(shape, gen, device, dist: str):
    """normal: N(0, 2); peaked: N(0, 3) with a quarter at 30 (sigmoid exactly 1.0f everywhere)."""
    import torch

    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 2.0
    if dist == "peaked":
        x = x * 1.5
        x = torch.where(torch.rand(shape, generator=gen, device=device) < 0.25, torch.full_like(x, 30.0), x)
    return x


def near_tie_rows(scores, bias, dims, eps: float = NEAR_TIE):
    """Rows [t] whose routing turns on a gap below eps: the kept-group boundary (group scores), or any two adjacent
    keys among the top-k + 1 of the kept groups (slot order and the boundary). An exact fp32 tie of different
    logits counts too: another sigmoid's rounding splits it (saturated keys, 1.0 + bias, never tie: biases differ)."""
    import torch

    shared = int(dims[5])
    k, g, kg = int(dims[2]) - shared, int(dims[3]), int(dims[4])
    keys = ranking_keys(scores.to(torch.float64), bias)
    t, e = keys.shape
    near = torch.zeros(t, dtype=torch.bool, device=keys.device)
    gscore, masked = _kept_groups(keys, g, kg)
    if gscore is not None and kg < g:
        top = torch.sort(gscore, dim=-1, descending=True).values
        gap = top[:, kg - 1] - top[:, kg]
        near |= gap < eps
    v = torch.sort(masked, dim=-1, descending=True).values[:, :min(k + 1, e)]
    gaps = v[:, :-1] - v[:, 1:]
    near |= (gaps < eps).any(-1)
    return near


def _kept_groups(keys, n_group: int, topk_group: int):
    """(group scores [t, G] or None, keys with the experts of dropped groups at -inf): SGLang's group selection,
    the top-2 keys of each group summed in fp32, the topk_group largest kept (ties: the lowest group id)."""
    import torch

    t, e = keys.shape
    if n_group <= 1:
        return None, keys
    epg = e // n_group
    grouped = keys.view(t, n_group, epg)
    if epg >= 2:
        top2 = torch.topk(grouped, 2, dim=-1).values  # with multiplicity: a tied maximum counts twice
        gscore = top2[..., 0] + top2[..., 1]          # fp32, top1 + top2
    else:
        gscore = torch.full((t, n_group), float("-inf"), dtype=torch.float32, device=keys.device)
    kept = torch.sort(gscore, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    gmask = torch.zeros((t, n_group), dtype=torch.bool, device=keys.device)
    gmask.scatter_(1, kept, True)
    return gscore, torch.where(gmask.repeat_interleave(epg, dim=1), keys, torch.full_like(keys, float("-inf")))


def one_hot_ids(ids, num_experts: int, dtype=None):
    """topk_ids [t, k] as one-hot rows [t, k, E] (an id outside [0, E) gives an all-zero row): ids must match
    exactly, slot order included."""
    import torch

    ids = ids.to(torch.int64)
    ok = (ids >= 0) & (ids < num_experts)
    oh = torch.zeros(tuple(ids.shape) + (num_experts,), dtype=dtype or torch.float32, device=ids.device)
    oh.scatter_(-1, torch.where(ok, ids, 0).unsqueeze(-1), ok.unsqueeze(-1).to(oh.dtype))
    return oh


def ranking_keys(scores64, bias):
    """fp32 keys: the fp64 sigmoid rounded to fp32, plus the fp32 bias in fp32 (correctly rounded, as the GPU adds)."""
    import torch

    return torch.sigmoid(scores64.to(torch.float64)).to(torch.float32) + bias.to(torch.float32)


def route(scores, bias, topk: int, n_group: int, topk_group: int, renormalize: bool = True, scale: float = 1.0):
    """(weights fp64, ids int64) of `scores` [t, E] (values exact in fp64) and `bias` [E]: groups and experts are
    ranked on fp32 keys (ranking_keys) by stable descending sorts (ties: the lowest id), weights are exact."""
    import torch

    keys = ranking_keys(scores, bias)  # [t, E] fp32
    _, keys = _kept_groups(keys, n_group, topk_group)
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :topk]
    s = torch.sigmoid(scores.to(torch.float64))
    w = torch.gather(s, -1, order)
    if renormalize:
        den = w.sum(-1, keepdim=True)
        w = w / torch.where(den > 0, den, torch.ones_like(den))
    return w * float(scale), order


def id_classes(dims) -> int:
    """One-hot width of topk_ids: the experts, plus the shared columns' id (num_experts) when there are any."""
    return int(dims[1]) + (1 if int(dims[5]) else 0)


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    sc = {**scalars_of(dims), **dict(scalars or {})}
    rsf = float(sc["routed_scaling_factor"])
    scale = rsf if int(sc["apply_routed_scaling_factor_on_output"]) else 1.0
    shared = int(dims[5])
    w, ids = route(inp["scores"], inp["bias"], int(dims[2]) - shared, int(dims[3]), int(dims[4]),
                   bool(sc["renormalize"]), scale)
    sw = float(sc.get("shared_weight", -1.0))
    if shared:  # SGLang's F.pad columns after flashinfer: id num_experts, weight routed sum / rsf (0.5.17) or constant
        col = w.sum(-1, keepdim=True) / rsf if sw < 0 else torch.full_like(w[:, :1], float(torch.tensor(sw).float()))
        w = torch.cat([w, col.expand(-1, shared)], dim=-1)
        ids = torch.cat([ids, torch.full((ids.shape[0], shared), int(dims[1]), dtype=ids.dtype,
                                         device=ids.device)], dim=-1)
    return {"topk_weights": w, "topk_ids": one_hot_ids(ids, id_classes(dims), torch.float64)}


def canonical(outs: Dict[str, Any], dims) -> Dict[str, Any]:
    if "topk_ids" in outs and outs["topk_ids"].dim() == 2:
        outs["topk_ids"] = one_hot_ids(outs["topk_ids"], id_classes(dims))
    return outs


def bytes_moved(dims, dtype: str) -> int:
    t, e, k = int(dims[0]), int(dims[1]), int(dims[2])
    return t * (e * DTYPE_BYTES[dtype] + k * 8) + e * 4


_TOPK = "srt/layers/moe/topk.py"
_ENV = "srt/environ.py"
_GATE = "kernels/ops/moe/moe_fused_gate.py"
_DSV2 = "srt/models/deepseek_v2.py"
_RADIX = "kernels/ops/moe/moe_route_radix.py"

SOURCE_FACTS = (
    (_TOPK, r"^def biased_grouped_topk_gpu\(\s*hidden_states: torch\.Tensor,\s*gating_output: torch\.Tensor,\s*"
            r"correction_bias: torch\.Tensor,\s*topk: int,\s*renormalize: bool,\s*"
            r"num_expert_group: Optional\[int\] = None,\s*topk_group: Optional\[int\] = None,\s*"
            r"num_fused_shared_experts: int = 0,\s*routed_scaling_factor: Optional\[float\] = None,\s*"
            r"apply_routed_scaling_factor_on_output: Optional\[bool\] = False,\s*\)",
     "biased_grouped_topk_gpu(hidden_states, gating_output, correction_bias, topk, renormalize, num_expert_group, "
     "topk_group, num_fused_shared_experts=0, routed_scaling_factor=None, apply_...=False): what the adapter binds"),
    (_TOPK, r"^    biased_grouped_topk = biased_grouped_topk_gpu$",
     "off CPU-AMX, select_experts' `biased_grouped_topk` is biased_grouped_topk_gpu"),
    (_TOPK, r"topk_weights, topk_ids = biased_grouped_topk\(\s*hidden_states=hidden_states,\s*"
            r"gating_output=router_logits,\s*correction_bias=correction_bias,",
     "select_experts routes grouped top-k with a correction bias through biased_grouped_topk"),
    (_ENV, r"SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK = EnvBool\(False\)",
     "the Triton grouped router is opt-in (default off): DeepSeek-V3 shapes take flashinfer"),
    (_TOPK, r"from flashinfer\.fused_moe import fused_topk_deepseek as _fused_topk_deepseek",
     "the DeepSeek-V3 path is flashinfer's fused_topk_deepseek"),
    (_TOPK, r"and fused_topk_deepseek is not None\s*"
            r"(?:# flashinfer always renormalizes the selected weights\s*and renormalize\s*)?"
            r"and is_power_of_two\(num_experts\)\s*"
            r"# flashinfer constraints \(applied to routed experts only\)\s*and topk_routed <= 8\s*"
            r"and topk_group <= num_expert_group\s*and topk_group \* num_expert_group >= topk_routed\s*"
            r"and \(\s*\(experts_per_group <= 32 and experts_per_group \* topk_group <= 128\)\s*"
            r"if num_expert_group > 1\s*else num_experts <= 384\s*\)\s*(?:and not dynamic_bias\s*)?\):",
     "flashinfer's limits (power-of-2 experts, topk <= 8, <= 32 experts a group, <= 128 kept experts; <= 384 "
     "ungrouped; 0.5.23 adds renormalize and a 1-D bias, which the adapter requires anyway) and nothing else: the "
     "adapter's route mirrors them"),
    (_TOPK, r"scaling_factor = 1\.0\s*if routed_scaling_factor is not None and apply_routed_scaling_factor_on_output:"
            r"\s*scaling_factor = routed_scaling_factor",
     "flashinfer applies routed_scaling_factor only with apply_routed_scaling_factor_on_output"),
    (_TOPK, r"fused_topk_deepseek\(\s*gating_output\.to\(dtype=torch\.float32\),\s*correction_bias,\s*"
            r"num_expert_group,\s*topk_group,\s*topk_routed,\s*scaling_factor,\s*topk_weights,\s*topk_ids,\s*"
            r"(?P<FI_LAST>True|launch_with_pdl=True),\s*\)",
     "flashinfer gets fp32 logits, the bias as is, fp32 / int32 outputs (FI_LAST: 0.5.17 passes True "
     "positionally = launch_with_pdl: it always renormalizes)"),
    (_TOPK, r"topk_routed = topk - num_fused_shared_experts",
     "flashinfer routes topk - num_fused_shared_experts experts (the shape's top_k counts the shared columns)"),
    (_TOPK, r"topk_ids = F\.pad\(topk_ids, \(0, num_fused_shared_experts\), value=num_experts\)\s*(?:"
            r"topk_weights = F\.pad\(topk_weights, \(0, num_fused_shared_experts\)\)\s*"
            r"if routed_scaling_factor is not None:\s*topk_weights\[:, topk_routed:\] = \(\s*"
            r"topk_weights\[:, :topk_routed\]\.sum\(dim=-1, keepdim=True\)\s*/ routed_scaling_factor\s*\)"
            r"|topk_weights = F\.pad\(\s*topk_weights,\s*\(0, num_fused_shared_experts\),\s*"
            r"value=fused_shared_expert_weight\(\s*routed_scaling_factor=routed_scaling_factor,\s*"
            r"fused_in_topk=bool\(apply_routed_scaling_factor_on_output\),\s*\),\s*\))",
     "after flashinfer, the shared columns: id num_experts, weight = the routed weights' sum / "
     "routed_scaling_factor (0.5.17; 0 when it is None: the adapter leaves those calls to SGLang) or 0.5.23's "
     "constant fused_shared_expert_weight (the adapter passes SGLang's value as the ABI's shared_weight)"),
    (_TOPK, r"topk_weights = torch\.empty\(\s*\(num_tokens, topk_routed\), dtype=torch\.float32, "
            r"device=gating_output\.device\s*\)\s*topk_ids = torch\.empty\(\s*\(num_tokens, topk_routed\), "
            r"dtype=torch\.int32, device=gating_output\.device\s*\)",
     "outputs: topk_weights fp32, topk_ids int32 [tokens, topk]"),
    (_TOPK, r"_jit_gate_ok = \(\s*_is_cuda\s*(?:and not dynamic_bias\s*)?and num_expert_group == 1\s*"
            r"and \(topk_group is None or topk_group == 1\)\s*and \(\s*num_experts == 384",
     "Kimi-K2 (384 experts, one group) takes the Triton router (0.5.23: with a 1-D bias)"),
    (_TOPK, r"return jit_gate\(\s*_gating,\s*correction_bias\.to\(dtype=torch\.float32\),\s*topk=topk,\s*"
            r"scoring_func=\"sigmoid\",\s*num_fused_shared_experts=num_fused_shared_experts,\s*renormalize=renormalize,\s*"
            r"routed_scaling_factor=\(\s*routed_scaling_factor if routed_scaling_factor is not None else 1\.0\s*\),\s*"
            r"apply_routed_scaling_factor_on_output=apply_routed_scaling_factor_on_output,\s*\)",
     "the Kimi-K2 call passes no renormalize epsilon, padding count, per-token bias or group (0.5.23's new options "
     "keep their defaults)"),
    (_GATE, r"activated = tl\.sigmoid\(scores\)\s*biased = activated \+ bias\[None, :\]"
            r"|row_bias = bias\[None, :\]\s*if HAS_TOKEN_BIAS:\s*input_ids = tl\.load\([^)]*\)\s*"
            r"row_bias = tl\.where\(\s*\(input_ids == BIAS_ALT_TOKEN_ID\)\[:, None\], bias_alt\[None, :\], row_bias\s*\)\s*"
            r"row_ptr = [^\n]*\n(?:(?!.*row_bias =)[^\n]*\n){0,12}?\s*"
            r"activated = tl\.sigmoid\(scores\)\s*biased = activated \+ row_bias",
     "Triton: sigmoid keys plus the bias (0.5.23: a per-token bias only with input_ids, which topk.py never "
     "passes); the weight is the unbiased sigmoid"),
    (_GATE, r"lane_id = tl\.where\(is_max, offs_n\[None, :\], N \+ 1\)\s*# lowest expert id wins ties",
     "Triton: the lowest expert id wins ties"),
    (_GATE, r"glane = tl\.where\(gcur == gmax, offs_g\[None, :\], N_GROUP \+ 1\)\s*"
            r"win_g = tl\.min\(glane, axis=1\)\[:, None\]",
     "Triton grouped: the lowest group id wins ties"),
    (_GATE, r"norm = tl\.where\(routed_sum > 0\.0, routed_sum, 1\.0\)",
     "Triton: renormalize by the routed sum (1 when 0)"),
    (_GATE, r"if APPLY_SCALE:\s*selected_vals = selected_vals \* routed_scaling_factor",
     "Triton: the scale multiplies after the renormalization, only when asked"),
    (_GATE, r"scoring_func\.lower\(\) == \"sigmoid\"\s*and num_fused_shared_experts == 0\s*"
            r"and num_expert_group <= 1\s*and moe_softcapping == 0\.0\s*(?:and [^\n]*\s*)*\):\s*radix_args = \(",
     "the radix fast path is ungrouped sigmoid only"),
    (_RADIX, r"^_NUM_EXPERTS = 896$", "the radix fast path covers 896 experts only (not Kimi-K2's 384)"),
    (_RADIX, r"^_TOPK = 16$", "the radix fast path covers top 16 only"),
    (_DSV2, r"correction_bias_dtype = torch\.float32",
     "DeepSeek's e_score_correction_bias is an fp32 Parameter (bf16 only under aiter)"),
)

SPEC = OpSpec(
    name="moe_grouped_router",
    summary="MoE grouped biased-sigmoid top-k router (DeepSeek-V3 noaux_tc): groups by their top-2 biased sum, "
    "experts by biased sigmoid (ties: lowest id), renormalized unbiased sigmoid weights",
    dim_names=("num_tokens", "num_experts", "top_k", "n_group", "n_topk_group", "n_shared"),
    abi=(
        AbiArg("scores", "ptr", "in"),
        AbiArg("bias", "ptr", "in"),
        AbiArg("topk_weights", "ptr", "out"),
        AbiArg("topk_ids", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("num_experts", "i64"),
        AbiArg("topk", "i64"),
        AbiArg("num_expert_group", "i64"),
        AbiArg("topk_group", "i64"),
        AbiArg("num_fused_shared_experts", "i64"),
        AbiArg("renormalize", "i32"),
        AbiArg("routed_scaling_factor", "f64"),
        AbiArg("apply_routed_scaling_factor_on_output", "i32"),
        AbiArg("shared_weight", "f64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="installed",
            description="SGLang's installed biased_grouped_topk_gpu (flashinfer fused_topk_deepseek for "
            "DeepSeek-V3, the Triton router for Kimi-K2)",
            provenance="sglang/srt/layers/moe/topk.py biased_grouped_topk_gpu -> flashinfer.fused_moe."
            "fused_topk_deepseek (NoAuxTc: deepseek_v3_topk_kernel) | sglang/kernels/ops/moe/moe_fused_gate.py "
            "moe_fused_gate -> _router_triton_kernel",
            sources=(),
            launcher="",
            flag_profile="sglang_jit",
            source_facts=SOURCE_FACTS,
            dtypes=("fp32", "bf16", "fp16"),
            requires_root="sglang_py",
            callable="sglang.srt.layers.moe.topk:biased_grouped_topk_gpu",
        ),
    ),
    default_variant=lambda roots: "installed",
    dtypes=("fp32", "bf16", "fp16"),
    # DeepSeek-V3's MoEGate hands the router fp32 logits on Hopper (dsv3_router_gemm / linear_bf16_fp32, out fp32);
    # bf16 logits would add SGLang's .to(float32) cast before flashinfer's kernel, a launch serving never runs
    serving_dtypes=("fp32",),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0, floor={"fp32": 1e-5, "fp16": 1e-5, "bf16": 1e-5, "int32": 0.0}),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "ties", "peaked"),
    replaces=("sglang.srt.layers.moe.topk:biased_grouped_topk_gpu",),
    # flashinfer's TensorRT-LLM kernel, the Triton router (shared with moe_router's softmax calls: attributed to
    # whichever op the registry lists first), astra's astra_moegr:: kernel
    kernel_symbols=(r"deepseek_v3_topk_kernel", r"astra_moegr::"),
    canonical=canonical,
    zero_dims=("n_shared",),   # 0: no fused shared column (EP, DeepEP, disabled fusion, Kimi-K2)
)
