"""The patch adapter: SGLang's biased_grouped_topk_gpu (sglang/srt/layers/moe/topk.py) onto this op's ABI.

Patched: `sglang.srt.layers.moe.topk:biased_grouped_topk_gpu`. select_experts calls it through the module global
`biased_grouped_topk` (bound to the same function at import): patch/install.py rebinds that alias too (SGLang's
REPLACE hook skips aliases in the defining module).

Routed (the kernel computes what SGLang would): gating_output 2-D contiguous fp32 / fp16 / bf16 with at most 1024
experts; correction_bias 1-D fp32 of the expert count (0.5.23's per-token 2-D bias is not); experts divisible by
num_expert_group <= 32, at most 32 experts a group (the kernel's segment; SGLang's flashinfer path has the same
limit); 1 <= topk_group <= num_expert_group; 1 <= topk - num_fused_shared_experts <= kept experts, topk <= 32;
renormalize true (0.5.17's flashinfer path renormalizes whatever the flag says, its Triton path does not: every
corpus model renormalizes); num_fused_shared_experts (DeepSeek-V3's default 1) only where SGLang runs flashinfer
and then pads the shared columns itself (spec.py), with a routed_scaling_factor (the shared weight divides by it);
routed_scaling_factor / apply_routed_scaling_factor_on_output become ABI scalars (the kernel scales only when
asked, as SGLang). For num_expert_group > 1, only where SGLang would run flashinfer's
fused_topk_deepseek: its Triton grouped router (SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK=1, flashinfer missing, or
a shape outside flashinfer's limits) scores a group with a tied maximum differently (spec.py), so those calls stay
SGLang's. Not routed either: aiter (ROCm), MUSA, XPU, CPU; one-group calls of 257-1023 tokens (below).
The shared column's weight: the routed sum / routed_scaling_factor (0.5.17), or, where SGLang defines
fused_shared_expert_weight (0.5.23), that function's constant, passed to the kernel as the ABI scalar shared_weight.
Below WARP_TOKENS tokens, calls without a fused shared column run the kernel's warp router (kernel.cu; RESULTS.md),
those with one its CTA kernel; from WARP_TOKENS on, every call runs one warp a token."""
from __future__ import annotations

import sys
from typing import Optional

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem, topk_output_alloc, topk_outputs_problem

MAX_EXPERTS = 1024
MAX_TOPK = 32
MAX_GROUPS = 32
MAX_GROUP_EXPERTS = 32
# From WARP_TOKENS tokens on the kernel runs one warp a token (kernel.cu's ASTRA_ROUTER_WARP_TOKENS, which must
# match): every prefill row (1k-16k tokens) then won in context, 1.04-2.99x, where the CTA kernels had lost 4 of 9
# (Kimi-K2 0.46-0.76x). Below, every decode row wins (<= 256 tokens, 1.05-4.20x). Between, at 512 tokens, Kimi-K2's
# one-group row lost with either kernel (0.87x / 0.98x; DeepSeek-V3's grouped rows won, 1.15-3.77x), so one-group
# calls of DECODE_TOKENS+1 .. WARP_TOKENS-1 tokens stay SGLang's (H200, 2026-12-01, results/2026-12-01-h200/session39/).
DECODE_TOKENS = 256
WARP_TOKENS = 1024


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def flashinfer_takes(e: int, k: int, g: int, tg: int) -> bool:
    """SGLang 0.5.17's condition for flashinfer's fused_topk_deepseek (shared experts 0), shape part."""
    if not (_pow2(e) and k <= 8 and tg <= g and tg * g >= k):
        return False
    epg = e // g
    return (epg <= 32 and epg * tg <= 128) if g > 1 else e <= 384


def _sglang_route(e: int, k: int, g: int, tg: int, shared: int = 0):
    """Why SGLang's biased_grouped_topk_gpu would not compute this op's contract here (None: it would, or SGLang
    is not loaded). k: the routed experts (topk - shared)."""
    mod = sys.modules.get("sglang.srt.layers.moe.topk")
    if mod is None:
        return None
    if getattr(mod, "_use_aiter", False):
        return "aiter: SGLang runs aiter's biased_grouped_topk"
    if not getattr(mod, "_is_cuda", True):
        return "not CUDA: SGLang runs another platform's router"
    if g <= 1 and not shared:
        return None  # flashinfer ungrouped or the Triton router: the same keys, order and ties
    flag = getattr(getattr(mod, "envs", None), "SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK", None)
    if flag is not None and g > 1:  # SGLang reads the flag for grouped calls only
        try:
            on = bool(flag.get())
        except Exception:  # an env parser error is SGLang's to raise
            return "SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK unreadable"
        if on:
            return "SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK=1: SGLang runs its Triton grouped router (other group ties)"
    triton = ("SGLang's Triton router appends the shared columns its own way" if shared
              else "SGLang runs its Triton grouped router (other group ties)")
    if getattr(mod, "fused_topk_deepseek", None) is None:
        return f"flashinfer's fused_topk_deepseek is missing: {triton}"
    if not flashinfer_takes(e, k, g, tg):
        return f"outside flashinfer's limits: {triton}"
    return None


