"""The patch adapter: how SGLang's MoE combine callables map onto this op's kernel ABI (patch/adapters.py
holds the machinery and says what each field means):

  fused_moe.moe_sum_reduce_torch_compile(x, out, routed_scaling_factor)      0.5.17 / 0.5.23, <= 32 tokens
  sgl_kernel.moe_sum_reduce(input_tensor, output_tensor, routed_scaling_factor=0)   > 32 tokens; marlin MoE;
                                                                              0.5.23 paged experts
  fused_moe_triton_kernels.moe_sum_reduce_triton(input, output, routed_scaling_factor)
                                                                              0.5.23 <= 32 tokens on sm_90+

Not reached: Mixtral-style topk == 2 with scale 1 (fused_moe calls torch.add inline) and the JIT moe_topk_sum.
Not routed (the original serves the call): non-contiguous input or output, mismatched shapes, dtypes other
than fp32/fp16/bf16."""
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


# `--ops all` leaves this op out until its kernel is timed (name it to patch it anyway).
DEFAULT_OFF = ("0.75x in context at 64x8x2048 on the H200 (2026-11-23); the <= 32-token route SGLang "
               "decodes with (torch.compile) not yet measured")

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
)
