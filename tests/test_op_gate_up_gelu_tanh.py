"""gate_up_gelu_tanh (kernels/gate_up_gelu_tanh/): gate_up_silu's fused gate_up GEMV with GELU(tanh)-and-mul in its
epilogue, replacing Gemma2MLP.forward / Gemma3MLP.forward at 1-2 decode tokens, then calling SGLang's own down_proj.
On CPU: the spec (ABI, the Gemma corpus, the fp64 reference with g, u and the activation rounded as SGLang stores
them) and the harness on its edge shapes; the installed variant's facts in sglang 0.5.17 and 0.5.23 and the installed
baseline running SGLang's two steps; the adapter's routing with stand-in SGLang modules (every decline before any
work, GeluAndMul's approximate, TP > 1 taken, down_proj called as Gemma's forward calls it); the patched forward
through the real patch machinery; an AST guard on the replaced forwards in both versions; the shipped kernel's
sm_90a build (no spills, tanh.approx.f32 as production's fast-math tanhf) and static checks; `astra-sglang ops`.
gate_up_silu's tests cover the helpers both ops share (kernels/gate_up_silu/adapter.py's checks of gate_up_proj).

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from sglang_source import _class, _method, _sglang_root  # noqa: E402  (the real sources' classes and methods)
from test_op_gate_up_silu import (_Down, _GateUp, _lora_like, _sp_on, assert_extract_installed,  # noqa: E402
                                  assert_listed_complete, assert_on_by_default_and_binds)

OP = "gate_up_gelu_tanh"
SPEC, AD = get_op(OP), op_part(OP, "adapter")
A, GUS_AD = AD.ADAPTER, op_part("gate_up_silu", "adapter")  # the shared helpers: DEVICES is gate_up_silu's
TARGETS = ("sglang.srt.models.gemma2:Gemma2MLP.forward", "sglang.srt.models.gemma3_causal:Gemma3MLP.forward")


def _gelu_mul_rounded(gate_up, approximate="tanh"):
    """What SGLang's gelu_tanh_and_mul stores: fp32 gelu_tanh(g) * u rounded to the dtype (approximate "none": what its
    gelu_and_mul stores, gate_up_gelu's)."""
    g, u = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.gelu(g, approximate=approximate) * u).to(gate_up.dtype)


def _sglang_act(x, weight):
    """SGLang's two steps: gate_up_proj's F.linear (its output in the dtype), then gelu_tanh_and_mul."""
    return _gelu_mul_rounded(torch.nn.functional.linear(x, weight))


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_symbols_and_what_it_replaces():
    gus = get_op("gate_up_silu")
    assert SPEC.symbol == "astra_gate_up_gelu_tanh"
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_gate_up_gelu_tanh(const void* x, const void* weight, void* out, '
        "int64_t num_tokens, int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream)")
    assert SPEC.abi == gus.abi and SPEC.dim_names == gus.dim_names and SPEC.edge_shapes == gus.edge_shapes
    assert SPEC.replaces == TARGETS and SPEC.fuses == ()
    assert [v.name for v in SPEC.variants] == ["installed"] and SPEC.variant("installed").callable == TARGETS[0]
    assert SPEC.variant("installed").extra_flags == ("--use_fast_math",)  # production's tanhf is tanh.approx.f32
    assert SPEC.tolerance == gus.tolerance and "FUSED" in SPEC.summary


def test_profile_attributes_astra_s_kernel_to_this_op_only():
    from astra_sglang.e2e.attribution import classify

    for name in ("void astra_gugt::(anonymous namespace)::gugt_gemv_kernel<__nv_bfloat16, 1>(...)",
                 "void astra_gugt::(anonymous namespace)::gugt_scalar_kernel<__half>(...)"):
        m = classify(name, "gelu_pytorch_tanh", gemma=True)
        assert (m.op, m.astra) == (OP, True), m
    assert classify("void astra_gus::(anonymous namespace)::gus_gemv_kernel<__half, 1>(...)").op == "gate_up_silu"
    # SGLang's activation kernel in a Gemma stays gelu_tanh_and_mul's
    assert classify("void act_and_mul_kernel<__nv_bfloat16, (ActivationKind)2, true, false>(...)",
                    "gelu_pytorch_tanh", gemma=True).op == "gelu_tanh_and_mul"


