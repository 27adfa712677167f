"""The patch adapter: how SGLang's gelu_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means."""
from __future__ import annotations

from astra_sglang.patch.adapters import JitRoute, OpAdapter, contiguity_problem


def _act_normalize(c):
    x, out = c["input"], c["out"]
    if x.dim() < 1 or x.shape[-1] % 2:
        return f"input's last dimension {tuple(x.shape)[-1:]} is not even"
    d = x.shape[-1] // 2
    if tuple(out.shape) != tuple(x.shape[:-1]) + (d,):
        return f"out shape {tuple(out.shape)} != {tuple(x.shape[:-1]) + (d,)}"
    bad = contiguity_problem(c, ("input", "out"))
    if bad:
        return bad
    if x.dim() == 2:
        return {"input": x, "out": out}, (x.shape[0], d)
    t = x.numel() // (2 * d) if d else 0
    return {"input": x.view(t, 2 * d), "out": out.view(t, d)}, (t, d)


ADAPTER = OpAdapter(
    op="gelu_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": lambda c: c["input"].new_empty(tuple(c["input"].shape[:-1]) + (c["input"].shape[-1] // 2,))},
    normalize=_act_normalize,
    returns=lambda c: c["out"],
    jit_routes={
        # sglang.kernels.ops.activation.activation.activation_module(dtype, *, fast_math=True)
        # .run_activation(input_2d, out_2d, op_name); the precise-math build (fast_math=False, the
        # rounding variants) is a different contract: not routed.
        "elementwise/activation.cuh": (
            JitRoute(
                "run_activation",
                ("input", "out", "=op_name"),
                match=lambda a: len(a) >= 3 and a[2] == "gelu",
                factory_ok=lambda f: bool(f.get("fast_math", True)),
            ),
        ),
    },
)
