"""The patch adapter of a fused op: SGLang's fused_experts (srt/layers/moe/moe_runner/triton_utils/fused_moe.py,
0.5.17), what MoeRunner's Triton path (fused_experts_none_to_triton) calls for every unquantized MoE layer. The
function is replaced: a call it takes runs this op's two kernels instead of fused_experts_impl's alignment, two Triton
expert GEMMs, activation and combine. patch/adapters.py holds the machinery and says what each field means.

`expand` declines (fused_experts runs as before) before any work unless:
- hidden_states is a 2-D CUDA tensor of at most MAX_TOKENS rows (checked first: every prefill call leaves at once),
  one row where the experts are wider than MAX_INTER_MULTI columns;
- the call is unquantized (no fp8 / int8 / int4 flag, scale, zero point, block shape or pre-quantized input), without
  expert biases, and the runner config is the plain silu-gated MoE: activation silu, gated, the router weights
  applied after the down GEMM, combined (no_combine off), no gemm1 alpha / clamp limit (gpt-oss's swiglu), no swiglu
  limit (DeepSeek-V4);
- SGLang's fused sum + all-reduce switch and batch-invariant mode are off (both change the combine);
- x, w1 [E, 2I, H] and w2 [E, H, I] share one fp16 / bf16 dtype and are contiguous, topk_weights [T, K] is fp32,
  topk_ids [T, K] int32, and the shape rule holds (`declined`: H and I multiples of 8).

In place or not, the result comes back in a new tensor: fused_experts' callers take its return value
(fused_experts_none_to_triton wraps it in the combine input; in place, SGLang returns hidden_states, which nothing
reads afterwards), and a kernel that overwrote hidden_states could not be re-run by the self-check. Tensor parallel
and expert parallel are taken: each rank's call is the same local computation on its shard (ids of experts another
rank holds are -1 and contribute nothing), and the all-reduce comes after, in the layer."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from astra_sglang.kernels.linear.adapter import token_precheck
from astra_sglang.patch.adapters import OpAdapter, contiguity_problem

# Calls with more tokens keep SGLang's fused_experts. Since the kernel reads an expert two tokens share once, the
# Qwen3-30B-A3B decode step at batch 2 is -0.60% (at 1: -9.86%; H200, 2026-11-30, results/2026-11-30-h200/session30/);
# at 4 tokens it is 0.96x of fused_experts chained (0.81x where the tokens share their experts: SGLang's tensor-core
# GEMMs take 4 tokens for the price of one)
MAX_TOKENS = 2
# and 2-token calls of wider experts: Mixtral tp4's (3584 columns, top-2) ran 0.90x of fused_experts chained at 2
# tokens, where every measured shape of at most 1024 columns ran 1.02-1.25x (same record)
MAX_INTER_MULTI = 1024
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)
_QUANT_FLAGS = ("use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "per_channel_quant")
_NONE_ARGS = ("b1", "b2", "w1_scale", "w2_scale", "w1_zp", "w2_zp", "a1_scale", "a2_scale", "block_shape", "a1_q")
_FM = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"


def declined(tokens: int, hidden: int, inter: int, experts: int = 1, topk: int = 1) -> Optional[str]:
    """Why a call of these dims stays with SGLang by design, or None: the rule expand and validate (n/a) share."""
    if tokens > MAX_TOKENS:
        return f"{tokens} tokens > {MAX_TOKENS}: SGLang's fused_experts"
    if tokens > 1 and inter > MAX_INTER_MULTI:
        return f"{tokens} tokens of {inter}-column experts (> {MAX_INTER_MULTI} from 2 tokens): SGLang's fused_experts"
    if hidden % 8 or inter % 8:
        return f"hidden {hidden} / intermediate {inter} not multiples of 8 (the kernel's 16-byte vectors)"
    return None


def _config_problem(cfg) -> Optional[str]:
    """None where the runner config is the plain silu-gated, combined MoE this op computes, else why not."""
    act = getattr(cfg, "activation", "silu")
    if act != "silu" or not getattr(cfg, "is_gated", True):
        return f"activation {act!r}{'' if getattr(cfg, 'is_gated', True) else ' (not gated)'}: not silu-and-mul"
    if getattr(cfg, "apply_router_weight_on_input", False):
        return "router weights applied on the input"
    if getattr(cfg, "no_combine", False):
        return "no_combine: the caller takes the per-expert outputs"
    for n in ("gemm1_alpha", "gemm1_clamp_limit", "swiglu_limit"):
        if getattr(cfg, n, None) is not None:
            return f"{n} is set (a clamped / alpha swiglu)"
    return None


def _runtime_problem() -> Optional[str]:
    """SGLang's runtime switches that change fused_experts' combine: the fused sum + all-reduce, batch invariance."""
    fm = sys.modules.get(_FM)
    get_exec = getattr(fm, "get_exec", None)
    if get_exec is not None:
        try:
            if get_exec().moe.enable_fused_moe_sum_all_reduce:
                return "SGLang's fused MoE sum + all-reduce is on"
        except (ValueError, AttributeError):  # no runtime config (outside a server): the default, off
            pass
    invariant = getattr(fm, "is_batch_invariant_mode_enabled", None)
    if invariant is not None and invariant():
        return "batch-invariant mode"
    return None


def filters_experts(cfg) -> bool:
    """Whether fused_experts runs its filtered kernels for this runner config (as SGLang decides it)."""
    return getattr(cfg, "num_experts", None) is None \
        or getattr(cfg, "num_experts", None) != getattr(cfg, "num_local_experts", None)


def expand(a: Dict[str, Any]):
    """fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config, ...) -> canonical arguments, or why
    SGLang keeps the call. Every reason to decline comes before any work."""
    import torch

    x = a.get("hidden_states")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.device.type not in DEVICES:
        return "hidden_states is not a 2-D CUDA tensor"
    t = x.shape[0]
    if t > MAX_TOKENS:  # first: every prefill call passes here
        return f"{t} tokens > {MAX_TOKENS}: SGLang's fused_experts"
    if t == 0:
        return "no tokens"
    for n in _QUANT_FLAGS:
        if a.get(n):
            return f"{n}: a quantized MoE"
    for n in _NONE_ARGS:
        if a.get(n) is not None:
            return f"{n} is given (quantized, biased or pre-quantized experts)"
    if a.get("fuse_swiglu_interleaved"):  # 0.5.23, SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED: w1's gate/up rows alternate
        return "fuse_swiglu_interleaved: w1's gate and up rows interleaved, not [gate; up]"
    cfg = a.get("moe_runner_config")
    why = _config_problem(cfg) or _runtime_problem()
    if why:
        return why
    try:
        wts, ids = a["topk_output"][0], a["topk_output"][1]
    except (TypeError, IndexError, KeyError):
        return "topk_output is not (weights, ids, ...)"
    w1, w2 = a.get("w1"), a.get("w2")
    if not all(isinstance(v, torch.Tensor) for v in (w1, w2, wts, ids)):
        return "weights or routing are not tensors"
    if w1.dim() != 3 or w2.dim() != 3 or w1.shape[2] != x.shape[1] or w1.shape[1] % 2:
        return f"w1 {tuple(w1.shape)} is not [E, 2I, {x.shape[1]}]"
    e, inter, h = w1.shape[0], w1.shape[1] // 2, x.shape[1]
    if tuple(w2.shape) != (e, h, inter):
        return f"w2 {tuple(w2.shape)} is not {(e, h, inter)}"
    if x.dtype not in (torch.float16, torch.bfloat16) or w1.dtype != x.dtype or w2.dtype != x.dtype:
        return f"x {x.dtype} / w1 {w1.dtype} / w2 {w2.dtype}: not one fp16 / bf16 dtype"
    if ids.dim() != 2 or ids.shape[0] != t or tuple(wts.shape) != tuple(ids.shape):
        return f"topk weights {tuple(wts.shape)} / ids {tuple(ids.shape)} are not [{t}, K]"
    if ids.dtype != torch.int32 or wts.dtype != torch.float32:
        return f"topk ids {ids.dtype} / weights {wts.dtype}: not int32 / fp32"
    why = declined(t, h, inter, e, ids.shape[1])
    if why:
        return why
    s = getattr(cfg, "routed_scaling_factor", None)
    return {"x": x, "w13": w1, "w2": w2, "topk_weights": wts, "topk_ids": ids,
            "act": torch.empty((t, ids.shape[1], inter), device=x.device, dtype=x.dtype),
            "out": torch.empty_like(x),
            "routed_scaling_factor": 1.0 if s is None else float(s),
            # SGLang's own choice, for `sequence` (its filtered kernels skip ids of experts another rank holds)
            "filter_expert": filters_experts(cfg)}


def _normalize(c):
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk [T, K], act [T, K, I], out [T, H] -> the ABI's tensors and
    (T, H, I, E, K)."""
    x, w13, w2, ids, act, out = (c[n] for n in ("x", "w13", "w2", "topk_ids", "act", "out"))
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or ids.dim() != 2:
        return "not [T, H] / [E, 2I, H] / [E, H, I] / [T, K]"
    t, h = x.shape
    e, inter, k = w13.shape[0], w13.shape[1] // 2, ids.shape[1]
    if tuple(w13.shape) != (e, 2 * inter, h) or tuple(w2.shape) != (e, h, inter):
        return f"w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} do not fit x {tuple(x.shape)}"
    if ids.shape[0] != t or tuple(c["topk_weights"].shape) != (t, k) or tuple(act.shape) != (t, k, inter) \
            or tuple(out.shape) != (t, h):
        return "topk weights / ids / act / out do not fit x"
    bad = contiguity_problem(c, ("x", "w13", "w2", "topk_weights", "topk_ids", "act", "out"))
    if bad:
        return bad
    if out.data_ptr() == x.data_ptr():
        return "out is x (the kernel writes a new tensor)"
    return {n: c[n] for n in ("x", "w13", "w2", "topk_weights", "topk_ids", "act", "out")}, (t, h, inter, e, k)