def test_corpus_is_every_gemma_mlp_at_one_and_two_tokens():
    dims = {s.dims for s in SPEC.corpus}
    for h, i in ((2304, 9216), (3584, 14336), (4608, 36864), (4608, 18432), (4608, 9216),  # Gemma-2 2B, 9B, 27B
                 (1152, 6912), (2560, 10240), (3840, 15360), (5376, 21504)):  # Gemma-3 1B, 4B, 12B, 27B
        assert (1, h, i) in dims and (2, h, i) in dims
    assert {s.dims[0] for s in SPEC.corpus} == {1, 2} and {s.tags[0] for s in SPEC.corpus} == {"decode"}
    assert all(h % 8 == 0 and i % 8 == 0 for _, h, i in dims)
    # every corpus row is taken but the one measured slower (Gemma-2-27B at 2 tokens: MAX_INTER_AT_2_TOKENS)
    assert [s.dims for s in SPEC.corpus if A.kept_by_sglang(s.dims)] == [(2, 4608, 36864)]
    assert any(s.source == "gemma-2-27b tp4" for s in SPEC.corpus)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dist", ["normal", "outlier"])
def test_reference_rounds_g_u_and_the_activation_like_sglang(dtype, dist):
    dims = (2, 256, 24)
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(0), dist=dist, device="cpu")
    ref = SPEC.reference(inp, dims, {})["out"]
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    gu = (inp["x"].double() @ inp["weight"].double().t()).to(inp["x"].dtype)
    want = _gelu_mul_rounded(gu).double()
    assert (ref - want).abs().max() <= 0.02 * want.abs().max()
    # the reference's own steps, exactly: g and u rounded, the exact fp64 tanh GELU, the product rounded
    td = inp["x"].dtype
    gu64 = inp["x"].double() @ inp["weight"].double().t()
    g, u = gu64[:, :24].to(td).double(), gu64[:, 24:].to(td).double()
    gelu = 0.5 * g * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (g + 0.044715 * g ** 3)))
    assert torch.equal(ref, (gelu * u).to(td).double())
    assert torch.equal(SPEC.reference({n: v.double() for n, v in inp.items()}, dims, {})["out"], ref)
    assert not torch.equal(ref, get_op("gate_up_silu").reference(inp, dims, {})["out"])


def test_harness_runs_every_edge_shape_on_cpu():
    from reference_harness import run_edge_cases_on_cpu

    run_edge_cases_on_cpu(SPEC)


# ------------------------------------------------------------------------------------------ installed variant
@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, request):
    assert_extract_installed(OP, TARGETS[0], which, tmp_path, capsys, request)


def _stub_activation(monkeypatch):
    """A stand-in sglang.srt.layers.activation: GeluAndMul (approximate, dispatch fixed at construction, as 0.5.17's),
    SiluAndMul, and gelu_tanh_and_mul / gelu_and_mul(input, out) computing SGLang's rounded activations (`calls`:
    the input shapes, `kernels`: which of the two ran; gate_up_gelu's tests use it too)."""
    calls, kernels = [], []

    def gelu_tanh_and_mul(input, out=None):
        calls.append(tuple(input.shape))
        kernels.append("gelu_tanh_and_mul")
        return out.copy_(_gelu_mul_rounded(input))

    def gelu_and_mul(input, out=None):
        calls.append(tuple(input.shape))
        kernels.append("gelu_and_mul")
        return out.copy_(_gelu_mul_rounded(input, "none"))

    mod = types.ModuleType("sglang.srt.layers.activation")

    class GeluAndMul:
        def __init__(self, approximate="tanh"):
            self.approximate, self.is_torch_compile = approximate, False
            self._forward_method = self.forward_cuda

        def forward_cuda(self, x):  # _forward_impl's dispatch
            out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype)
            return (gelu_tanh_and_mul if self.approximate == "tanh" else gelu_and_mul)(x, out)

        def forward_native(self, x):
            raise AssertionError("not the CUDA path")

    class SiluAndMul(GeluAndMul):
        pass

    mod.GeluAndMul, mod.SiluAndMul, mod.calls, mod.kernels = GeluAndMul, SiluAndMul, calls, kernels
    mod.gelu_tanh_and_mul, mod.gelu_and_mul = gelu_tanh_and_mul, gelu_and_mul
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def _stub_models(monkeypatch):
    """Stand-in sglang.srt.models.gemma2 / .gemma3_causal / .gemma / .llama with the MLP classes the adapters tell
    apart (gemma: Gemma-1's GemmaMLP, gate_up_gelu's)."""
    mods = {}
    for name, cls in (("gemma2", "Gemma2MLP"), ("gemma3_causal", "Gemma3MLP"), ("gemma", "GemmaMLP"),
                      ("llama", "LlamaMLP")):
        m = types.ModuleType(f"sglang.srt.models.{name}")

        def forward(self, x):
            raise AssertionError("the adapter runs instead")

        setattr(m, cls, type(cls, (), {"forward": forward}))
        monkeypatch.setitem(sys.modules, m.__name__, m)
        mods[name] = getattr(m, cls)
    return mods


