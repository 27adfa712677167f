"""The patch adapter: how SGLang's gelu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

No JIT route: SGLang's JIT activation_module(dtype).run_activation(input, out, "gelu") is the factory
silu_and_mul already routes, and patch wraps a factory for one op only (a second op's wrapper replaces the
first: silu's route was lost when this op declared one, 2026-11-23). GeluAndMul's calls still reach this
op through the Python callables in the spec's `replaces`; direct users of the JIT module (fused_moe's
gelu activations, GGUF) stay SGLang's until patch chains several ops' routes on one factory."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, gated_out, gated_rows


# Off in `--ops all`: in context it is no faster (H200 2026-11-24, results/2026-11-24-h200/kernels/decode_corpus_rest/),
# and no served model here calls it (Gemma-1's MLP; Gemma-2/3 run gelu_tanh_and_mul), so no step or server shows
# a gain either. `--ops all,gelu_and_mul` still patches it.
DEFAULT_OFF = ("no faster in context: decode corpus geomean 0.989x on the H200, 7 of 12 rows below 1.00x (min 0.90x; "
               "results/2026-11-24-h200/kernels/decode_corpus_rest/), and no served model measured")

ADAPTER = OpAdapter(
    op="gelu_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": gated_out},
    normalize=gated_rows,
    returns=lambda c: c["out"],
)
