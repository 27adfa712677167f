"""The patch adapter: how SGLang's MoE combine callables map onto this op's kernel ABI (patch/adapters.py
holds the machinery and says what each field means):

  fused_moe.moe_sum_reduce_torch_compile(x, out, routed_scaling_factor)      0.5.17 / 0.5.23, <= 32 tokens
  sgl_kernel.moe_sum_reduce(input_tensor, output_tensor, routed_scaling_factor=0)   > 32 tokens; marlin MoE;
                                                                              0.5.23 paged experts
  fused_moe_triton_kernels.moe_sum_reduce_triton(input, output, routed_scaling_factor)
                                                                              0.5.23 <= 32 tokens on sm_90+

Not reached: Mixtral-style topk == 2 with scale 1 (fused_moe calls torch.add inline) and the JIT moe_topk_sum.
Not routed (the original serves the call): 33-128 or more than TAKE_MAX_TOKENS tokens (keeps), non-contiguous input
or output, mismatched shapes, dtypes other than fp32/fp16/bf16."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem

from .spec import COMPILE_MAX_TOKENS


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


# Which calls the kernel takes. At <= 32 tokens SGLang runs a torch.compile'd sum, and patching that route made the
# Qwen3-30B-A3B decode step faster at batch 1, 8 and 32 (H200, 2026-11-24 and 2026-11-26, RESULTS.md). Above 32 tokens
# fused_moe calls sgl_kernel.moe_sum_reduce. Against it, at its serving sites between astra's linears with 48 replays,
# every 256-token row was faster (1.09-2.25x, each 95% CI above 0), while at 64 tokens 64 x 9 x 7168 (0.918x) and
# 64 x 4 x 2880 (0.780x) were slower (H200, 2026-12-02, results/2026-12-02-h200/session41/P3). Prefill rows stream at
# its rate (1.012x chained, min 0.955x; session41/P). So calls of 129-256 tokens are the kernel's, 33-128 and more
# than 256 stay SGLang's.
TAKE_BAND = (129, 256)
TAKE_MAX_TOKENS = TAKE_BAND[1]
_MIDDLE = (f"within {COMPILE_MAX_TOKENS + 1}-{TAKE_BAND[0] - 1}: sgl_kernel's moe_sum_reduce was as fast or faster in "
           "context on 64-token rows")
_MANY_TOKENS = f"more than {TAKE_MAX_TOKENS} tokens: sgl_kernel's moe_sum_reduce streams as fast (prefill)"


def _kept(dims):
    """Why a call of dims (tokens, topk, hidden) stays SGLang's, or None when the kernel takes it."""
    t = int(dims[0])
    if t > TAKE_MAX_TOKENS:
        return _MANY_TOKENS
    if COMPILE_MAX_TOKENS < t < TAKE_BAND[0]:
        return f"{t} tokens {_MIDDLE}"
    return None


def _precheck(args, kwargs):
    """A prefill-sized call (x [tokens, topk, hidden]), declined off the raw arguments before binding: every MoE
    layer's eager prefill passes here. None: binding and prepare decide."""
    x = args[0] if args else next((kwargs[n] for n in ("x", "input", "input_tensor") if n in kwargs), None)
    shape = getattr(x, "shape", None)
    return _MANY_TOKENS if shape is not None and len(shape) == 3 and shape[0] > TAKE_MAX_TOKENS else None

# On in `--ops all` (for the calls taken above); DEFAULT_OFF = "reason" would take it out again.
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
    keeps=_kept,
)
