"""gemma_qknorm_rope (kernels/gemma_qknorm_rope/): the FUSED op of Gemma-3 attention, the per-head q/k norm with
(1 + w) then the rotation by the step's cos/sin rows in one launch, k in place and q into its own contiguous q_out
(ASTRA_GQKR_Q_OUT=0: in place, for a step A/B). On CPU: the spec loads through the
registry with the ABI the kernel is written against; its fp64 reference is the formula SGLang's torch code computes;
the harness runs every edge shape on CPU; production's numerics (emulated: the norm rounded, then the rotation)
stay inside its own sanity bound; the facts the adapter relies on hold in the real sglang 0.5.17 and 0.5.23 sources;
the adapter's sequence runs SGLang's own norm and rotation on the views forward_native makes, and its tail runs the
attention (on q_out) and o_proj as the method does; the patch's self-check never writes q when q_out is separate.

No kernel runs on the CPU; on a GPU with SGLang installed, the last test checks the kernel against SGLang's own torch
sequence, bit for bit."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from adapter_env import adapter_attr_under_env  # noqa: E402
from cli_run import run_cli  # noqa: E402

OP = "gemma_qknorm_rope"
SPEC = get_op(OP)
TARGET = "sglang.srt.models.gemma3_causal:Gemma3Attention.forward_native"


# ------------------------------------------------------------------------------------------ the contract
def test_spec_loads_with_the_kernel_s_abi_and_names_what_it_replaces():
    assert SPEC.symbol == "astra_gemma_qknorm_rope"
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_gemma_qknorm_rope(const void* q, void* q_out, void* k, const void* q_weight, '
        "const void* k_weight, const void* cos, const void* sin, int64_t num_tokens, int64_t num_q_heads, "
        "int64_t num_kv_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride, int64_t q_out_stride, "
        "double eps, int dtype, cudaStream_t stream)")
    kernel = op_part(OP, "spec").__file__.replace("spec.py", "kernel.cu")
    src = " ".join(Path(kernel).read_text().split())
    assert SPEC.c_signature().replace("extern \"C\" ", "").split("(")[0] in src
    # the definition's parameters are the spec's, in order (whitespace aside)
    assert SPEC.c_signature().split(" ", 2)[2] in src
    assert SPEC.dim_names == get_op("qknorm").dim_names + ("q_out_stride",) == get_op("qknorm_rope").dim_names
    roles = {a.name: a.role for a in SPEC.abi if a.ctype == "ptr"}
    assert (roles["q"], roles["q_out"], roles["k"]) == ("in", "out", "inout")
    assert SPEC.replaces == (TARGET,) and SPEC.variant("installed").callable == TARGET
    assert SPEC.default_variant({}) == "installed"
    assert SPEC.tolerance == get_op("qknorm_rope").tolerance  # production rounds the normed q/k before rotating
    assert SPEC.kernel_symbols == (r"astra_gqkr::",)
    assert SPEC.scalars((1, 16, 8, 256, 8192, 8192, 4096)) == {"eps": 1e-6}


def test_corpus_is_gemma_3_s_heads_per_rank_and_sits_between_the_qkv_gemm_and_the_kv_store():
    decode = {s.dims for s in SPEC.corpus if "decode" in s.tags}
    assert (1, 16, 8, 256, 8192, 8192, 4096) in decode      # Gemma-3-12B
    assert (16, 8, 4, 256, 4096, 4096, 2048) in decode      # Gemma-3-12B TP 2 and Gemma-3-4B
    assert (64, 8, 4, 128, 2048, 2048, 1024) in decode      # Gemma-3-27B TP 4
    assert all(s.dims[3] in (128, 256) for s in SPEC.corpus)
    # q_out contiguous everywhere (the harness poisons all of it): the patch's own buffer
    assert all(s.dims[6] == s.dims[1] * s.dims[3] for s in SPEC.corpus + SPEC.edge_shapes)
    (site,) = SPEC.context_sites((1, 16, 8, 256, 8192, 8192, 4096))
    assert site.name == "gemma-3-12b qkv -> q/k norm + rope -> KV store -> attention"
    assert (site.producer_k, site.norm_after, site.norm_before) == (3840, True, False)


# ------------------------------------------------------------------------------------------ reference
def _inputs(dims, dtype="bf16", seed=0, dist="normal"):
    return SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(seed), dist, device="cpu")


def _formula(x, w, cos, sin, eps):
    """SGLang's torch math in fp64 on [tokens, heads, d]: x * rsqrt(mean(x^2) + eps) * (1 + w), then
    x * cos + rotate_half(x) * sin."""
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)
    half = n.shape[-1] // 2
    rot = torch.cat([-n[..., half:], n[..., :half]], dim=-1)
    return n * cos[:, None, :] + rot * sin[:, None, :]


@pytest.mark.parametrize("dims", [(3, 4, 2, 64, 512, 512, 256), (2, 2, 1, 256, 1024, 512, 512),
                                  (1, 8, 4, 128, 2048, 2048, 1024)])
def test_reference_is_the_torch_formula_and_leaves_other_columns(dims):
    t, hq, hk, d, qs, ks, qos = dims
    inp = {n: x.double() for n, x in _inputs(dims).items()}
    ref = SPEC.reference(inp, dims, {"eps": 1e-6})
    assert set(ref) == {"q_out", "k"} and ref["q_out"].shape == (t, qos)  # q is an input: not an output
    for name, out, heads in (("q", "q_out", hq), ("k", "k", hk)):
        x = inp[name][:, : heads * d].reshape(t, heads, d)
        want = _formula(x, inp[f"{name}_weight"], inp["cos"], inp["sin"], 1e-6)
        assert torch.allclose(ref[out][:, : heads * d].reshape(t, heads, d), want, rtol=0, atol=1e-12)
    assert torch.equal(ref["k"][:, hk * d:], inp["k"][:, hk * d:])


def test_reference_takes_the_patch_s_head_views():
    dims = (3, 4, 2, 64, 512, 512, 256)
    inp = {n: x.double() for n, x in _inputs(dims).items()}
    rows = SPEC.reference(inp, dims, {"eps": 1e-6})
    views = {**inp, "q": inp["q"][:, :256].reshape(3, 4, 64), "q_out": inp["q_out"].reshape(3, 4, 64),
             "k": inp["k"][:, :128].reshape(3, 2, 64)}
    got = SPEC.reference(views, dims, {"eps": 1e-6})
    assert got["q_out"].shape == (3, 4, 64)
    assert torch.allclose(got["q_out"].reshape(3, -1), rows["q_out"], atol=1e-12)
    assert torch.allclose(got["k"].reshape(3, -1), rows["k"][:, :128], atol=1e-12)
    # without q_out (harness/oracle.py reference_walk hands the inputs only): q's heads' shape
    del views["q_out"]
    assert SPEC.reference(views, dims, {"eps": 1e-6})["q_out"].shape == (3, 4, 64)


def test_cos_sin_rows_are_gemma_3_s_duplicated_halves_in_the_model_dtype():
    pos = torch.tensor([0, 5, 8191])
    cos, sin = op_part(OP, "spec").cos_sin_rows(pos, 256, torch.bfloat16)
    assert cos.dtype == torch.bfloat16 and cos.shape == (3, 256)
    assert torch.equal(cos[:, :128], cos[:, 128:]) and torch.equal(sin[:, :128], sin[:, 128:])
    assert torch.all(cos[0] == 1) and torch.all(sin[0] == 0)
    inp = _inputs((1, 1, 1, 256, 768, 768, 256))  # a 1-token case never draws position 0 (an all-zero sin row)
    assert inp["sin"].abs().max() > 0


def test_harness_runs_every_edge_shape_and_distribution_on_cpu(monkeypatch):
    from reference_harness import run_edge_cases_on_cpu

    monkeypatch.setattr(op_part(OP, "spec"), "MAX_POSITION", 64)
    run_edge_cases_on_cpu(SPEC)


def test_production_numerics_pass_its_own_sanity_bound():
    """Production's torch code: fp32 norm rounded to the model dtype (type_as), fp32 rotation, one rounding. Its
    error against the fp64 chain stays inside the sanity bound of the spec's floors (families/qkv.py says why they
    are raised); this is the kernel's rounding too."""
    from astra_sglang.harness.numerics import BASELINE_SLACK, rel_err, tolerance

    shapes = list(SPEC.edge_shapes) + [s for s in SPEC.corpus if "decode" in s.tags and s.dims[0] <= 16]
    for shape in shapes:
        t, hq, hk, d = shape.dims[:4]
        for dt in SPEC.dtypes:
            for dist in SPEC.distributions:
                inp = _inputs(shape.dims, dt, seed=3, dist=dist)
                ref = SPEC.reference({n: x.double() for n, x in inp.items()}, shape.dims, {"eps": 1e-6})
                for name, out_name, heads in (("q", "q_out", hq), ("k", "k", hk)):
                    x = inp[name][:, : heads * d].float().reshape(t, heads, d)
                    w = inp[f"{name}_weight"].float()
                    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w)
                    n = n.to(inp[name].dtype).float()  # type_as(x): the norm's output in the model dtype
                    half = d // 2
                    o = n * inp["cos"].float()[:, None] + torch.cat([-n[..., half:], n[..., :half]], -1) * \
                        inp["sin"].float()[:, None]
                    out = inp[out_name].clone()
                    out[:, : heads * d] = o.reshape(t, heads * d).to(out.dtype)
                    err = rel_err(out, ref[out_name])["err"]
                    assert err <= BASELINE_SLACK * tolerance(SPEC, dt, None), (shape.dims, dt, dist, name, err)