def test_installed_impl_runs_sglang_s_two_steps(monkeypatch):
    from astra_sglang.harness.installed import InstalledImpl

    act = _stub_activation(monkeypatch)
    mlps = _stub_models(monkeypatch)
    impl = InstalledImpl(TARGETS[0], SPEC)
    assert impl.fn is mlps["gemma2"].forward and not impl.returns_outputs
    t = SPEC.make_inputs((2, 64, 16), "bf16", torch.Generator().manual_seed(1), device="cpu")
    t["out"].zero_()
    impl(t, (2, 64, 16), "bf16", {})
    assert act.calls == [(2, 32)] and torch.equal(t["out"], _sglang_act(t["x"], t["weight"]))


# ------------------------------------------------------------------------------------------ the adapter's routing
@pytest.fixture
def gemma_mlp(sglang_unquant_standin, monkeypatch):
    """Stand-in SGLang modules the adapter reads, CPU tensors allowed, and a factory of Gemma MLP stand-ins."""
    monkeypatch.setattr(GUS_AD, "DEVICES", ("cuda", "cpu"))
    act_mod = _stub_activation(monkeypatch)
    mlps = _stub_models(monkeypatch)
    lin = types.ModuleType("sglang.srt.layers.linear")
    lin.MergedColumnParallelLinear = type("MergedColumnParallelLinear", (_GateUp,), {})
    monkeypatch.setitem(sys.modules, lin.__name__, lin)
    monkeypatch.delitem(sys.modules, "sglang.kernels.fused_op", raising=False)

    def make(hidden=64, inter=128, dtype=torch.bfloat16, kind="gemma2", gate_up_cls=None, approximate="tanh"):
        gate_up = (gate_up_cls or lin.MergedColumnParallelLinear)()
        gate_up.weight = (torch.randn(2 * inter, hidden) / hidden ** 0.5).to(dtype)
        gate_up.bias, gate_up.gather_output, gate_up.calls = None, False, 0
        gate_up.quant_method, gate_up.tp_size = sglang_unquant_standin.UnquantizedLinearMethod(), 1
        mlp = mlps[kind]()
        mlp.gate_up_proj, mlp.act_fn = gate_up, act_mod.GeluAndMul(approximate)
        mlp.down_proj = _Down((torch.randn(hidden, inter) / inter ** 0.5).to(dtype))
        return mlp

    return types.SimpleNamespace(make=make, act=act_mod, unquant=sglang_unquant_standin)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3_causal"])
def test_expand_takes_a_decode_gemma_mlp_without_work_and_returns_what_sglang_s_forward_returns(gemma_mlp, kind):
    mlp = gemma_mlp.make(kind=kind)
    x = torch.randn(2, 64).to(torch.bfloat16)
    c = A.expand({"self": mlp, "x": x})
    assert not isinstance(c, str), c
    assert mlp.gate_up_proj.calls == 0 and mlp.down_proj.calls == []  # no work before the kernel
    views, dims = A.normalize(c)
    assert dims == (2, 64, 128) and views["weight"] is mlp.gate_up_proj.weight and views["x"] is x
    A.sequence(c)  # SGLang's result: F.linear, then gelu_tanh_and_mul
    act = _sglang_act(x, mlp.gate_up_proj.weight)
    assert torch.equal(c["out"], act) and gemma_mlp.act.calls == [(2, 256)]
    y = A.returns(c)  # Gemma's forward calls down_proj(x), no keywords
    assert torch.equal(y, torch.nn.functional.linear(act, mlp.down_proj.weight)) and mlp.down_proj.calls == [{}]
    ref = SPEC.reference(views, dims, {})["out"]
    assert (c["out"].double() - ref).abs().max() <= 0.02 * ref.abs().max()


