"""gate_up_gelu (kernels/gate_up_gelu/): gate_up_silu's fused gate_up GEMV with GELU-and-mul (erf) in its epilogue,
replacing Gemma-1's GemmaMLP.forward at 1-2 decode tokens, then calling SGLang's own down_proj. Off by default until
a GPU has run it. On CPU: the spec (ABI, the Gemma-1 corpus, the fp64 reference with the exact erf and g, u and the
activation rounded as SGLang stores them) and the harness on its edge shapes; the installed variant's facts in
sglang 0.5.17 and 0.5.23 and the installed baseline running SGLang's two steps; the adapter's routing with stand-in
SGLang modules (GemmaMLP only, GeluAndMul's approximate "none"); the patched forward through the real patch machinery;
an AST guard on the replaced forward in both versions; the shipped kernel's sm_90a build (no spills, the erf
epilogue, otherwise gate_up_gelu_tanh's kernel) and static checks; `astra-sglang ops`.
gate_up_gelu_tanh's tests (whose stand-ins this file reuses) and gate_up_silu's cover the shared helpers.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import ast
import json

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import run_cli  # noqa: E402
from sglang_source import _class, _method, _sglang_root  # noqa: E402  (the real sources' classes and methods)
from test_op_gate_up_gelu_tanh import (_gelu_mul_rounded, _stub_activation, _stub_models,  # noqa: E402,F401
                                       assert_no_spills, assert_shipped_kernel_builds, gemma_mlp,
                                       run_patched_gemma_mlp)
from test_op_gate_up_silu import assert_extract_installed  # noqa: E402

OP = "gate_up_gelu"
SPEC, AD = get_op(OP), op_part(OP, "adapter")
A = AD.ADAPTER
TARGET = "sglang.srt.models.gemma:GemmaMLP.forward"


def _sglang_act(x, weight):
    """SGLang's two steps: gate_up_proj's F.linear (its output in the dtype), then gelu_and_mul."""
    return _gelu_mul_rounded(torch.nn.functional.linear(x, weight), "none")


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_symbols_and_what_it_replaces():
    gus = get_op("gate_up_silu")
    assert SPEC.symbol == "astra_gate_up_gelu"
    assert SPEC.abi == gus.abi and SPEC.dim_names == gus.dim_names and SPEC.edge_shapes == gus.edge_shapes
    assert SPEC.replaces == (TARGET,) and SPEC.fuses == ()
    assert [v.name for v in SPEC.variants] == ["installed"] and SPEC.variant("installed").callable == TARGET
    assert SPEC.variant("installed").extra_flags == ("--use_fast_math",)  # production's JIT build flags
    assert SPEC.tolerance == gus.tolerance and "FUSED" in SPEC.summary


def test_profile_attributes_astra_s_kernel_to_this_op_only():
    from astra_sglang.e2e.attribution import classify

    m = classify("void astra_gug::(anonymous namespace)::gug_gemv_kernel<__nv_bfloat16, 1>(...)", "gelu", gemma=True)
    assert (m.op, m.astra) == (OP, True), m
    # gate_up_gelu_tanh's namespace is not this op's, and SGLang's kGELU kernel in a Gemma-1 stays gelu_and_mul's
    assert classify("void astra_gugt::(anonymous namespace)::gugt_gemv_kernel<__half, 1>(...)",
                    "gelu_pytorch_tanh", gemma=True).op == "gate_up_gelu_tanh"
    assert classify("void act_and_mul_kernel<__nv_bfloat16, (ActivationKind)1, true, false>(...)", "gelu",
                    gemma=True).op == "gelu_and_mul"


def test_corpus_is_every_gemma_1_mlp_at_one_and_two_tokens():
    dims = [s.dims for s in SPEC.corpus]
    assert dims == [(1, 2048, 16384), (2, 2048, 16384), (1, 3072, 24576), (2, 3072, 24576)]  # Gemma-1 2B, 7B
    assert {s.tags[0] for s in SPEC.corpus} == {"decode"}
    # gate_up_silu's rule: an intermediate wider than the widest measured to win at 2 tokens stays SGLang's there
    assert [d for d in dims if A.kept_by_sglang(d)] == [(2, 3072, 24576)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dist", ["normal", "outlier"])
def test_reference_is_the_exact_erf_gelu_with_sglang_s_roundings(dtype, dist):
    dims = (2, 256, 24)
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(0), dist=dist, device="cpu")
    ref = SPEC.reference(inp, dims, {})["out"]
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    gu = (inp["x"].double() @ inp["weight"].double().t()).to(inp["x"].dtype)
    want = _gelu_mul_rounded(gu, "none").double()
    assert (ref - want).abs().max() <= 0.02 * want.abs().max()
    td = inp["x"].dtype
    gu64 = inp["x"].double() @ inp["weight"].double().t()
    g, u = gu64[:, :24].to(td).double(), gu64[:, 24:].to(td).double()
    assert torch.equal(ref, (0.5 * g * (1 + torch.erf(g / 2 ** 0.5)) * u).to(td).double())
    assert not torch.equal(ref, get_op("gate_up_gelu_tanh").reference(inp, dims, {})["out"])


def test_harness_runs_every_edge_shape_on_cpu():
    from reference_harness import run_edge_cases_on_cpu

    run_edge_cases_on_cpu(SPEC)


# ------------------------------------------------------------------------------------------ installed variant
@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, request):
    assert_extract_installed(OP, TARGET, which, tmp_path, capsys, request)


def test_installed_impl_runs_sglang_s_two_steps(monkeypatch):
    from astra_sglang.harness.installed import InstalledImpl

    act = _stub_activation(monkeypatch)
    mlps = _stub_models(monkeypatch)
    impl = InstalledImpl(TARGET, SPEC)
    assert impl.fn is mlps["gemma"].forward and not impl.returns_outputs
    t = SPEC.make_inputs((2, 64, 16), "bf16", torch.Generator().manual_seed(1), device="cpu")
    t["out"].zero_()
    impl(t, (2, 64, 16), "bf16", {})
    assert act.kernels == ["gelu_and_mul"] and torch.equal(t["out"], _sglang_act(t["x"], t["weight"]))


# ------------------------------------------------------------------------------------------ the adapter's routing
def test_expand_takes_a_decode_gemma_1_mlp_without_work_and_returns_what_sglang_s_forward_returns(gemma_mlp):
    mlp = gemma_mlp.make(kind="gemma", approximate="none")
    x = torch.randn(2, 64).to(torch.bfloat16)
    c = A.expand({"self": mlp, "x": x})
    assert not isinstance(c, str), c
    assert mlp.gate_up_proj.calls == 0 and mlp.down_proj.calls == []  # no work before the kernel
    views, dims = A.normalize(c)
    assert dims == (2, 64, 128) and views["weight"] is mlp.gate_up_proj.weight and views["x"] is x
    A.sequence(c)  # SGLang's result: F.linear, then gelu_and_mul
    act = _sglang_act(x, mlp.gate_up_proj.weight)
    assert torch.equal(c["out"], act) and gemma_mlp.act.kernels == ["gelu_and_mul"]
    y = A.returns(c)  # GemmaMLP's forward calls down_proj(x), no keywords
    assert torch.equal(y, torch.nn.functional.linear(act, mlp.down_proj.weight)) and mlp.down_proj.calls == [{}]


@pytest.mark.parametrize("why,make_kw", [
    ("tokens", {"kind": "gemma", "approximate": "none", "x": (3, 64)}),
    ("approximate is 'tanh'", {"kind": "gemma", "approximate": "tanh"}),  # gelu_tanh_and_mul's MLP, not this op's
    ("not SGLang's GemmaMLP", {"kind": "gemma2", "approximate": "none"}),
    ("gelu_and_mul takes another kernel", {"kind": "gemma", "approximate": "none", "inter": 100}),
])
def test_expand_declines_before_any_work(gemma_mlp, why, make_kw):
    x_shape = make_kw.pop("x", (1, 64))
    mlp = gemma_mlp.make(**make_kw)
    r = A.expand({"self": mlp, "x": torch.randn(*x_shape).to(torch.bfloat16)})
    assert isinstance(r, str) and why in r, r
    assert mlp.gate_up_proj.calls == 0 and mlp.down_proj.calls == [] and gemma_mlp.act.calls == []


def test_on_by_default_and_binds_gemma_mlp_s_forward():
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.adapters import Binder, adapter_mismatch
    from astra_sglang.patch.config import default_ops, parse_ops

    def forward(self, x):  # GemmaMLP.forward's signature
        raise AssertionError("not called")

    assert AD.DEFAULT_OFF == ""   # on since its Gemma-7B step A/B (2026-12-01)
    known = patchable_ops()
    assert op_part("gelu_and_mul", "adapter") and OP in known
    assert OP in parse_ops("all", known, default_ops(known)) and OP not in parse_ops(f"all,-{OP}", known,
                                                                                    default_ops(known))
    assert adapter_mismatch(SPEC, A) is None and A.returned == () and Binder(forward, A, SPEC).ok


def test_astra_sglang_ops_lists_it_on(capsys):
    code, out, _ = run_cli(["ops", "--json"], capsys)
    assert code == 0
    row = {r["op"]: r for r in json.loads(out)}[OP]
    assert row["kernel"] and row["patch"] and row["validate"] and row["missing"] == []
    assert row["extract"] == ["installed"] and row["default_off"] == AD.DEFAULT_OFF


def test_layer_imports_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)


# ------------------------------------------------------------------------------------------ real SGLang sources
@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_replaced_forward_is_the_sequence_the_op_fuses_then_down_proj(version, request):
    root = _sglang_root(version, request)
    cls = _class(root, "srt/models/gemma.py", "GemmaMLP")
    fn = _method(cls, "forward")
    assert [a.arg for a in fn.args.args] == ["self", "x"]
    assert [ast.unparse(n) for n in fn.body] == ["gate_up, _ = self.gate_up_proj(x)", "x = self.act_fn(gate_up)",
                                                 "x, _ = self.down_proj(x)", "return x"]
    init = ast.unparse(_method(cls, "__init__"))
    assert "self.gate_up_proj = MergedColumnParallelLinear(" in init and "self.act_fn = GeluAndMul('none')" in init
    assert "[intermediate_size] * 2" in init and init.count("bias=False") == 2


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_what_the_adapter_reads_of_gelu_and_mul_holds(version, request):
    root = _sglang_root(version, request)
    impl = ast.unparse(_method(_class(root, "srt/layers/activation.py", "GeluAndMul"), "_forward_impl"))
    assert "elif self.approximate == 'none':\n        gelu_and_mul(x, out)" in impl
    act_src = (root / "srt/layers/activation.py").read_text()
    assert "def gelu_and_mul(input: torch.Tensor, out=None) -> torch.Tensor:" in act_src  # what `sequence` calls
    # the JIT kernel's kGELU expression the epilogue reproduces
    jit = (root / "kernels/jit/csrc/elementwise/activation.cuh").read_text()
    assert "return x_f32 * (0.5f * (1.0f + erff(x_f32 * kSqrt1Over2)));" in jit
    assert "out[i] = device::cast<T>(apply_activation_f32<kAct>(gate_f32) * up_f32);" in jit


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_discovery_finds_gemma_mlp_s_forward_and_the_binder_takes_its_signature(version, request):
    from astra_sglang.patch.adapters import Binder
    from astra_sglang.patch.discover import discover_for_specs
    from sglang_signatures import real_function

    root = _sglang_root(version, request)
    found = {(s.kind, s.module, s.local_name) for s in discover_for_specs([SPEC], roots={"sglang": root}).for_op(OP)}
    assert ("definition", "sglang.srt.models.gemma", "GemmaMLP.forward") in found
    assert Binder(real_function(root.parent, "sglang.srt.models.gemma", "forward"), A, SPEC).ok


# ------------------------------------------------------------------------------------------ the patched forward
def test_the_patched_forward_runs_the_kernel_then_down_proj_and_leaves_prefill_to_sglang(tmp_path):
    out = run_patched_gemma_mlp(OP, tmp_path, "sglang.srt.models.gemma", "GemmaMLP", "none")
    assert (out["calls"], out["fallbacks"]) == (1, 1) and out["err"] <= 0.02 * out["scale"], out


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_is_gate_up_gelu_tanh_s_but_the_epilogue_and_builds(tmp_path, monkeypatch):
    from astra_sglang.registry import shipped_kernel

    text = shipped_kernel(OP).read_text()
    assert "namespace astra_gug {" in text and "astra_gugt" not in text
    # gate_up_gelu_tanh's kernel but for the epilogue: SGLang's kGELU expression
    assert "const float gelu = g * (0.5f * (1.0f + erff(g * kSqrt1Over2)));" in text
    assert "return from_f<T>(gelu * u);" in text and "tanhf" not in text
    gugt = shipped_kernel("gate_up_gelu_tanh").read_text()
    body = text[text.index("__device__ __forceinline__ void unpack8"):text.index("extern \"C\"")]
    assert body.replace("gug", "gugt").replace("GUG", "GUGT").replace("gelu_mul", "gelu_tanh_mul") in gugt
    assert_shipped_kernel_builds(OP, tmp_path, monkeypatch)


@pytest.mark.nvcc
@pytest.mark.parametrize("pairs", [2, 4])
def test_no_register_spills_at_sm_90a(pairs, tmp_path):
    assert_no_spills(OP, tmp_path, defines=(f"-DASTRA_GUG_PAIRS={pairs}",))
