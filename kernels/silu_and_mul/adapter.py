"""The patch adapter: how SGLang's silu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter, gated_out, gated_rows

# Off in `--ops all`: it wins chained (1.29x) but barely between the GEMMs that surround it in serving. Decode corpus in
# context at its serving sites 1.063x (52 rows, 50 within noise, 16 x 256 0.755x; H200, 2026-11-28,
# results/2026-11-28-h200/session17/); its share of the Llama-3-8B decode step +0.13% [+0.08, +0.19] at batch 1,
# -0.03% (not resolved) at batch 8 (H200, 2026-11-27, results/2026-11-27-h200/session7/). In a patched server the
# dense MLPs' 1-2-token calls run gate_up_silu (the activation in the GEMV's epilogue). `--ops all,silu_and_mul` still
# patches it.
DEFAULT_OFF = ("little gain in context and none in the step: decode corpus in context at its serving sites 1.063x "
               "on the H200 (min 0.755x; results/2026-11-28-h200/session17/); Llama-3-8B decode step +0.13% at batch "
               "1, -0.03% (n.s.) at batch 8 (results/2026-11-27-h200/session7/); gate_up_silu takes the dense MLPs' "
               "1-2-token calls")

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
