"""The patch adapter of a fused op: SGLang's Qwen3MoeSparseMoeBlock.forward_normal (srt/models/qwen3_moe.py, 0.5.17
and 0.5.23), gate -> topk -> experts (then 0.5.17's all-reduces at TP / EP > 1). The method is replaced: a call it
takes runs the block's own self.gate (SGLang's router GEMM, or astra's moe_gate under it), then this op's two kernels
on its logits in place of self.topk (SGLang's Triton router) and self.experts (FusedMoE -> fused_experts). patch/
adapters.py holds the machinery and says what each field means.

`expand` declines (the method runs as before) before any work, the gate included, unless:
- hidden_states is a 2-D CUDA tensor of exactly one token (checked first: every prefill call leaves at once);
- the block is EP 1 (expert parallel would need SGLang's global -> local id map) and its experts sharded by the
  block's MoE TP (each rank's call is the same computation on its shard of every expert's columns);
- self.topk is SGLang's TopK computing the plain softmax top-k with renormalize (moe_route_align's route rules: not
  grouped, biased, custom, torch-native or sigmoid; no EPLB remap, padded-row mask or shared-expert append), its
  output format STANDARD (the runner backend auto or triton), the routed-experts capture and the expert-distribution
  recorder off (select_experts would feed them the ids, which this op never writes);
- self.experts is SGLang's FusedMoE itself at the block's TP and EP 1 with the unquantized method on the Triton
  runner (no aiter runner), the standard dispatcher without its FP4 all-gather, no DWDP prefetch, not inside a
  piecewise CUDA graph, and moe_experts' rules on its runner config, SGLang's runtime switches and the weights (dtype,
  shapes, no biases);
- neither module has hooks (a dumper's hook would miss the call this op skips);
- E <= 128, K <= min(16, E) and K x ceil(I / 256) <= 64 (the kernels route a row in one warp and take moe_experts'
  chunked down kernel).

The result comes back in a new tensor, [tokens, hidden] as forward_normal returns it. At TP > 1 a rank's kernels
compute its partial sum, and the sum across ranks stays SGLang's, where each version puts it: 0.5.17's forward_normal
ends with moe_tensor_model_parallel_all_reduce (unless should_skip_post_experts_all_reduce says a later component
fuses it), which `returns` runs on the op's output as the method would; 0.5.23's block returns the partial sum and its
layer boundary reduces it (the block's module then imports neither name: a CPU test holds both versions to this)."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from astra_sglang.kernels.linear.adapter import token_precheck
from astra_sglang.kernels.moe_experts import adapter as experts_adapter
from astra_sglang.kernels.moe_route_align.adapter import _route_problem, _select_experts_backend
from astra_sglang.patch.adapters import OpAdapter, contiguity_problem, loaded_class, module_call_hooked

# 2-token calls keep SGLang's router and fused_experts: kernel 1 routes every token of its window in every warp
# (+13.8 us a layer at 2 tokens as a dev variant of moe_experts, H200, results/2026-12-01-h200/session33/ §3)
MAX_TOKENS = 1
MAX_EXPERTS = 128  # a row of logits in one warp, 4 a lane
MAX_TOPK = 16  # moe_experts' chunked down kernel (the only one this op's kernel 2 has)
TOKEN_CHUNKS = 64  # that kernel's chunks a token: K x ceil(I / 256)
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)
_MOE = "sglang.srt.models.qwen3_moe"
_TOPK = "sglang.srt.layers.moe.topk"
_FUSED = "sglang.srt.layers.moe.fused_moe_triton.layer"
_UNQUANT = "sglang.srt.layers.quantization.unquant"
_STANDARD = "sglang.srt.layers.moe.token_dispatcher.standard"


def declined(tokens: int, hidden: int, inter: int, experts: int = 1, topk: int = 1) -> Optional[str]:
    """Why a call of these dims stays with SGLang by design, or None: the rule expand and validate (n/a) share."""
    if tokens > MAX_TOKENS:
        return f"{tokens} tokens > {MAX_TOKENS}: SGLang's router and fused_experts"
    if experts > MAX_EXPERTS or topk > min(MAX_TOPK, experts):
        return f"top {topk} of {experts} experts: past one warp's row (E <= {MAX_EXPERTS}, K <= {MAX_TOPK})"
    if topk * -(-inter // 256) > TOKEN_CHUNKS:
        return f"top {topk} of {inter}-column experts: past the down kernel's {TOKEN_CHUNKS} chunks a token"
    return experts_adapter.declined(tokens, hidden, inter, experts, topk)


def _all_reduce_tail(tp: int):
    """The sum across TP ranks forward_normal itself runs after the experts (0.5.17's tail), None where it runs none
    (TP 1, a later component fusing it, 0.5.23's block), or why the adapter cannot tell."""
    if tp == 1:
        return None
    mod = sys.modules.get(_MOE)
    reduce = getattr(mod, "moe_tensor_model_parallel_all_reduce", None)
    skip = getattr(mod, "should_skip_post_experts_all_reduce", None)
    if reduce is None and skip is None:  # 0.5.23: the layer boundary sums the block's output
        return None
    if reduce is None or skip is None:
        return "the block's module has half of 0.5.17's all-reduce tail: not a version this adapter knows"
    return None if skip(is_tp_path=True) else reduce


def _returns(c):
    """forward_normal's result: the op's output, summed across TP ranks where the method's tail would sum it."""
    reduce = c.get("all_reduce")
    return c["out"] if reduce is None else reduce(c["out"])


def _topk_problem(topk) -> Optional[str]:
    """None where self.topk(x, logits) is select_experts' plain renormalized softmax top-k into a STANDARD output
    with nothing fed the ids on the way, else why not."""
    mod = sys.modules.get(_TOPK)
    if mod is None or type(topk) is not getattr(mod, "TopK", None):
        return f"topk is {type(topk).__name__}, not SGLang's TopK"
    cfg = getattr(topk, "topk_config", None)
    if cfg is None:
        return "TopK has no topk_config"
    # 0.5.17 leaves it None (TopK picks it per call from the global runner backend); 0.5.23's bind_runner_backend
    # always sets it (STANDARD for the Triton runner) and TopK.forward_cuda refuses to run without one
    fmt = getattr(cfg, "output_format", None)
    if fmt is not None and getattr(fmt, "name", fmt) != "STANDARD":
        return f"TopK's output format is forced ({getattr(fmt, 'name', fmt)})"
    why = _route_problem(mod, cfg, None, None)
    if why:
        return why
    if not cfg.renormalize:
        return "renormalize off (norm_topk_prob false): the kernels renormalize"
    backend = _select_experts_backend(mod, cfg)  # the layer's own in 0.5.23, the global one in 0.5.17
    if backend is not None and not (backend.is_auto() or backend.is_triton()):
        return f"MoE runner backend {backend}: TopK's output is not the Triton runner's"
    if getattr(cfg, "allow_routed_experts_capture", False) and mod.get_global_experts_capturer() is not None:
        return "SGLang's routed-experts capture is on"
    if type(mod.get_global_expert_distribution_recorder()).__name__ != "_ExpertDistributionRecorderNoop":
        return "SGLang's expert-distribution recorder is on"
    return None


def _experts_problem(experts, tp: int) -> Optional[str]:
    """None where self.experts(x, topk_output) is FusedMoE's local fused_experts on this rank's TP shard (EP 1),
    else why not."""
    fm = sys.modules.get(_FUSED)
    if fm is None or type(experts) is not getattr(fm, "FusedMoE", None):
        return f"experts is {type(experts).__name__}, not SGLang's FusedMoE"
    if getattr(experts, "moe_ep_size", 1) != 1:
        return "the experts are sharded by expert (MoE EP > 1)"
    if getattr(experts, "moe_tp_size", 1) != tp:
        return f"the experts' MoE TP {getattr(experts, 'moe_tp_size', 1)} is not the block's {tp}"
    if getattr(experts, "_use_ascend_fuseep", False) or getattr(experts, "_dwdp_bound", False):
        return "an Ascend fused EP or DWDP-prefetched layer"
    in_piecewise = getattr(fm, "is_in_tc_piecewise_cuda_graph", None)
    if in_piecewise is not None and in_piecewise():
        return "inside a piecewise CUDA graph"
    qm = getattr(experts, "quant_method", None)
    if qm is None or type(qm) is not loaded_class(_UNQUANT, "UnquantizedFusedMoEMethod"):
        return f"quant method {type(qm).__name__}: not the unquantized MoE"
    runner = getattr(qm, "runner", None)
    if runner is None or not runner.runner_backend.is_triton() or getattr(qm, "_aiter_runner", None) is not None:
        return "the unquantized MoE does not run the Triton runner"
    if getattr(qm, "w13_swiglu_interleaved", False):  # 0.5.23, SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED: rows reordered
        return "w13's gate and up rows are interleaved (SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED), not [gate; up]"
    if type(getattr(experts, "dispatcher", None)) is not loaded_class(_STANDARD, "StandardDispatcher"):
        return f"dispatcher {type(getattr(experts, 'dispatcher', None)).__name__}: not the standard one"
    fp4 = getattr(sys.modules.get(_STANDARD), "should_use_flashinfer_cutlass_moe_fp4_allgather", None)
    if fp4 is not None and fp4():
        return "the standard dispatcher all-gathers (FlashInfer cutlass FP4)"
    for n in ("w13_weight_bias", "w2_weight_bias"):
        if getattr(experts, n, None) is not None:
            return f"the experts have {n}"
    return experts_adapter._config_problem(getattr(experts, "moe_runner_config", None)) \
        or experts_adapter._runtime_problem()


def expand(a: Dict[str, Any]):
    """forward_normal(self, hidden_states) -> canonical arguments (the gate run on them), or why SGLang keeps the
    call. Every reason to decline comes before any work."""
    import torch

    block, x = a["self"], a["hidden_states"]
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.device.type not in DEVICES:
        return "hidden_states is not a 2-D CUDA tensor"
    t = x.shape[0]
    if t > MAX_TOKENS:  # first: every prefill call passes here
        return f"{t} tokens > {MAX_TOKENS}: SGLang's router and fused_experts"
    if t == 0:
        return "no tokens"
    cls = loaded_class(_MOE, "Qwen3MoeSparseMoeBlock")
    if cls is None or not isinstance(block, cls):
        return f"{type(block).__name__} is not SGLang's Qwen3MoeSparseMoeBlock"
    if getattr(block, "ep_size", 1) != 1:
        return "EP > 1: the experts' ids would need SGLang's global -> local map"
    tp = getattr(block, "tp_size", 1)
    topk, experts, gate = getattr(block, "topk", None), getattr(block, "experts", None), getattr(block, "gate", None)
    why = _topk_problem(topk) or _experts_problem(experts, tp)
    if why:
        return why
    tail = _all_reduce_tail(tp)
    if isinstance(tail, str):
        return tail
    if not callable(gate):
        return "the block has no gate to call"
    if module_call_hooked(topk) or module_call_hooked(experts):
        return "topk or experts has hooks (the op would skip their calls)"
    w1, w2 = getattr(experts, "w13_weight", None), getattr(experts, "w2_weight", None)
    if not all(isinstance(v, torch.Tensor) for v in (w1, w2)) or w1.dim() != 3 or w2.dim() != 3:
        return "the experts' weights are not [E, 2I, H] / [E, H, I] tensors"
    e, inter, h = w1.shape[0], w1.shape[1] // 2, x.shape[1]
    if w1.shape[2] != h or w1.shape[1] % 2 or tuple(w2.shape) != (e, h, inter):
        return f"w13 {tuple(w1.shape)} / w2 {tuple(w2.shape)} do not fit hidden {h}"
    if x.dtype not in (torch.float16, torch.bfloat16) or w1.dtype != x.dtype or w2.dtype != x.dtype:
        return f"x {x.dtype} / w13 {w1.dtype} / w2 {w2.dtype}: not one fp16 / bf16 dtype"
    k = int(topk.topk_config.top_k)
    why = declined(t, h, inter, e, k)
    if why:
        return why
    logits, _ = gate(x)  # the block's own router GEMM, as forward_normal calls it
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (t, e) or logits.dtype != x.dtype:
        return f"router logits {getattr(logits, 'shape', None)} / {getattr(logits, 'dtype', None)}: not [{t}, {e}] " \
               f"of {x.dtype}"
    s = getattr(experts.moe_runner_config, "routed_scaling_factor", None)
    return {"x": x, "router_logits": logits, "w13": w1, "w2": w2,
            "act": torch.empty((t, k, inter), device=x.device, dtype=x.dtype),
            "out": torch.empty_like(x),
            "routed_scaling_factor": 1.0 if s is None else float(s),
            # SGLang's own choice, for `sequence` (moe_experts' rule)
            "filter_expert": experts_adapter.filters_experts(experts.moe_runner_config),
            "all_reduce": tail}


def _normalize(c):
    """x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I], act [T, K, I], out [T, H] -> the ABI's tensors
    and (T, H, I, E, K)."""
    x, lg, w13, w2, act, out = (c[n] for n in ("x", "router_logits", "w13", "w2", "act", "out"))
    if x.dim() != 2 or lg.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or act.dim() != 3:
        return "not [T, H] / [T, E] / [E, 2I, H] / [E, H, I] / [T, K, I]"
    t, h = x.shape
    e, inter, k = w13.shape[0], w13.shape[1] // 2, act.shape[1]
    if tuple(w13.shape) != (e, 2 * inter, h) or tuple(w2.shape) != (e, h, inter):
        return f"w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} do not fit x {tuple(x.shape)}"
    if tuple(lg.shape) != (t, e) or tuple(act.shape) != (t, k, inter) or tuple(out.shape) != (t, h):
        return "router_logits / act / out do not fit x"
    bad = contiguity_problem(c, ("x", "router_logits", "w13", "w2", "act", "out"))
    if bad:
        return bad
    if out.data_ptr() == x.data_ptr():
        return "out is x (the kernel writes a new tensor)"
    return {n: c[n] for n in ("x", "router_logits", "w13", "w2", "act", "out")}, (t, h, inter, e, k)


def sequence(c: Dict[str, Any]) -> None:
    """SGLang's two calls on canonical tensors: fused_topk on the logits (its Triton router, renormalized), then
    moe_experts' installed sequence (fused_experts_impl in place on `out`) with those weights and ids."""
    from astra_sglang.kernels.moe_route_align.adapter import _original

    x, lg = c["x"], c["router_logits"]
    fused_topk = _original(_TOPK, "fused_topk")
    w, ids = fused_topk(hidden_states=x, gating_output=lg, topk=int(c["act"].shape[1]), renormalize=True)
    experts_adapter.sequence({**c, "topk_weights": w, "topk_ids": ids})


# On in `--ops all` since its decode-step A/B over every other default op (moe_router + moe_experts in arm A):
# Qwen3-30B-A3B (20 layers) -1.51% [-1.59, -1.44] at batch 1, -0.13% (n.s.) at 2 (not taken), H200, 2026-12-01
# (results/2026-12-01-h200/session34/ §C); check and validate pass. DEFAULT_OFF = "reason" would take it out again.
DEFAULT_OFF = ""

ADAPTER = OpAdapter(
    op="moe_topk_experts",
    data="x",
    same_dtype=("x", "router_logits", "w13", "w2", "act", "out"),
    rowwise=("x", "router_logits", "act", "out"),
    normalize=_normalize,
    returns=_returns,
    expand=expand,
    sequence=sequence,
    # a prefill-sized call leaves off the raw arguments, before binding: forward_normal(self, hidden_states)
    precheck=token_precheck(1, MAX_TOKENS, keyword="hidden_states", kept_by="SGLang's router and fused_experts"),
    max_tokens=MAX_TOKENS,
    keeps=lambda dims: declined(*dims),
    returned=("out",),
    # the layer's whole expert stacks: the self-check must not copy them
    read_only=("w13", "w2"),
)
