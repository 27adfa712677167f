"""The patch adapter: how SGLang's fused_add_rmsnorm callables (sgl_kernel, the JIT norm module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter, weighted_rows


ADAPTER = OpAdapter(
    op="fused_add_rmsnorm",
    data="input",
    same_dtype=("input", "residual", "weight"),
    rowwise=("input", "residual"),
    ignorable=frozenset({"enable_pdl"}),
    normalize=weighted_rows(("input", "residual")),
    returns=lambda c: None,
    jit_routes={
        # sglang.kernels.ops.layernorm.norm._jit_fused_add_rmsnorm_module(dtype, cast_x_before_out_mul)
        # .fused_add_rmsnorm(input, residual, weight, eps); cast_x_before_out_mul=True is the
        # HF-parity rounding, a different contract: not routed.
        "elementwise/fused_add_rmsnorm.cuh": (
            JitRoute(
                "fused_add_rmsnorm",
                ("input", "residual", "weight", "eps"),
                # conservative: a factory without this parameter is not routed
                factory_ok=lambda f: f.get("cast_x_before_out_mul", True) is False,
            ),
        ),
    },
)
