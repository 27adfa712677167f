"""The patch adapter: how SGLang's silu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter, gated_out, gated_rows

# Off in `--ops all`: it wins chained (1.30x) but not between the GEMMs that surround it in serving. Decode corpus in
# context 0.994x (27 of 52 rows below 1.00x; two measurably slower, min 0.71x at hidden 256) and its share of the
# Llama-3-8B decode step +0.13% [+0.08, +0.19] at batch 1, -0.03% (not resolved) at batch 8 (H200, 2026-11-27,
# results/2026-11-27-h200/session7/). `--ops all,silu_and_mul` still patches it.
DEFAULT_OFF = ("no gain in context or in the step: decode corpus in context geomean 0.994x on the H200 (min 0.71x); "
               "Llama-3-8B decode step +0.13% at batch 1, -0.03% (n.s.) at batch 8 (results/2026-11-27-h200/session7/)")

ADAPTER = OpAdapter(
    op="silu_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": gated_out},
    normalize=gated_rows,
    returns=lambda c: c["out"],
    jit_routes={
        # sglang.kernels.ops.activation.activation.activation_module(dtype, *, fast_math=True)
        # .run_activation(input_2d, out_2d, op_name)
        "elementwise/activation.cuh": (
            JitRoute(
                "run_activation",
                ("input", "out", "=op_name"),
                match=lambda a: len(a) >= 3 and a[2] == "silu",
                factory_ok=lambda f: bool(f.get("fast_math", True)),
            ),
        ),
    },
)
