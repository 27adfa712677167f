"""The patch adapter: how SGLang's gelu_tanh_and_mul callables (sgl_kernel, the JIT activation module) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

No JIT route: SGLang's JIT activation_module(dtype).run_activation(input, out, "gelu_tanh") is the factory
silu_and_mul already routes, and patch wraps a factory for one op only (a second op's wrapper replaces the
first: silu's route was lost when this op declared one, 2026-11-23). GeluAndMul's calls still reach this
op through the Python callables in the spec's `replaces`; direct users of the JIT module (fused_moe's
gelu activations, GGUF) stay SGLang's until patch chains several ops' routes on one factory."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem


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
    op="gelu_tanh_and_mul",
    data="input",
    same_dtype=("input", "out"),
    rowwise=("input", "out"),
    alloc={"out": lambda c: c["input"].new_empty(tuple(c["input"].shape[:-1]) + (c["input"].shape[-1] // 2,))},
    normalize=_act_normalize,
    returns=lambda c: c["out"],
)
