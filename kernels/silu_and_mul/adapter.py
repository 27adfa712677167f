"""The patch adapter: how SGLang's silu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter, gated_out, gated_rows


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
