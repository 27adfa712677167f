"""The op families (astra_sglang/families/): every op a family builds keeps the family's conventions, and its
fp64 reference agrees, on CPU, with a direct formula or with a sibling op's reference."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.families import activation, qkv, rmsnorm  # noqa: E402
from astra_sglang.models import model  # noqa: E402
from astra_sglang.registry import get_op  # noqa: E402

ACTS = {"silu_and_mul": "silu", "gelu_and_mul": "gelu", "gelu_tanh_and_mul": "gelu_tanh"}
# op -> (fused, weight_bias)
NORMS = {"rmsnorm": (False, 0.0), "fused_add_rmsnorm": (True, 0.0), "gemma_rmsnorm": (False, 1.0),
         "gemma_fused_add_rmsnorm": (True, 1.0)}
QKV = ("qknorm", "rope", "rope_store", "kv_store")
FAMILY_OPS = (*ACTS, *NORMS, *QKV)


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
    assert jit.source_facts[:3] == activation.JIT_FACTS and jit.source_facts[-1] == activation.FALLBACK_FACT
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


def test_qknorm_is_the_rmsnorm_of_each_head_and_leaves_the_rest_of_the_row():
    qn, rn = get_op("qknorm"), get_op("rmsnorm")
    t, hq, hk, d = 3, 4, 2, 64
    dims = (t, hq, hk, d, (hq + 2 * hk) * d, (hq + 2 * hk) * d)
    inp = _inputs(qn, dims, seed=3)
    eps = qn.scalars(dims)["eps"]
    ref = qn.reference(inp, dims, {"eps": eps})
    for x, w, h in ((inp["q"], inp["q_weight"], hq), (inp["k"], inp["k_weight"], hk)):
        name = "q" if x is inp["q"] else "k"
        heads = x.double()[:, : h * d].reshape(t * h, d)
        want = rn.reference({"input": heads, "weight": w.double()}, (t * h, d), {"eps": eps})["out"]
        torch.testing.assert_close(ref[name][:, : h * d].reshape(t * h, d), want, rtol=0, atol=0)
        assert torch.equal(ref[name][:, h * d:], x.double()[:, h * d:])


@pytest.mark.parametrize("op", QKV)
def test_qkv_corpus_follows_the_model_head_layout(op):
    spec = get_op(op)
    assert spec.default_variant({}) == "jit" and spec.dtypes == qkv.DTYPES
    for s in spec.corpus:
        name, tp = s.source.split(";")[0].rsplit(" tp", 1)
        q, k = qkv.per_rank_heads(model(name), int(tp))
        d = model(name).head_dim
        stride = qkv.qkv_stride(q, k, d)
        if op == "kv_store":
            assert s.dims[1:] == (k * d, k * d, stride, stride)
        else:
            assert s.dims[1:4] == (q, k, d) and s.dims[-1] == stride


def test_rope_store_is_rope_then_the_kv_store():
    rs, rope, kv = get_op("rope_store"), get_op("rope"), get_op("kv_store")
    t, hq, hk, d = 4, 4, 2, 64
    s = qkv.qkv_stride(hq, hk, d)
    for dims in ((t, hq, hk, d, s, s, s), (5, 8, 2, 128, 1536, 1536, 1536)):  # NeoX, then the GPT-J edge shape
        inp = {k: (v.double() if v.is_floating_point() else v) for k, v in _inputs(rs, dims, seed=4).items()}
        sc = rs.scalars(dims)
        ref = rs.reference(inp, dims, sc)
        t, hq, hk, d = dims[:4]
        rdims = (t, hq, hk, d, d, dims[4], dims[5])
        rot = rope.reference(inp, rdims, sc)
        assert torch.equal(ref["q"], rot["q"]) and torch.equal(ref["k"], rot["k"])
        stored = {"k": rot["k"], "v": inp["v"], "k_cache": inp["k_cache"], "v_cache": inp["v_cache"],
                  "indices": inp["out_loc"]}
        kdims = (t, hk * d, hk * d, dims[5], dims[6])
        want = kv.reference(stored, kdims, {"reserved_skip_index": -1})  # rope_store skips no slot
        assert torch.equal(ref["k_cache"], want["k_cache"]) and torch.equal(ref["v_cache"], want["v_cache"])


@pytest.mark.parametrize("neox", [1, 0])
def test_rotate_is_a_complex_rotation(neox):
    t, heads, d, r = 3, 2, 8, 8
    x = torch.randn((t, heads * d), generator=_gen(5), dtype=torch.float64)
    ang = torch.rand((t, r // 2), generator=_gen(6), dtype=torch.float64) * 6
    out = qkv.rotate(x, heads, d, r, ang.cos(), ang.sin(), bool(neox)).reshape(t, heads, d)
    h = x.reshape(t, heads, d)
    a, b = (h[..., : r // 2], h[..., r // 2:]) if neox else (h[..., 0::2], h[..., 1::2])
    z = torch.complex(a, b) * torch.polar(torch.ones_like(ang), ang)[:, None, :]
    got = (out[..., : r // 2], out[..., r // 2:]) if neox else (out[..., 0::2], out[..., 1::2])
    torch.testing.assert_close(got[0], z.real, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], z.imag, rtol=1e-12, atol=1e-12)


def test_kv_pools_share_the_family_slot_count():
    kv, rs = get_op("kv_store"), get_op("rope_store")
    for t in (1, 3, 5000):
        assert kv.scalars((t, 128, 128, 128, 128))["size_limit"] == qkv.cache_slots(t)
    dims = (3, 1, 1, 64, 192, 192, 192)
    assert _inputs(rs, dims)["k_cache"].shape[0] == qkv.cache_slots(3)


Q_OUT_OPS = ("gemma_qknorm_rope", "dense_rope_store", "qknorm_rope_store", "qknorm_rope")


def test_with_q_out_appends_the_contiguous_q_out_stride():
    assert qkv.with_q_out((3, 4, 2, 64, 512, 512)) == (3, 4, 2, 64, 512, 512, 256)
    assert qkv.with_q_out([5, 8, 2, 128, 1536, 1536, 1536]) == (5, 8, 2, 128, 1536, 1536, 1536, 1024)
    assert qkv.with_q_out((7, 64, 3, 2), hq_index=2, head_dim_index=3) == (7, 64, 3, 2, 6)


@pytest.mark.parametrize("op", ("dense_rope_store", "qknorm_rope_store", "qknorm_rope"))
def test_the_launchers_q_copy_is_what_bench_takes_out_of_production_at_one_token(op):
    """Their extracted launchers copy q into q_out before SGLang's in-place kernels. Serving makes that copy (fa3's
    q.contiguous()) from 2 tokens on, not at 1: spec.launcher_only gives bench the copy to time alone at 1 token only,
    and it writes exactly q's heads into q_out, leaving the rest of q_out and every other tensor as they were."""
    spec = get_op(op)
    dims = next(s.dims for s in spec.corpus if s.dims[0] == 1)
    assert spec.launcher_only((2, *dims[1:])) is None and spec.launcher_only((16, *dims[1:])) is None
    hq, d = dims[1], dims[3]
    inp = spec.make_inputs(dims, "bf16", _gen(3), device="cpu")
    out = {n: v.clone() if hasattr(v, "clone") else v for n, v in inp.items()}
    out["q_out"].fill_(7.0)
    spec.launcher_only(dims)(out)
    assert torch.equal(out["q_out"].reshape(1, -1)[:, : hq * d], inp["q"].reshape(1, -1)[:, : hq * d])
    assert torch.equal(out["q_out"].reshape(1, -1)[:, hq * d:], torch.full_like(out["q_out"].reshape(1, -1)[:, hq * d:], 7.0))
    assert all(torch.equal(out[n], inp[n]) for n in inp if n != "q_out" and hasattr(inp[n], "dtype"))
    assert get_op("gemma_qknorm_rope").launcher_only is None  # production is SGLang's installed torch path


@pytest.mark.parametrize("op", Q_OUT_OPS)
def test_the_q_out_ops_dims_end_with_with_q_out_s_stride(op):
    """The four ops that write q into its own buffer: q read ('in'), q_out written ('out') right after it, and
    q_out_stride the last dim, with_q_out's in every corpus and edge shape and in the profile's model dims."""
    from astra_sglang.registry import op_part

    spec = get_op(op)
    ptrs = [(a.name, a.role) for a in spec.abi if a.ctype == "ptr"]
    assert ptrs[:2] == [("q", "in"), ("q_out", "out")] and spec.dim_names[-1] == "q_out_stride"
    for s in spec.corpus + spec.edge_shapes:
        assert s.dims == qkv.with_q_out(s.dims[:-1]), (op, s.dims)
    cfg = {"num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 2048}
    dims = op_part(op, "spec").model_dims(cfg, 16, 2)
    assert dims == qkv.with_q_out(dims[:-1]) and dims[-1] == 16 * 128
