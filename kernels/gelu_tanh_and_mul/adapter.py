"""The patch adapter: how SGLang's gelu_tanh_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

No JIT route: SGLang's JIT activation_module(dtype).run_activation(input, out, "gelu_tanh") is the factory
silu_and_mul already routes, and patch wraps a factory for one op only (a second op's wrapper replaces the
first: silu's route was lost when this op declared one, 2026-11-23). GeluAndMul's calls still reach this
op through the Python callables in the spec's `replaces`; direct users of the JIT module (fused_moe's
gelu activations, GGUF) stay SGLang's until patch chains several ops' routes on one factory."""
from __future__ import annotations

from typing import Optional

from astra_sglang.patch.adapters import OpAdapter, gated_out, gated_rows

# Decode calls of this many tokens up to 256 stay SGLang's: between astra's linears at their serving sites, with 48
# replays, 11 of the 15 such rows were slower or tied (64-256 tokens 0.909-0.996x, 16 tokens 0.927-1.020x), while
# every 1-token row won (1.23-1.39x) and prefill rows are >= 1.00x (H200, 2026-12-01, results/2026-12-01-h200/session39/
# R). Gemma-2/3 serve their 1-2-token MLP calls through gate_up_gelu_tanh; this op takes the rest. The kernel's late
# release (ASTRA_LATE_TOKENS, run.sh G there) is the candidate to win these rows back.
KEEP_TOKENS = (16, 256)


def _kept(dims) -> Optional[str]:
    lo, hi = KEEP_TOKENS
    t = int(dims[0])
    if lo <= t <= hi:
        return f"{t} tokens: SGLang's kernel was as fast or faster in context at {lo}-{hi} tokens"
    return None


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