def _shared_weight(shared: int, rsf, apply: int) -> float:
    """The ABI's shared_weight: SGLang's own fused_shared_expert_weight where it has one (0.5.23: a constant shared
    column), else -1 (0.5.17: the routed weights' sum / routed_scaling_factor, which the kernel computes)."""
    fn = getattr(sys.modules.get("sglang.srt.layers.moe.topk"), "fused_shared_expert_weight", None)
    if not shared or fn is None:
        return -1.0
    return float(fn(routed_scaling_factor=rsf, fused_in_topk=bool(apply)))


def _normalize(c):
    import torch

    x, b = c["scores"], c["bias"]
    if x.dim() != 2:
        return f"gating_output is {x.dim()}-d, not [tokens, experts]"
    t, e = x.shape
    if b is None or b.dim() != 1 or b.shape[0] != e:
        return f"correction_bias {None if b is None else tuple(b.shape)} is not [{e}]"
    if b.dtype is not torch.float32:
        return f"correction_bias is {b.dtype}, not float32"
    if e > MAX_EXPERTS:
        return f"{e} experts > {MAX_EXPERTS} (one warp's registers)"
    g = int(c["num_expert_group"] or 1)
    tg = int(c["topk_group"] or 1)
    k = int(c["topk"])
    shared = int(c.get("num_fused_shared_experts") or 0)
    if not 1 <= g <= MAX_GROUPS or e % g:
        return f"num_expert_group {g}: not 1..{MAX_GROUPS} dividing {e} experts"
    if g > 1 and e // g > MAX_GROUP_EXPERTS:
        return f"{e // g} experts a group > {MAX_GROUP_EXPERTS}"
    if not 1 <= tg <= g:
        return f"topk_group {tg} outside 1..{g}"
    if shared < 0 or k > MAX_TOPK or not 1 <= k - shared <= tg * (e // g):
        return (f"topk {k} with {shared} shared: not 1..min({MAX_TOPK}, kept experts {tg * (e // g)}) routed "
                f"columns")
    rsf = c["routed_scaling_factor"]
    if shared and (rsf is None or not float(rsf) > 0):
        return f"fused shared experts with routed_scaling_factor {rsf}: SGLang leaves their weight 0"
    if not c["renormalize"]:
        return "renormalize=False: SGLang 0.5.17's paths disagree on it (flashinfer renormalizes anyway)"
    bad = topk_outputs_problem(c, t, k)
    if bad:
        return bad
    w, i = c["topk_weights"], c["topk_ids"]
    bad = contiguity_problem(c, ("scores", "bias", "topk_weights", "topk_ids"))
    if bad:
        return bad
    why = _sglang_route(e, k - shared, g, tg, shared)
    if why:
        return why
    c["num_expert_group"], c["topk_group"], c["renormalize"] = g, tg, 1
    c["num_fused_shared_experts"] = shared
    c["routed_scaling_factor"] = 1.0 if rsf is None else float(rsf)
    c["apply_routed_scaling_factor_on_output"] = int(bool(c["apply_routed_scaling_factor_on_output"]))
    c["shared_weight"] = _shared_weight(shared, rsf, c["apply_routed_scaling_factor_on_output"])
    return {"scores": x, "bias": b, "topk_weights": w, "topk_ids": i}, (t, e, k, g, tg, shared)


def _kept(dims) -> Optional[str]:
    """Why SGLang keeps a call of these dims by design (None: astra takes it): where it routes past flashinfer's kernel
    (_sglang_route; _normalize hands those calls back at run time too), known from the dims, so bench marks such rows
    and validate reports them n/a rather than failed; and one-group calls between the decode and prefill bands, where
    neither kernel was faster (above). Calls without a fused shared column are astra's since the warp router passed
    check and validate on an H200 (2026-11-30, results/2026-11-30-h200/session26/): before, they stayed SGLang's, the
    CTA kernel having read 0.65-0.92x in context there."""
    t, e, k, g, tg, shared = (int(x) for x in dims[:6])
    if g == 1 and DECODE_TOKENS < t < WARP_TOKENS:
        return (f"{t} tokens, one group: between {DECODE_TOKENS} and {WARP_TOKENS} SGLang's router was as fast in "
                f"context (Kimi-K2 at 512 tokens)")
    return _sglang_route(e, k - shared, g, tg, shared)


# On by default since a DeepSeek-shaped step ran it (deepseek-v3-2l, H200, 2026-11-27): -0.46% / -0.81% at batch
# 1 / 8, tokens identical. (Its server rows then were withdrawn: both servers spun when idle; RESULTS.md.)

ADAPTER = OpAdapter(
    op="moe_grouped_router",
    data="scores",
    same_dtype=("scores",),
    fp32=("bias", "topk_weights"),
    rowwise=("scores", "topk_weights", "topk_ids"),
    aliases={"gating_output": "scores", "correction_bias": "bias"},
    ignorable=frozenset({"hidden_states"}),
    derived=("shared_weight",),
    alloc={"topk_weights": topk_output_alloc("float32"), "topk_ids": topk_output_alloc("int32")},
    normalize=_normalize,
    returns=lambda c: (c["topk_weights"], c["topk_ids"]),
    outputs_of=lambda r: {"topk_weights": r[0], "topk_ids": r[1]},
    bare_args={"hidden_states": lambda c: c["scores"]},
    keeps=_kept,
)
