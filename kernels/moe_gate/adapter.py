"""The patch adapter: SGLang's ReplicatedLinear.forward (sglang/srt/layers/linear.py) onto this op's ABI, for the MoE
gate's shape (patch/adapters.py holds the machinery and says what each field means).

Patched: `sglang.srt.layers.linear:ReplicatedLinear.forward` (0.5.17 and 0.5.23), the method every MoE block's
`self.gate(hidden_states)` runs. It is replaced for the whole class, so `expand` takes a call only where the layer is a
router gate SGLang would run as a plain cuBLAS GEMM:
- an unquantized weight (UnquantizedLinearMethod) of at most MAX_EXPERTS (512) rows and at most MAX_HIDDEN columns, no bias;
- x a CUDA tensor of the weight's dtype (fp16 / bf16), at most MAX_TOKENS rows;
- apply's other branches not taken: no Intel AMX packing, no aiter, no bf16 GEMM backend of SGLang's own (cutedsl,
  gemv in 0.5.23).
Every other ReplicatedLinear call (wide projections, quantized or biased layers, prefill) goes to the method untouched,
before any work. The output is allocated as F.linear would ([..., experts], x's dtype)."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.linear.adapter import apply_path_problem, normalize_linear, sequence_linear, token_precheck
from astra_sglang.kernels.moe_gate.spec import MAX_HIDDEN
from astra_sglang.patch.adapters import OpAdapter

MAX_EXPERTS = 512    # a router's width (Qwen3-Next: 512); wider linears (MLA's 576-wide kv_a_proj) are projections
# Decode sizes: the kernel's tensor-core path ends at 64 tokens (in context 1.25-2.9x cuBLAS there, H200, RESULTS.md).
MAX_TOKENS = 64
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)


def _expand(a: Dict[str, Any]):
    """ReplicatedLinear.forward(self, x) -> canonical arguments, or why the method keeps the call."""
    import torch

    layer, x = a["self"], a["x"]
    w = getattr(layer, "weight", None)
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.device.type not in DEVICES:
        return "x or the weight is not a CUDA tensor"
    if w.dim() != 2 or w.shape[0] > MAX_EXPERTS or w.shape[1] > MAX_HIDDEN:
        return f"weight {tuple(w.shape)} is not a router's [<= {MAX_EXPERTS}, <= {MAX_HIDDEN}]"
    if getattr(layer, "bias", None) is not None:
        return "the layer has a bias"
    if x.dtype != w.dtype or x.dtype not in (torch.float16, torch.bfloat16):
        return f"x {x.dtype} / weight {w.dtype}: not one fp16 / bf16 dtype"
    if x.shape[-1] != w.shape[1]:
        return f"x {tuple(x.shape)} does not match weight {tuple(w.shape)}"
    t = x.numel() // w.shape[1] if w.shape[1] else 0
    if t > MAX_TOKENS:
        return f"{t} tokens > {MAX_TOKENS}: SGLang's cuBLAS GEMM"
    why = apply_path_problem(layer, x)
    if why:
        return why
    return {"x": x, "weight": w, "out": torch.empty(x.shape[:-1] + (w.shape[0],), device=x.device, dtype=x.dtype)}


# On by default since 2026-11-26 (H200): Qwen3-30B-A3B-shaped decode step -3.26% / -1.88% / -0.92% at batch 1 / 8 / 32,
# greedy ids identical (kernels/moe_gate/RESULTS.md). DEFAULT_OFF = "reason" would take it out of `--ops all` again.
DEFAULT_OFF = ""

ADAPTER = OpAdapter(
    op="moe_gate",
    data="x",
    same_dtype=("x", "weight", "out"),
    rowwise=("x", "out"),
    normalize=normalize_linear,
    returns=lambda c: (c["out"], None),
    expand=_expand,
    sequence=sequence_linear,
    precheck=token_precheck(1, MAX_TOKENS),  # ReplicatedLinear.forward(self, x)
    max_tokens=MAX_TOKENS,
    # bench's installed baseline: F.linear returns a new tensor that `sequence` copies into the ABI's out; the copy
    # is the binding's, timed alone and taken out of SGLang's time
    returned=("out",),
)