def test_tensor_parallel_is_taken(gemma_mlp):
    mlp = gemma_mlp.make(kind="gemma3_causal", inter=64)  # a rank's shard of a 128-wide MLP at TP 2
    mlp.gate_up_proj.tp_size = 2
    mlp.down_proj.tp_size, mlp.down_proj.reduce_results = 2, False  # 0.5.23's Gemma3MLP(reduce_results=False)
    c = A.expand({"self": mlp, "x": torch.randn(1, 64).to(torch.bfloat16)})
    assert not isinstance(c, str) and A.normalize(c)[1] == (1, 64, 64)


def _act(cls_name, approximate="tanh"):
    def edit(m):
        m.act_fn = getattr(sys.modules["sglang.srt.layers.activation"], cls_name)(approximate)
    return edit


@pytest.mark.parametrize("why,make_kw,edit,x_shape,x_dtype", [
    ("tokens", {}, None, (3, 64), torch.bfloat16),
    ("2-D", {}, None, (1, 1, 64), torch.bfloat16),
    ("not SGLang's Gemma2MLP / Gemma3MLP", {"kind": "llama"}, None, (1, 64), torch.bfloat16),
    ("approximate is 'none'", {}, _act("GeluAndMul", "none"), (1, 64), torch.bfloat16),
    ("not SGLang's GeluAndMul", {}, _act("SiluAndMul"), (1, 64), torch.bfloat16),
    ("torch.compile", {}, lambda m: setattr(m.act_fn, "is_torch_compile", True), (1, 64), torch.bfloat16),
    ("forward_native", {}, lambda m: setattr(m.act_fn, "_forward_method", m.act_fn.forward_native), (1, 64),
     torch.bfloat16),
    ("in_features 60 is not a multiple of 8", {"hidden": 60}, None, (1, 60), torch.bfloat16),
    ("bias", {}, lambda m: setattr(m.gate_up_proj, "bias", torch.zeros(256)), (1, 64), torch.bfloat16),
    ("down_proj", {}, lambda m: setattr(m, "down_proj", None), (1, 64), torch.bfloat16),
    ("gathers", {}, lambda m: setattr(m.gate_up_proj, "gather_output", True), (1, 64), torch.bfloat16),
    ("plain MergedColumnParallelLinear", {"gate_up_cls": _lora_like()}, None, (1, 64), torch.bfloat16),
    ("sequence parallel", {}, _sp_on, (1, 64), torch.bfloat16),
    ("gelu_tanh_and_mul takes another kernel", {"inter": 100}, None, (1, 64), torch.bfloat16),
    ("fp16 / bf16", {"dtype": torch.float32}, None, (1, 64), torch.float32),
    ("gate_up_proj: ", {}, lambda m: setattr(m.gate_up_proj, "quant_method", object()), (1, 64), torch.bfloat16),
])
def test_expand_declines_before_any_work(gemma_mlp, why, make_kw, edit, x_shape, x_dtype):
    mlp = gemma_mlp.make(**make_kw)
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    if edit:
        edit(mlp)
    r = A.expand({"self": mlp, "x": torch.randn(*x_shape).to(x_dtype)})
    assert isinstance(r, str) and why in r, r
    assert gate_up.calls == 0 and down.calls == [] and gemma_mlp.act.calls == []


def test_the_shape_rule_and_the_precheck_are_gate_up_silu_s():
    assert A.max_tokens == 2 and "tokens" in A.kept_by_sglang((3, 3584, 14336))
    assert "multiple of 8" in A.kept_by_sglang((1, 1002, 40))
    assert "gelu_tanh_and_mul" in A.kept_by_sglang((1, 3584, 1004))
    # Gemma-2-27B's intermediate lost at 2 tokens (0.984x in context): kept there, taken at 1 token
    assert "21504" in A.kept_by_sglang((2, 4608, 36864)) and A.kept_by_sglang((1, 4608, 36864)) is None
    assert A.kept_by_sglang((2, 5376, 21504)) is None
    assert "tokens" in A.precheck((None, torch.randn(3, 64)), {}) and A.precheck((None, torch.randn(2, 64)), {}) is None