def sequence(c: Dict[str, Any]) -> None:
    """SGLang's fused_experts body on canonical tensors: fused_experts_impl in place on `out` holding a copy of x
    (in place needs no tensor-parallel group for its output, so the harness can run it outside a server)."""
    import importlib

    from astra_sglang.patch.layers import moe_server_defaults

    fm = importlib.import_module(_FM)
    impl = getattr(fm.fused_experts_impl, "__astra_original__", fm.fused_experts_impl)
    out = c["out"]
    if out.data_ptr() != c["x"].data_ptr():
        out.copy_(c["x"])
    with moe_server_defaults():
        impl(hidden_states=out, w1=c["w13"], w2=c["w2"], topk_weights=c["topk_weights"], topk_ids=c["topk_ids"],
             inplace=True, activation="silu", is_gated=True,
             routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
             # outside a server (the harness): the filtered kernels, which the spec's `ep` ids need
             filter_expert=bool(c.get("filter_expert", True)))


# On in `--ops all` since its decode-step A/B over every other default op: Qwen3-30B-A3B (20 layers) -6.55% [-7.47,
# -5.61] at batch 1, H200, 2026-11-30 (results/2026-11-30-h200/session29/); now -9.86% at batch 1 and -0.60% at 2
# (session30/); check and validate pass. DEFAULT_OFF = "reason" would take it out of `--ops all` again.
DEFAULT_OFF = ""

ADAPTER = OpAdapter(
    op="moe_experts",
    data="x",
    same_dtype=("x", "w13", "w2", "act", "out"),
    fp32=("topk_weights",),
    rowwise=("x", "topk_weights", "topk_ids", "act", "out"),
    normalize=_normalize,
    returns=lambda c: c["out"],
    expand=expand,
    sequence=sequence,
    # a prefill-sized call leaves off the raw arguments, before binding
    precheck=token_precheck(0, MAX_TOKENS, keyword="hidden_states", kept_by="SGLang's fused_experts"),
    max_tokens=MAX_TOKENS,
    keeps=lambda dims: declined(*dims),
    # the installed sequence copies x into out first (it runs in place there): bench times that copy alone
    returned=("out",),
    # the layer's whole expert stacks (1.2 GB a layer in Qwen3-30B-A3B): the self-check must not copy them
    read_only=("w13", "w2"),
)
