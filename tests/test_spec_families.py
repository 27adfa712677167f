"""The op families (astra_sglang/families/): every op a family builds keeps the family's conventions, and its
fp64 reference agrees, on CPU, with a direct formula or with a sibling op's reference."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.families import activation, rmsnorm  # noqa: E402
from astra_sglang.models import model  # noqa: E402
from astra_sglang.registry import get_op  # noqa: E402

ACTS = {"silu_and_mul": "silu", "gelu_and_mul": "gelu", "gelu_tanh_and_mul": "gelu_tanh"}
# op -> (fused, weight_bias)
NORMS = {"rmsnorm": (False, 0.0), "fused_add_rmsnorm": (True, 0.0), "gemma_rmsnorm": (False, 1.0),
         "gemma_fused_add_rmsnorm": (True, 1.0)}
FAMILY_OPS = (*ACTS, *NORMS)


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


@pytest.mark.parametrize("op", NORMS)
def test_norm_ops_are_the_family_with_their_switches(op):
    spec, (fused, bias) = get_op(op), NORMS[op]
    assert spec.abi == rmsnorm.abi(fused) and spec.dim_names == rmsnorm.DIM_NAMES
    assert spec.replaces == tuple(f"{m}:{op}" for m in rmsnorm.BOUND_IN)
    assert spec.default_variant({}) == "flashinfer"
    assert all(f[0] == rmsnorm.NORM_HEADER for f in spec.variant("flashinfer").source_facts)
    # the corpus widths are hidden sizes (or MLA ranks) of models that run this norm kind
    kind = "gemma" if bias else "rms"
    for s in spec.corpus:
        if "paper" in s.tags:
            continue
        m = model(s.source.split(";")[0].rsplit(" ", 1)[0].replace(" MLA lora-rank", ""))
        assert m.norm == kind and s.dims[1] in (m.hidden, *m.extra_norm_widths), s
    dims = (5, 96)
    assert spec.bytes_moved(dims, "fp16") == ((4 if fused else 2) * 5 * 96 + 96) * 2
    eps = spec.scalars(dims)["eps"]
    for dist in spec.distributions:
        inp = _inputs(spec, dims, dist=dist, seed=2)
        x = inp["input"].double() + (inp["residual"].double() if fused else 0.0)
        want = x / torch.sqrt((x * x).sum(-1, keepdim=True) / 96 + eps) * (inp["weight"].double() + bias)
        ref = spec.reference(inp, dims, spec.scalars(dims))
        torch.testing.assert_close(ref["input" if fused else "out"], want, rtol=1e-12, atol=1e-12)
        if fused:
            torch.testing.assert_close(ref["residual"], x, rtol=0, atol=0)