def test_on_by_default_and_binds_both_forwards():
    def forward(self, x):  # both Gemma MLPs' signature
        raise AssertionError("not called")

    assert_on_by_default_and_binds(OP, forward)


def test_astra_sglang_ops_lists_it(capsys):
    assert_listed_complete(OP, capsys)


def test_layer_imports_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)


# ------------------------------------------------------------------------------------------ real SGLang sources
_GEMMA = (("srt/models/gemma2.py", "Gemma2MLP"), ("srt/models/gemma3_causal.py", "Gemma3MLP"))


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_replaced_forwards_are_the_sequence_the_op_fuses_then_down_proj(version, request):
    root = _sglang_root(version, request)
    for rel, cls in _GEMMA:
        fn = _method(_class(root, rel, cls), "forward")
        assert [a.arg for a in fn.args.args] == ["self", "x"]
        assert [ast.unparse(n) for n in fn.body] == ["gate_up, _ = self.gate_up_proj(x)", "x = self.act_fn(gate_up)",
                                                     "x, _ = self.down_proj(x)", "return x"]
        init = ast.unparse(_method(_class(root, rel, cls), "__init__"))
        assert "self.gate_up_proj = MergedColumnParallelLinear(" in init and "self.act_fn = GeluAndMul()" in init
        assert "[intermediate_size] * 2" in init and init.count("bias=False") == 2
    # Gemma-4's dense MLP is Gemma3MLP (the same class, patched once)
    assert "from sglang.srt.models.gemma3_causal import Gemma3MLP" in (root / "srt/models/gemma4_causal.py").read_text()


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_what_the_adapter_reads_of_gelu_and_mul_holds(version, request):
    root = _sglang_root(version, request)
    gelu = _class(root, "srt/layers/activation.py", "GeluAndMul")
    assert ast.unparse(_method(gelu, "__init__").args) == "self, approximate='tanh'"
    assert [ast.unparse(n) for n in _method(gelu, "forward_cuda").body] == ["return self._forward_impl(x)"]
    impl = ast.unparse(_method(gelu, "_forward_impl"))
    assert "out = torch.empty(output_shape, dtype=x.dtype, device=x.device)" in impl
    assert "if self.approximate == 'tanh':\n        gelu_tanh_and_mul(x, out)" in impl
    act_src = (root / "srt/layers/activation.py").read_text()
    assert "def gelu_tanh_and_mul(input: torch.Tensor, out=None) -> torch.Tensor:" in act_src  # what `sequence` calls
    # the JIT kernel's kGELUTanh expression the epilogue reproduces (tanhf under --use_fast_math)
    jit = (root / "kernels/jit/csrc/elementwise/activation.cuh").read_text()
    assert ("const float cdf = 0.5f * (1.0f + tanhf(kGeluTanhBeta * (x_f32 + kGeluTanhAlpha * x_f32 * x_f32 * "
            "x_f32)));\n    return x_f32 * cdf;") in jit
    assert "out[i] = device::cast<T>(apply_activation_f32<kAct>(gate_f32) * up_f32);" in jit


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_discovery_finds_both_gemma_forwards_and_the_binder_takes_their_signatures(version, request):
    from astra_sglang.patch.adapters import Binder
    from astra_sglang.patch.discover import discover_for_specs
    from sglang_signatures import real_function

    root = _sglang_root(version, request)
    found = {(s.kind, s.module, s.local_name) for s in discover_for_specs([SPEC], roots={"sglang": root}).for_op(OP)}
    assert ("definition", "sglang.srt.models.gemma2", "Gemma2MLP.forward") in found
    assert ("definition", "sglang.srt.models.gemma3_causal", "Gemma3MLP.forward") in found
    for mod in ("sglang.srt.models.gemma2", "sglang.srt.models.gemma3_causal"):
        assert Binder(real_function(root.parent, mod, "forward"), A, SPEC).ok