# ------------------------------------------------------------------------------------------ SGLang's sources
@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, request):
    src = (Path(request.getfixturevalue("sglang_0_5_17_source")) if which == "0.5.17"
           else Path(request.getfixturevalue("wheel_sources")["sglang"]))
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"), "--sglang-src",
                            str(src)], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / OP / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == TARGET
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == which


# ------------------------------------------------------------------------------------------ the adapter
def _stub_sglang(monkeypatch):
    """Stand-ins for the two SGLang modules the sequence imports: Gemma3RMSNorm with SGLang's formula (recording the
    shapes it is called on) and apply_rotary_pos_emb (recording its cos shape)."""
    calls = []
    ln = types.ModuleType("sglang.srt.layers.layernorm")
    re_ = types.ModuleType("sglang.srt.layers.rotary_embedding")

    class Gemma3RMSNorm(torch.nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps, self.weight = eps, torch.nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            calls.append(("norm", tuple(x.shape)))
            out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
            return (out * (1.0 + self.weight.float())).type_as(x)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(("rope", tuple(cos.shape)))
        c, s = cos.unsqueeze(unsqueeze_dim).float(), sin.unsqueeze(unsqueeze_dim).float()

        def rot(x):
            h = x.shape[-1] // 2
            return torch.cat([-x[..., h:], x[..., :h]], -1)

        return ((q.float() * c + rot(q.float()) * s).to(q.dtype), (k.float() * c + rot(k.float()) * s).to(k.dtype))

    ln.Gemma3RMSNorm, re_.apply_rotary_pos_emb = Gemma3RMSNorm, apply_rotary_pos_emb
    for m in (ln, re_):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    return calls


def test_sequence_norms_the_views_forward_native_makes_then_rotates_into_q_out(monkeypatch):
    """On the harness's tensors (no layer): SGLang's Gemma3RMSNorm built around the op's weights, on
    [1, heads, tokens, d] views; apply_rotary_pos_emb with [1, tokens, d] rows; q's result written into q_out (q left
    as it was), k's back in place, within production's rounding of the fp64 chain."""
    calls = _stub_sglang(monkeypatch)
    adapter = op_part(OP, "adapter").ADAPTER
    dims = (3, 4, 2, 64, 512, 512, 256)
    inp = _inputs(dims)
    q_before = inp["q"].clone()
    q, k = inp["q"][:, :256].view(3, 4, 64), inp["k"][:, :128].view(3, 2, 64)
    canon = {**inp, "q": q, "q_out": inp["q_out"].view(3, 4, 64), "k": k, "eps": 1e-6}
    views, got_dims = adapter.normalize(canon)
    assert got_dims == dims and views["cos"] is inp["cos"] and views["q_out"] is canon["q_out"]
    ref = SPEC.reference({n: x.double() for n, x in inp.items()}, dims, {"eps": 1e-6})
    adapter.sequence(canon)
    assert calls == [("norm", (1, 4, 3, 64)), ("norm", (1, 2, 3, 64)), ("rope", (1, 3, 64))]
    assert torch.equal(inp["q"], q_before)
    assert (inp["q_out"].double() - ref["q_out"]).abs().max() < 0.1
    assert (inp["k"][:, :128].double() - ref["k"][:, :128]).abs().max() < 0.1
    # the harness's installed baseline hands the [tokens, stride] row buffers and the shape (harness/installed.py)
    rows = _inputs(dims)
    before = rows["q"].clone()
    adapter.sequence({**rows, "eps": 1e-6, "abi_dims": dims})
    assert torch.equal(rows["q"], before)
    assert (rows["q_out"].double() - ref["q_out"]).abs().max() < 0.1
    # q_out = q (ASTRA_GQKR_Q_OUT=0): the result lands in q's own columns, other heads' columns untouched
    rows = _inputs(dims)
    q = rows["q"][:, :256].view(3, 4, 64)
    adapter.sequence({**rows, "q": q, "q_out": q, "k": rows["k"][:, :128].view(3, 2, 64), "eps": 1e-6})
    assert torch.equal(rows["q"][:, 256:], before[:, 256:])
    assert (rows["q"][:, :256].double() - ref["q_out"]).abs().max() < 0.1


def test_expand_declines_before_the_gemm():
    """Every reason to leave the call to SGLang is found before the layer's qkv GEMM runs."""
    expand = op_part(OP, "adapter").ADAPTER.expand

    class Layer(types.SimpleNamespace):
        def qkv_proj(self, h):
            raise AssertionError("the GEMM ran before a decline")

    layer = Layer(head_dim=256, num_heads=16, num_kv_heads=8, q_size=4096, kv_size=2048, q_norm=None, k_norm=None)
    hs = torch.zeros(2, 3840)
    cos = torch.zeros(1, 2, 256)
    args = {"self": layer, "positions": None, "hidden_states": hs, "position_embeddings": (cos, cos),
            "forward_batch": None}
    assert "CUDA" in expand(args)  # a CPU tensor
    adapter = op_part(OP, "adapter")
    assert adapter._rows_problem("cos", torch.zeros(2, 256), 2, 256, torch.float32)  # not [1, t, d]
    assert adapter._rows_problem("cos", cos, 2, 256, torch.bfloat16)                 # not the model's dtype
    assert adapter._rows_problem("cos", cos, 2, 256, torch.float32) == ""
    assert adapter._norm_problem(torch.nn.LayerNorm(256), 256, torch.float32)        # not a Gemma3RMSNorm


def test_returns_runs_the_attention_on_q_out_then_o_proj():
    """The attention gets q_out, contiguous [tokens, q_size] (fa3 copies a strided q), k and v as column views; where
    q_out is q itself (ASTRA_GQKR_Q_OUT=0) it gets q's column view of qkv, as before q_out."""
    seen = {}
    qkv = torch.randn(2, 4 * 8 + 2 * 2 * 8)
    q_out = torch.randn(2, 32)

    def attention(q, k, v, forward_batch=None):
        seen.update(q=q, k=k, v=v, fb=forward_batch)
        return q.reshape(1, 2, 4, 8)  # 0.5.17's triton backend shape

    layer = types.SimpleNamespace(q_size=32, attn=attention, o_proj=lambda x: (x * 2, None))
    returns = op_part(OP, "adapter")._returns
    c = {"layer": layer, "qkv": qkv, "sizes": [32, 16, 16], "forward_batch": "fb",
         "q": qkv[:, :32].view(2, 4, 8), "q_out": q_out.view(2, 4, 8)}
    out = returns(c)
    assert seen["fb"] == "fb" and seen["q"].data_ptr() == q_out.data_ptr() and seen["q"].shape == (2, 32)
    assert seen["q"].is_contiguous() and seen["k"].shape == (2, 16)
    assert seen["k"].data_ptr() == qkv[:, 32:].data_ptr()
    assert torch.equal(out, q_out * 2)
    c["q_out"] = c["q"]
    out = returns(c)
    assert seen["q"].data_ptr() == qkv.data_ptr() and seen["q"].stride() == (64, 1)
    assert torch.equal(out, qkv[:, :32] * 2)


def _gemma_layer(t=5, hq=4, hk=2, d=64, dtype=torch.bfloat16, seed=0):
    """An attention stand-in expand accepts on the CPU: Gemma3RMSNorm-named norms, a qkv_proj returning a fixed
    [t, (hq + 2 hk) d] output; with the (position_embeddings, hidden_states) to call it with."""
    g = torch.Generator().manual_seed(seed)

    class Gemma3RMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-6
            self.weight = torch.nn.Parameter((0.25 * torch.randn(d, generator=g)).to(dtype), requires_grad=False)

        def forward(self, x):  # _stub_sglang's formula
            out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
            return (out * (1.0 + self.weight.float())).type_as(x)

    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(dtype)
    layer = types.SimpleNamespace(head_dim=d, num_heads=hq, num_kv_heads=hk, q_size=hq * d, kv_size=hk * d,
                                  q_norm=Gemma3RMSNorm(), k_norm=Gemma3RMSNorm(), qkv_proj=lambda h: (qkv, None))
    pos = torch.arange(1, t + 1)
    cos, sin = op_part(OP, "spec").cos_sin_rows(pos, d, dtype)
    args = {"self": layer, "positions": pos, "hidden_states": torch.zeros(t, 8, dtype=dtype),
            "position_embeddings": (cos.unsqueeze(0), sin.unsqueeze(0)), "forward_batch": None}
    return layer, qkv, args


@pytest.mark.parametrize("q_out", [True, False])
def test_expand_gives_q_its_own_contiguous_buffer_unless_switched_off(q_out, monkeypatch):
    """ASTRA_GQKR_Q_OUT on (default): q_out is a fresh contiguous [t, hq, d] apart from qkv (q_out_stride hq * d);
    off: q_out is q's own view of qkv (q_out_stride = q_stride, in place), the A/B's arm A."""
    mod = op_part(OP, "adapter")
    monkeypatch.setattr(mod, "DEVICES", ("cpu",))
    monkeypatch.setattr(mod, "Q_OUT", q_out)
    layer, qkv, args = _gemma_layer()
    canon = mod.ADAPTER.expand(args)
    assert not isinstance(canon, str), canon
    q = canon["q"]
    assert q.shape == (5, 4, 64) and q.data_ptr() == qkv.data_ptr() and q.stride(0) == 512
    views, dims = mod.ADAPTER.normalize(canon)
    assert dims[:6] == (5, 4, 2, 64, 512, 512) and views["q_out"] is canon["q_out"]
    if q_out:
        qo = canon["q_out"]
        assert qo.shape == (5, 4, 64) and qo.is_contiguous() and qo.dtype == qkv.dtype and dims[6] == 256
        assert qo.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    else:
        assert canon["q_out"] is q and dims[6] == 512


def test_normalize_declines_a_q_out_that_overlaps_q_otherwise():
    """The kernel reads a q row whole before writing it: q_out may be q itself or apart from it, nothing between."""
    adapter = op_part(OP, "adapter").ADAPTER
    dims = (3, 4, 2, 64, 512, 512, 256)
    inp = _inputs(dims)
    base = {**inp, "q": inp["q"][:, :256].view(3, 4, 64), "k": inp["k"][:, :128].view(3, 2, 64), "eps": 1e-6}
    shifted = inp["q"][:, 64:320].view(3, 4, 64)                        # one head over: overlaps, not q
    assert "overlaps" in adapter.normalize({**base, "q_out": shifted})
    assert "shape" in adapter.normalize({**base, "q_out": inp["q_out"].view(3, 2, 128)})
    assert adapter.normalize({**base, "q_out": base["q"]})[1][6] == 512    # q itself: in place
    assert adapter.normalize({**base, "q_out": inp["q_out"].view(3, 4, 64)})[1][6] == 256


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_the_q_out_switch_is_read_from_the_environment_when_the_adapter_is_imported(value, on):
    assert adapter_attr_under_env(OP, "Q_OUT", "ASTRA_GQKR_Q_OUT", value) == str(on)


@pytest.mark.parametrize("kernel_ok", [True, False])
def test_the_self_check_never_writes_q_when_q_out_is_separate(kernel_ok, monkeypatch, tmp_path):
    """The patch's first call of a shape class, on the CPU (a torch stand-in for the kernel, SGLang's sequence
    stubbed): q is an input, untouched whether the self-check passes or fails; on a failure k is restored and SGLang's
    sequence reruns on the real q, so q_out and k are SGLang's own and the op disables."""
    from q_out_self_check import run_self_check

    _stub_sglang(monkeypatch)
    mod = op_part(OP, "adapter")
    monkeypatch.setattr(mod, "DEVICES", ("cpu",))
    monkeypatch.setattr(mod, "Q_OUT", True)

    layer, qkv, args = _gemma_layer()
    before = qkv.clone()
    want = mod.ADAPTER.expand(args)  # SGLang's sequence on a copy of the same qkv
    want["qkv"] = want_qkv = qkv.clone()
    want.update(q=want_qkv[:, :256].view(5, 4, 64), k=want_qkv[:, 256:384].view(5, 2, 64))
    mod.ADAPTER.sequence(want)

    canon = mod.ADAPTER.expand(args)
    st = run_self_check(SPEC, mod.ADAPTER, canon, tmp_path, kernel_ok)
    assert torch.equal(qkv[:, :256], before[:, :256])           # q: never written
    assert torch.equal(qkv[:, 384:], before[:, 384:])           # v: never written
    assert st.last_check is not None and st.last_check.ok == kernel_ok
    if kernel_ok:
        assert not st.disabled
        assert (canon["q_out"].double() - want["q_out"].double()).abs().max() < 0.1
    else:
        assert st.disabled and "self-check mismatch" in st.disabled
        assert torch.equal(canon["q_out"], want["q_out"]) and torch.equal(qkv[:, 256:384], want_qkv[:, 256:384])


def test_astra_sglang_ops_lists_it(capsys):
    code, out, _ = run_cli(["ops"], capsys)
    assert code == 0 and OP in out and TARGET in out


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_discovery_finds_the_method_and_the_binder_takes_its_signature(version, request):
    """Gemma3Attention.forward_native(self, positions, hidden_states, position_embeddings, forward_batch, **kwargs):
    found where SGLang defines it, and bound by name (expand reads the four)."""
    import ast

    from astra_sglang.patch.adapters import Binder
    from astra_sglang.patch.discover import discover_for_specs
    from sglang_source import _class, _sglang_root

    root = _sglang_root(version, request)
    disc = discover_for_specs([SPEC], roots={"sglang": root})
    found = {(s.kind, s.module, s.local_name) for s in disc.for_op(OP)}
    assert ("definition", "sglang.srt.models.gemma3_causal", "Gemma3Attention.forward_native") in found
    cls = _class(root, "srt/models/gemma3_causal.py", "Gemma3Attention")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward_native")
    stub = ast.FunctionDef(name="forward_native", args=fn.args, body=[ast.Pass()], decorator_list=[], returns=None,
                           type_params=[])
    ns = {"torch": torch, "Tuple": object, "ForwardBatch": object}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[])), "gemma3", "exec"), ns)
    binder = Binder(ns["forward_native"], op_part(OP, "adapter").ADAPTER, SPEC)
    assert binder.ok, binder.problem


