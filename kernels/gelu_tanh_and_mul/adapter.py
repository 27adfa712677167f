"""The patch adapter: how SGLang's gelu_tanh_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

No JIT route: SGLang's JIT activation_module(dtype).run_activation(input, out, "gelu_tanh") is the factory
silu_and_mul already routes, and patch wraps a factory for one op only (a second op's wrapper replaces the
first: silu's route was lost when this op declared one, 2026-11-23). GeluAndMul's calls still reach this
op through the Python callables in the spec's `replaces`; direct users of the JIT module (fused_moe's
gelu activations, GGUF) stay SGLang's until patch chains several ops' routes on one factory."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, gated_out, gated_rows, rows_band

# Decode calls of 16-256 tokens stay SGLang's: between astra's linears at their serving sites, with 48 replays, 11 of
# the 15 such rows were slower or tied (64-256 tokens 0.909-0.996x, 16 tokens 0.927-1.020x), while every 1-token row
# won (1.23-1.39x) and prefill rows are >= 1.00x (H200, 2026-12-01, results/2026-12-01-h200/session39/R). Gemma-2/3
# serve their 1-2-token MLP calls through gate_up_gelu_tanh; this op takes the rest. silu_and_mul's release after the
# stores did not win them back: 256 x 14336 stayed 0.95-0.98x with it from 16 or from 64 tokens, both orders
# (results/2026-12-02-h200/session40/G), so the kernel no longer carries it.
KEEP_TOKENS = (16, 256)
_kept = rows_band(KEEP_TOKENS, "SGLang's kernel was as fast or faster in context at {}-{} tokens".format(*KEEP_TOKENS))


ADAPTER = OpAdapter(
    op="gelu_tanh_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": gated_out},
    normalize=gated_rows,
    returns=lambda c: c["out"],
    keeps=_kept,
)
