"""The patch adapter: how SGLang's MoE combine callables map onto this op's kernel ABI (patch/adapters.py
holds the machinery and says what each field means):

  fused_moe.moe_sum_reduce_torch_compile(x, out, routed_scaling_factor)      0.5.17 / 0.5.23, <= 32 tokens
  sgl_kernel.moe_sum_reduce(input_tensor, output_tensor, routed_scaling_factor=0)   > 32 tokens; marlin MoE;
                                                                              0.5.23 paged experts
  fused_moe_triton_kernels.moe_sum_reduce_triton(input, output, routed_scaling_factor)
                                                                              0.5.23 <= 32 tokens on sm_90+

Not reached: Mixtral-style topk == 2 with scale 1 (fused_moe calls torch.add inline) and the JIT moe_topk_sum.
Not routed (the original serves the call): more than ROUTED_MAX_TOKENS tokens (max_tokens), non-contiguous
input or output, mismatched shapes, dtypes other than fp32/fp16/bf16."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem


def _combine_normalize(c):
    x, out = c["input"], c["output"]
    if x.dim() != 3:
        return f"input is {x.dim()}-d, not [tokens, topk, hidden]"
    t, k, h = x.shape
    if tuple(out.shape) != (t, h):
        return f"output shape {tuple(out.shape)} != {(t, h)}"
    if k == 0:
        return "topk is 0"
    bad = contiguity_problem(c, ("input", "output"))
    if bad:
        return bad
    s = c.get("routed_scaling_factor")
    c["routed_scaling_factor"] = 1.0 if s is None else float(s)
    return {"input": x, "output": out}, (t, k, h)


# Calls above this many tokens stay with SGLang (its sgl_kernel.moe_sum_reduce route): there the shipped
# kernel was 0.75x in context at 64x8x2048 (H200, 2026-11-23). At <= 32 tokens SGLang runs a torch.compile'd
# sum, and patching that route made the Qwen3-30B-A3B decode step faster at batch 1, 8 and 32 (H200,
# 2026-11-24 and 2026-11-26, RESULTS.md).
ROUTED_MAX_TOKENS = 32
_MANY_TOKENS = f"more than {ROUTED_MAX_TOKENS} tokens: SGLang's own route is faster in context"


def _precheck(args, kwargs):
    """A prefill-sized call (x [tokens, topk, hidden]), declined off the raw arguments before binding: every MoE
    layer's eager prefill passes here. None: binding and prepare decide."""
    x = args[0] if args else next((kwargs[n] for n in ("x", "input", "input_tensor") if n in kwargs), None)
    shape = getattr(x, "shape", None)
    return _MANY_TOKENS if shape is not None and len(shape) == 3 and shape[0] > ROUTED_MAX_TOKENS else None

# On in `--ops all` (for the routed calls above); DEFAULT_OFF = "reason" would take it out again.
DEFAULT_OFF = ""

ADAPTER = OpAdapter(
    op="moe_combine",
    data="input",
    same_dtype=("input", "output"),
    rowwise=("input", "output"),
    aliases={
        "x": "input",  # moe_sum_reduce_torch_compile(x, out, routed_scaling_factor)
        "out": "output",
        "input_tensor": "input",  # sgl_kernel.moe_sum_reduce(input_tensor, output_tensor, ...)
        "output_tensor": "output",
    },
    normalize=_combine_normalize,
    returns=lambda c: None,
    precheck=_precheck,
    max_tokens=ROUTED_MAX_TOKENS,
)
