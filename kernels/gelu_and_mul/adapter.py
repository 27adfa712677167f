"""The patch adapter: how SGLang's gelu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

No JIT route: SGLang's JIT activation_module(dtype).run_activation(input, out, "gelu") is the factory
silu_and_mul already routes, and patch wraps a factory for one op only (a second op's wrapper replaces the
first: silu's route was lost when this op declared one, 2026-11-23). GeluAndMul's calls still reach this
op through the Python callables in the spec's `replaces`; direct users of the JIT module (fused_moe's
gelu activations, GGUF) stay SGLang's until patch chains several ops' routes on one factory."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, gated_out, gated_rows


# Off in `--ops all`: in context it is no faster, at its serving site (gate_up -> act -> down_proj of Gemma-1's MLP
# widths) 0.991x over 12 rows, all within noise (H200, 2026-11-28, results/2026-11-28-h200/session17/; 0.989x at the
# generic pair on 2026-11-24), and Gemma-1's 1-2-token MLP calls run gate_up_gelu instead (the activation in the gate_up
# GEMV's epilogue). `--ops all,gelu_and_mul` still patches it.
DEFAULT_OFF = ("no faster in context: decode corpus at its serving sites 0.991x on the H200, all 12 rows within noise "
               "(results/2026-11-28-h200/session17/); gate_up_gelu takes Gemma-1's 1-2-token MLP calls")

ADAPTER = OpAdapter(
    op="gelu_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": gated_out},
    normalize=gated_rows,
    returns=lambda c: c["out"],
)