# ------------------------------------------------------------------------------------------ the patched forward
def run_patched_gemma_mlp(op, tmp_path, module="sglang.srt.models.gemma2", cls="Gemma2MLP", approximate="tanh"):
    """Through the real patch machinery (stand-in SGLang modules, a CPU stand-in backend, a fresh interpreter): `op`
    patched into `module`.`cls` (a Gemma MLP whose act_fn is GeluAndMul(approximate)); a prefill call runs the MLP's
    own forward; a 1-token call runs the op's kernel, then down_proj once. The counters and the 1-token error against
    the original forward come back (gate_up_gelu's test runs it on GemmaMLP)."""
    script = f'''
import sys, types
import torch
for p in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.quantization", "sglang.srt.models"):
    sys.modules.setdefault(p, types.ModuleType(p))
def module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m
seen = {{"act": 0, "down": 0, "gate_up": 0}}
Unq = type("UnquantizedLinearMethod", (), {{"apply": lambda self, layer, x, bias=None: torch.nn.functional.linear(
    x, layer.weight, bias)}})
module("sglang.srt.layers.quantization.unquant", UnquantizedLinearMethod=Unq)
def act_and_mul(approximate):
    def kernel(x, out=None):
        seen["act"] += 1
        k = x.shape[-1] // 2
        g = torch.nn.functional.gelu(x[:, :k].float(), approximate=approximate)
        return out.copy_((g * x[:, k:].float()).to(x.dtype))
    return kernel
gelu_tanh_and_mul, gelu_and_mul = act_and_mul("tanh"), act_and_mul("none")
class GeluAndMul:
    def __init__(self, approximate="tanh"):
        self.approximate, self.is_torch_compile, self._forward_method = approximate, False, self.forward_cuda
    def forward_cuda(self, x):
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype)
        return (gelu_tanh_and_mul if self.approximate == "tanh" else gelu_and_mul)(x, out)
    def __call__(self, x):
        return self._forward_method(x)
module("sglang.srt.layers.activation", GeluAndMul=GeluAndMul, gelu_tanh_and_mul=gelu_tanh_and_mul,
       gelu_and_mul=gelu_and_mul)
class Lin:
    def __init__(self, w, what):
        self.weight, self.bias, self.quant_method, self.gather_output, self.what = w, None, Unq(), False, what
    def __call__(self, x):
        seen[self.what] += 1
        return self.quant_method.apply(self, x), None
Merged = type("MergedColumnParallelLinear", (Lin,), {{}})
module("sglang.srt.layers.linear", MergedColumnParallelLinear=Merged)
class MLP:  # the 0.5.17 / 0.5.23 body of Gemma2MLP, Gemma3MLP and GemmaMLP
    def __init__(self, h, i):
        self.gate_up_proj = Merged((torch.randn(2 * i, h) / h ** 0.5).to(torch.bfloat16), "gate_up")
        self.act_fn = GeluAndMul({approximate!r})
        self.down_proj = Lin((torch.randn(h, i) / i ** 0.5).to(torch.bfloat16), "down")
    def forward(self, x):
        gate_up, _ = self.gate_up_proj(x)
        x = self.act_fn(gate_up)
        x, _ = self.down_proj(x)
        return x
MLP.__name__ = MLP.__qualname__ = {cls!r}
module({module!r}, **{{{cls!r}: MLP}})
from astra_sglang.registry import get_op, op_part
op_part("gate_up_silu", "adapter").DEVICES = ("cuda", "cpu")
spec = get_op("{op}")
class Cpu:  # a stand-in backend: the fp64 reference, rounded
    name, devices, dtypes, launched = "cpu", frozenset({{"cpu"}}), ("bf16", "fp16"), 0
    def launch(self, views, dims, dt, scalars):
        Cpu.launched += 1
        views["out"].copy_(spec.reference(views, dims, {{}})["out"].to(views["out"].dtype))
from astra_sglang.patch import apply_astra_kernels
from astra_sglang.patch.counters import totals
cdir = {str(tmp_path)!r}
apply_astra_kernels(["{op}"], backends={{"{op}": Cpu()}}, counter_dir=cdir, propagate=False, plan=False,
                    self_check="off")
mlp = MLP(64, 128)
y = mlp.forward(torch.randn(16, 64, dtype=torch.bfloat16))
assert y.shape == (16, 64) and Cpu.launched == 0 and seen == {{"act": 1, "down": 1, "gate_up": 1}}, seen
x1 = torch.randn(1, 64, dtype=torch.bfloat16)
y1 = mlp.forward(x1)
assert Cpu.launched == 1 and seen == {{"act": 1, "down": 2, "gate_up": 1}}, seen
err = (y1.float() - MLP.forward.__astra_original__(mlp, x1).float()).abs().max()
print(json.dumps({{"err": float(err), "scale": float(y1.float().abs().max()), **totals(cdir)["{op}"]}}))
'''
    r = subprocess.run([sys.executable, "-c", "import json\n" + script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_the_patched_forward_runs_the_kernel_then_down_proj_and_leaves_prefill_to_sglang(tmp_path):
    out = run_patched_gemma_mlp(OP, tmp_path)
    assert (out["calls"], out["fallbacks"]) == (1, 1) and out["err"] <= 0.02 * out["scale"], out


# ------------------------------------------------------------------------------------------ the shipped kernel
def assert_shipped_kernel_builds(op, tmp_path, monkeypatch):
    """op's shipped kernel passes the static checks, includes nothing of the repository, and its nvcc build exports
    the spec's symbol (gate_up_gelu's test asks the same)."""
    from astra_sglang.patch.apply import build_kernel
    from astra_sglang.registry import shipped_kernel
    from astra_sglang.static_checks import errors, scan_file

    text = shipped_kernel(op).read_text()
    assert not errors(scan_file(shipped_kernel(op), [])) and "#include \"" not in text
    assert get_op(op).c_signature().split("(")[0] in text
    if not shutil.which("nm"):
        pytest.skip("needs binutils nm")
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    nm = subprocess.run(["nm", "-D", "--defined-only", str(build_kernel(op, arch="sm_90"))], capture_output=True,
                        text=True)
    assert get_op(op).symbol in nm.stdout


def nvcc_shipped(op, *args, defines=()):
    """nvcc on op's shipped kernel with its sm_90a flags (the build check and bench use), plus `defines`."""
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.registry import shipped_kernel

    cmd = [shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", *kernel_flags(get_op(op), Arch(9, 0)), *defines,
           *args, str(shipped_kernel(op))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def assert_no_spills(op, tmp_path, defines=()):
    """ptxas -v on op's shipped kernel: every instance (2 dtypes x (4 token groups + the scalar path)) without a
    spill."""
    log = nvcc_shipped(op, "-Xptxas", "-v", "-c", "-o", str(tmp_path / "k.o"), defines=defines).stderr
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == 10 and all(s == ("0", "0") for s in spills), log


@pytest.mark.nvcc
def test_shipped_kernel_is_gate_up_silu_s_but_the_epilogue_and_builds(tmp_path, monkeypatch):
    from astra_sglang.registry import shipped_kernel

    text = shipped_kernel(OP).read_text()
    assert "namespace astra_gugt {" in text and "astra_gus" not in text
    # gate_up_silu's kernel but for the epilogue: SGLang's kGELUTanh expression
    assert "const float cdf = 0.5f * (1.0f + tanhf(kBeta * (g + kAlpha * g * g * g)));" in text
    assert "return from_f<T>(g * cdf * u);" in text and "__expf" not in text
    gus = shipped_kernel("gate_up_silu").read_text()
    body = text[text.index("__device__ __forceinline__ void unpack8"):text.index("extern \"C\"")]
    assert body.replace("gugt", "gus").replace("GUGT", "GUS").replace("gelu_tanh_mul", "silu_mul") in gus
    assert_shipped_kernel_builds(OP, tmp_path, monkeypatch)


@pytest.mark.nvcc
@pytest.mark.parametrize("pairs", [2, 4])
def test_no_register_spills_at_sm_90a_and_the_tanh_is_production_s(pairs, tmp_path):
    # --use_fast_math turns tanhf into the hardware tanh.approx.f32, as in SGLang's JIT build: one per kernel
    ptx = nvcc_shipped(OP, "-ptx", "-o", "-", defines=(f"-DASTRA_GUGT_PAIRS={pairs}",)).stdout
    assert ptx.count("tanh.approx.f32") == 10 and "ex2.approx" not in ptx
    assert_no_spills(OP, tmp_path, defines=(f"-DASTRA_GUGT_PAIRS={pairs}",))
