"""The patch adapter: how SGLang's silu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter, gated_out, gated_rows

# Off in `--ops all`: it wins chained but barely between the GEMMs that surround it in serving. Decode corpus in context
# at its serving sites, 48 replays: 1.046x over 52 rows, 12 slower (min 0.739x, 16 x 256), every 1-token row faster
# (1.15-1.38x), the 16-256-token rows 0.97-0.99x by token count, with the late release from 64 tokens (H200,
# 2026-12-02, results/2026-12-02-h200/session40/R2); its share of the Llama-3-8B decode step +0.13% [+0.08, +0.19] at
# batch 1, -0.03% (not resolved) at batch 8 (H200, 2026-11-27, results/2026-11-27-h200/session7/). In a patched server
# the dense MLPs' 1-2-token calls run gate_up_silu (the activation in the GEMV's epilogue). `--ops all,silu_and_mul`
# still patches it.
DEFAULT_OFF = ("little gain in context and none in the step: decode corpus in context at its serving sites 1.046x "
               "on the H200 at 48 replays, 12 of 52 rows slower (min 0.739x; results/2026-12-02-h200/session40/R2); "
               "Llama-3-8B decode step +0.13% at batch 1, -0.03% (n.s.) at batch 8 (results/2026-11-27-h200/session7/); "
               "gate_up_silu takes the dense MLPs' 1-2-token calls")

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
