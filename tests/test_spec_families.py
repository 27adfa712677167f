"""The op families (astra_sglang/families/): every op a family builds keeps the family's conventions, and its
fp64 reference agrees, on CPU, with a direct formula or with a sibling op's reference."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.families import activation  # noqa: E402
from astra_sglang.models import model  # noqa: E402
from astra_sglang.registry import get_op  # noqa: E402

ACTS = {"silu_and_mul": "silu", "gelu_and_mul": "gelu", "gelu_tanh_and_mul": "gelu_tanh"}
FAMILY_OPS = tuple(ACTS)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _inputs(spec, dims, dt="fp32", dist="normal", seed=0):
    return spec.make_inputs(dims, dt, _gen(seed), dist, device="cpu")


@pytest.mark.parametrize("op", FAMILY_OPS)
def test_abi_convention_pointers_dims_scalars_dtype(op):
    """Pointers, one int64 per shape dim in dim_names order, the scalars, `int dtype` last; make_inputs
    fills every pointer and scalars() every scalar."""
    spec = get_op(op)
    ptrs = [a for a in spec.abi if a.ctype == "ptr"]
    n = len(ptrs)
    assert list(spec.abi[:n]) == ptrs and all(a.role in ("in", "out", "inout") for a in ptrs)
    assert [(a.name, a.ctype) for a in spec.abi[n:n + len(spec.dim_names)]] == [(d, "i64") for d in spec.dim_names]
    assert (spec.abi[-1].name, spec.abi[-1].ctype) == ("dtype", "i32")
    scalar_args = [a.name for a in spec.abi[n + len(spec.dim_names):-1]]
    dims = (spec.edge_shapes[0] if op != "kv_store" else spec.edge_shapes[1]).dims
    assert sorted(spec.scalars(dims)) == sorted(scalar_args)
    assert sorted(_inputs(spec, dims)) == sorted(a.name for a in ptrs)


@pytest.mark.parametrize("op", ACTS)
def test_activation_ops_are_the_family_with_their_act(op):
    spec, act = get_op(op), ACTS[op]
    assert spec.abi == activation.ABI and spec.dim_names == activation.DIM_NAMES
    assert spec.make_inputs is activation.make_inputs and spec.bytes_moved is activation.bytes_moved
    jit = spec.variant("jit")
    assert jit.source_facts[:3] == activation.JIT_FACTS and jit.source_facts[-1] == activation.FALLBACK_BOUNDS_FACT
    assert spec.default_variant({}) == "jit"
    # the corpus draws only from models whose MLP runs this activation, at their per-rank widths
    for s in spec.corpus:
        if "paper" in s.tags:
            continue
        name, tp = s.source.split(";")[0].rsplit(" tp", 1)
        m = model(name)
        assert m.act == act and s.dims[1] == m.intermediate // int(tp)
    dims = (3, 40)
    assert spec.bytes_moved(dims, "bf16") == 3 * 3 * 40 * 2
    for dist in spec.distributions:
        inp = _inputs(spec, dims, dist=dist, seed=1)
        g, u = inp["input"].double()[:, :40], inp["input"].double()[:, 40:]
        if act == "silu":
            want = g / (1.0 + torch.exp(-g)) * u
        elif act == "gelu":
            want = 0.5 * g * (1.0 + torch.special.erf(g / math.sqrt(2.0))) * u
        else:
            want = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u
        torch.testing.assert_close(spec.reference(inp, dims, {})["out"], want, rtol=1e-12, atol=1e-12)