# ------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.nvcc
def test_kernel_is_bit_identical_to_sglang_s_torch_sequence(tmp_path, capsys):
    """A GPU with SGLang installed: the kernel adds its squares in the order torch's reduce kernel adds the norm's
    mean (kernel.cu, Layout), so every output of check (edge shapes either side of torch's 16-row switch, decode
    and prefill rows, bf16 and fp16) equals production's in every bit (112 of 112 on the H200, 2026-11-29)."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("needs SGLang installed: production is its torch sequence")
    code, _, err = run_cli(["extract", OP, "--variant", "installed", "--out", str(tmp_path), "--no-build"], capsys)
    assert code == 0, err
    kernel = Path(op_part(OP, "spec").__file__).with_name("kernel.cu")
    out = tmp_path / "check.json"
    code, _, err = run_cli(["check", OP, "--workspace", str(tmp_path / OP), "--candidate", str(kernel),
                            "--dtype", "bf16,fp16", "--json", str(out)], capsys)
    assert code == 0, err
    same = [d for d in json.loads(out.read_text())["details"] if d.get("identical") is not None]
    assert same and all(d["identical"] == 1.0 for d in same), [
        (d["shape"], d["dtype"], d["tensor"], d["identical"]) for d in same if d["identical"] != 1.0]


@pytest.mark.gpu
@pytest.mark.nvcc
def test_kernel_writes_q_out_as_it_wrote_q_in_place(tmp_path, monkeypatch):
    """A GPU: q_out apart and q_out = q (ASTRA_GQKR_Q_OUT=0) write the same q bit for bit, q untouched, k equal
    (tests/q_out_self_check.py); every edge shape, a decode and a prefill row."""
    from q_out_self_check import assert_q_out_is_q_in_place

    rows = [(2, 16, 8, 256, 8192, 8192, 4096), (300, 8, 4, 256, 4096, 4096, 2048)]
    assert_q_out_is_q_in_place(SPEC, tmp_path, monkeypatch, rows)
