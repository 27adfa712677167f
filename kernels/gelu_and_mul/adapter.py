"""The patch adapter: how SGLang's gelu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

No JIT route: SGLang's JIT activation_module(dtype).run_activation(input, out, "gelu") is the factory
silu_and_mul already routes, and patch wraps a factory for one op only (a second op's wrapper replaces the
first: silu's route was lost when this op declared one, 2026-11-23). GeluAndMul's calls still reach this
op through the Python callables in the spec's `replaces`; direct users of the JIT module (fused_moe's
gelu activations, GGUF) stay SGLang's until patch chains several ops' routes on one factory."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, gated_out, gated_rows


# Off in `--ops all`: in context it is no faster. At its serving site (gate_up -> act -> down_proj of Gemma-1's MLP
# widths), with 48 replays: 1.014x over 12 rows, 6 slower, every one of 16-256 tokens (0.89-0.98x), while the 1-token
# rows win (H200, 2026-12-01, results/2026-12-01-h200/session39/R); silu's late release did not win those rows back
# (0.91-0.98x, results/2026-12-02-h200/session40/G). Gemma-1's 1-2-token MLP calls run gate_up_gelu instead (the
# activation in the gate_up GEMV's epilogue). `--ops all,gelu_and_mul` still patches it.
DEFAULT_OFF = ("no faster in context: decode corpus at its serving sites 1.014x on the H200 at 48 replays, its 16-256-"
               "token rows 0.89-0.98x (results/2026-12-01-h200/session39/R); gate_up_gelu takes Gemma-1's 1-2-token "
               "MLP calls")

ADAPTER = OpAdapter(
    op="gelu_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": gated_out},
    normalize=gated_rows,
    returns=lambda c: c["out"],
)
