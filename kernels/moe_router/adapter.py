"""The patch adapter: SGLang's fused_topk (sglang/srt/layers/moe/topk.py) onto this op's ABI.

Patched: `sglang.srt.layers.moe.topk:fused_topk` (0.5.17 and 0.5.23; select_experts calls it through the module
global, sglang/srt/layers/mova.py imports it by name in 0.5.23: discovery finds both). Why fused_topk and not the
Triton wrapper moe_fused_gate: fused_topk is where 0.5.17 makes `zero_bias = torch.zeros(E, float32)` on every
call (a FillFunctor kernel, 0.97 µs per layer at batch 1 on the H200) before calling the router; replacing
fused_topk drops the fill and the router together (the kernel needs no bias: softmax scoring adds a zero one). It is
also the level whose contract is the op's: scoring_func="softmax" is its default, whereas moe_fused_gate defaults to
sigmoid and is shared by the biased sigmoid / grouped routers.

Routed (softmax, the Triton router is what SGLang would run): scoring_func "softmax", packed_out None, scores 2-D
contiguous fp32/fp16/bf16 with at most 1024 experts, 1 <= topk <= min(32, experts). On the softmax path SGLang
ignores correction_bias, routed_scaling_factor, apply_routed_scaling_factor_on_output and num_fused_shared_experts
(its Triton call passes none of them), so they are `ignorable`; hidden_states is only read for its row count.
Not routed (SGLang's original serves the call): scoring_func "sigmoid" (the biased router), packed_out (the LoRA
topk+pack kernel), aiter (ROCm), 0.5.17 with SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK=0 (sgl_kernel's topk_softmax then,
another kernel), more than 1024 experts or topk > 32."""
from __future__ import annotations

import sys

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem, topk_output_alloc, topk_outputs_problem

MAX_EXPERTS = 1024
MAX_TOPK = 32


def _sglang_route():
    """Why SGLang's fused_topk would not run the Triton router here (None: it would, or SGLang is not loaded)."""
    mod = sys.modules.get("sglang.srt.layers.moe.topk")
    if mod is None:
        return None
    if getattr(mod, "_use_aiter", False):
        return "aiter: SGLang runs aiter's fused_topk"
    if not getattr(mod, "_is_cuda", True):
        return "not CUDA: SGLang runs topk_softmax"
    # 0.5.17 gates the Triton router on this flag (default on); 0.5.23 has no such flag (always the router)
    flag = getattr(getattr(mod, "envs", None), "SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK", None)
    if flag is not None:
        try:
            on = bool(flag.get())
        except Exception:  # an env parser error is SGLang's to raise
            return "SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK unreadable"
        if not on:
            return "SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK=0: SGLang runs sgl_kernel's topk_softmax"
    return None


def _router_normalize(c):
    x = c["scores"]
    if x.dim() != 2:
        return f"gating_output is {x.dim()}-d, not [tokens, experts]"
    t, e = x.shape
    k = int(c["topk"])
    if not 1 <= k <= min(MAX_TOPK, e):
        return f"topk {k} outside 1..min({MAX_TOPK}, experts {e})"
    if e > MAX_EXPERTS:
        return f"{e} experts > {MAX_EXPERTS} (one warp's registers)"
    bad = topk_outputs_problem(c, t, k)
    if bad:
        return bad
    w, i = c["topk_weights"], c["topk_ids"]
    bad = contiguity_problem(c, ("scores", "topk_weights", "topk_ids"))
    if bad:
        return bad
    why = _sglang_route()
    if why:
        return why
    c["renormalize"] = int(bool(c["renormalize"]))
    return {"scores": x, "topk_weights": w, "topk_ids": i}, (t, e, k)


# On by default since 2026-11-24 (H200): 2.78x SGLang's installed fused_topk in context on Qwen3-30B-A3B's
# decode rows, 2.67 -> 2.17 us per call in SGLang's decode graph, self-check never failed, greedy ids equal
# (results/2026-11-24-h200/). DEFAULT_OFF = "reason" would take it out of `--ops all` again.
DEFAULT_OFF = ""

ADAPTER = OpAdapter(
    op="moe_router",
    data="scores",
    same_dtype=("scores",),
    fp32=("topk_weights",),
    rowwise=("scores", "topk_weights", "topk_ids"),
    aliases={"gating_output": "scores"},
    ignorable=frozenset({"hidden_states", "correction_bias", "routed_scaling_factor",
                         "apply_routed_scaling_factor_on_output", "num_fused_shared_experts"}),
    alloc={"topk_weights": topk_output_alloc("float32"), "topk_ids": topk_output_alloc("int32")},
    normalize=_router_normalize,
    returns=lambda c: (c["topk_weights"], c["topk_ids"]),
    outputs_of=lambda r: {"topk_weights": r[0], "topk_ids": r[1]},
    bare_args={"hidden_states": lambda c: c["scores"]},
)
