"""The patch adapter of a fused op: SGLang's GemmaMLP.forward (Gemma-1; 0.5.17 and 0.5.23: gate_up_proj ->
GeluAndMul("none") -> down_proj). gate_up_silu's adapter with Gemma-1's MLP and activation: its mlp_expand,
two_steps and mlp_adapter (kernels/gate_up_silu/adapter.py says what each checks) over
- the MLP GemmaMLP (or a subclass), whose forward(self, x) calls down_proj(x) without keywords;
- act_fn SGLang's GeluAndMul with approximate "none" running forward_cuda (its JIT gelu_and_mul), not the native path
  of torch.compile, a forced fused-op backend, or approximate "tanh" (gelu_tanh_and_mul's);
- the same gate_up_proj, dtype and shape rules (at most 2 tokens, H a multiple of 8 up to linear's limit, I a
  multiple of 8, an unquantized bias-free MergedColumnParallelLinear ending in F.linear, any TP; Gemma-7B's 24576 at
  2 tokens is wider than the widest intermediate measured to win there, so SGLang keeps it).
Every decline comes before any work; down_proj stays SGLang's call (its all-reduce)."""
from __future__ import annotations

from astra_sglang.kernels.gate_up_silu.adapter import mlp_adapter, mlp_expand

ACT = "gelu_and_mul"  # SGLang's activation kernel the epilogue replaces
MLPS = (("gemma", "sglang.srt.models.gemma", "GemmaMLP"),)

# On in `--ops all` since its decode-step A/B over every other default op (H200, 2026-12-01,
# results/2026-12-01-h200/session33/): Gemma-7B -0.45% at batch 1, +0.01% (n.s.; 24576 at 2 tokens stays SGLang's) at
# batch 2, greedy tokens identical. DEFAULT_OFF = "reason" would take it out of `--ops all` again.
DEFAULT_OFF = ""

ADAPTER = mlp_adapter("gate_up_gelu", mlp_expand(MLPS, "GeluAndMul", ACT, approximate="none"), ACT)
