"""The patch adapter of a fused op: SGLang's Gemma2MLP.forward and Gemma3MLP.forward (0.5.17 and 0.5.23: the same
body, gate_up_proj -> GeluAndMul() -> down_proj). gate_up_silu's adapter with Gemma's MLPs and activation: its
mlp_expand, two_steps and mlp_adapter (kernels/gate_up_silu/adapter.py says what each checks) over
- the MLPs Gemma2MLP and Gemma3MLP (or a subclass), whose forward(self, x) calls down_proj(x) without keywords;
- act_fn SGLang's GeluAndMul with approximate "tanh" running forward_cuda (its JIT gelu_tanh_and_mul), not the native
  path of torch.compile, a forced fused-op backend, or approximate "none" (gelu_and_mul's);
- the same gate_up_proj, dtype and shape rules (at most 2 tokens, H a multiple of 8 up to linear's limit, I a
  multiple of 8, an unquantized bias-free MergedColumnParallelLinear ending in F.linear, any TP).
Every decline comes before any work; down_proj stays SGLang's call (its all-reduce, or none where 0.5.23's
Gemma3MLP is built with reduce_results=False)."""
from __future__ import annotations

from astra_sglang.kernels.gate_up_silu.adapter import mlp_adapter, mlp_expand

ACT = "gelu_tanh_and_mul"  # SGLang's activation kernel the epilogue replaces
MLPS = (("gemma2", "sglang.srt.models.gemma2", "Gemma2MLP"), ("gemma3", "sglang.srt.models.gemma3_causal", "Gemma3MLP"))

# On in `--ops all` since its decode-step A/B over every other default op (H200, 2026-11-27,
# results/2026-11-27-h200/session7/ §8): Gemma-2-9B -0.57% at batch 1, -0.06% (n.s.) at batch 2, greedy tokens
# identical. DEFAULT_OFF = "reason" would take it out of `--ops all` again.
DEFAULT_OFF = ""

ADAPTER = mlp_adapter("gate_up_gelu_tanh", mlp_expand(MLPS, "GeluAndMul", ACT, approximate="tanh"), ACT)
