"""gate_up_silu (kernels/gate_up_silu/): the FUSED gate_up_proj GEMV + SiLU-and-mul epilogue of a dense MLP at 1-2
decode tokens, replacing LlamaMLP.forward / Qwen2MLP.forward and then calling SGLang's own down_proj. On CPU: the spec
(ABI, corpus, fp64 reference with g, u and the activation rounded as SGLang stores them) and the harness on its edge
shapes; the installed variant's facts in sglang 0.5.17 and 0.5.23 and the installed baseline running SGLang's two
steps; the adapter's routing with stand-in SGLang modules (every decline before any work, TP > 1 taken, each
forward's down_proj call reproduced); the patched forward through the real patch machinery; an AST guard on the
replaced forwards and what the adapter reads, in both versions; the shipped kernel's sm_90a build (no spills) and
static checks; `astra-sglang ops`.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import run_cli  # noqa: E402
from sglang_source import _class, _method, _sglang_root  # noqa: E402  (the real sources' classes and methods)

OP = "gate_up_silu"
SPEC = get_op(OP)
AD = op_part(OP, "adapter")
A = AD.ADAPTER
TARGETS = ("sglang.srt.models.llama:LlamaMLP.forward", "sglang.srt.models.qwen2:Qwen2MLP.forward")


def _silu_mul_rounded(gate_up):
    """What SGLang's silu_and_mul stores: fp32 silu(g) * u rounded to the dtype."""
    k = gate_up.shape[-1] // 2
    x = gate_up.float()
    return (torch.nn.functional.silu(x[:, :k]) * x[:, k:]).to(gate_up.dtype)


def _sglang_act(x, weight):
    """SGLang's two steps: gate_up_proj's F.linear (its output in the dtype), then silu_and_mul."""
    return _silu_mul_rounded(torch.nn.functional.linear(x, weight))


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_symbols_and_what_it_replaces():
    assert SPEC.symbol == "astra_gate_up_silu"
    assert SPEC.dim_names == ("num_tokens", "in_features", "out_features")
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_gate_up_silu(const void* x, const void* weight, void* out, '
        "int64_t num_tokens, int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream)")
    assert SPEC.replaces == TARGETS and SPEC.fuses == ()
    assert [v.name for v in SPEC.variants] == ["installed"] and SPEC.variant("installed").callable == TARGETS[0]
    assert "FUSED" in SPEC.summary and "sum" in SPEC.summary
    assert SPEC.tolerance.k <= get_op("linear").tolerance.k
    assert dict(SPEC.tolerance.floor) == dict(get_op("linear").tolerance.floor)


def test_profile_attributes_astra_s_kernel_to_this_op_only():
    from astra_sglang.e2e.attribution import classify

    for name in ("void astra_gus::(anonymous namespace)::gus_gemv_kernel<__nv_bfloat16, 1>(...)",
                 "void astra_gus::(anonymous namespace)::gus_scalar_kernel<__half>(...)"):
        m = classify(name)
        assert (m.op, m.astra) == (OP, True), m
    # SGLang's activation kernel and astra's silu_and_mul / linear stay theirs
    assert classify("void act_and_mul_kernel<__nv_bfloat16, (ActivationKind)0, true, false>(...)").op == "silu_and_mul"
    assert classify("void astra_silu::(anonymous namespace)::silu_and_mul_kernel<__half, 8, 2>(...)").op == \
        "silu_and_mul"
    assert classify("void astra_lin::(anonymous namespace)::linear_kernel<__nv_bfloat16, 1>(...)").op == "linear"


def test_corpus_is_the_dense_mlps_at_one_and_two_tokens_and_every_width_sglang_s_activation_takes():
    dims = {s.dims for s in SPEC.corpus}
    assert (1, 4096, 12288) in dims and (2, 4096, 12288) in dims  # Qwen3-8B
    assert (1, 4096, 14336) in dims and (2, 4096, 14336) in dims  # Llama-3-8B
    assert (1, 2560, 9728) in dims and (1, 2048, 6144) in dims and (1, 2048, 8192) in dims
    assert {(1, 8192, 28672 // tp) for tp in (2, 4, 8)} <= dims  # Llama-3-70B per-rank widths
    assert {s.dims[0] for s in SPEC.corpus} == {1, 2} and {s.tags[0] for s in SPEC.corpus} == {"decode"}
    assert all(s.dims[1] % 8 == 0 for s in SPEC.corpus)
    assert all(A.kept_by_sglang(s.dims) is None for s in SPEC.corpus)  # every corpus row is taken
    edges = [s.dims for s in SPEC.edge_shapes]
    # production (SGLang's silu_and_mul) refuses widths that are not a multiple of 8: none here (the first design's
    # check failed on 3 x 1002 x 5, results/2026-11-27-h200/session7/sdp/)
    assert all(k % 8 == 0 for *_, k in list(dims) + edges)
    assert any(h % 8 for _, h, _ in edges)  # the scalar path
    assert any((h // 8) % 256 for _, h, _ in edges if h % 8 == 0 and h > 2048)  # a partial 256-vector stride
    assert any(t > 4 for t, _, _ in edges) and any(t == 3 for t, _, _ in edges)  # two token groups, a 3-group


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dist", ["normal", "outlier"])
def test_reference_rounds_g_u_and_the_activation_like_sglang(dtype, dist):
    g = torch.Generator().manual_seed(0)
    dims = (2, 256, 24)
    inp = SPEC.make_inputs(dims, dtype, g, dist=dist, device="cpu")
    assert inp["x"].shape == (2, 256) and inp["weight"].shape == (48, 256) and inp["out"].shape == (2, 24)
    ref = SPEC.reference(inp, dims, {})["out"]  # the patch's self-check hands the dtype's own tensors
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    # fp64 GEMM, g and u rounded, fp64 activation rounded: equal to SGLang's steps up to the fp32 GEMM's roundings
    gu = (inp["x"].double() @ inp["weight"].double().t()).to(inp["x"].dtype)
    want = _silu_mul_rounded(gu).double()
    assert (ref - want).abs().max() <= 0.02 * want.abs().max()
    # the reference's own steps, exactly
    td = inp["x"].dtype
    gu64 = inp["x"].double() @ inp["weight"].double().t()
    gg, uu = gu64[:, :24].to(td).double(), gu64[:, 24:].to(td).double()
    assert torch.equal(ref, (torch.nn.functional.silu(gg) * uu).to(td).double())
    # the harness hands fp64 copies: the reference still rounds to the dtype the values came from
    ref64 = SPEC.reference({n: v.double() for n, v in inp.items()}, dims, {})["out"]
    assert torch.equal(ref64, ref)
    unrounded = SPEC.reference({"x": inp["x"].double() + 1e-9, "weight": inp["weight"].double()}, dims, {})["out"]
    assert not torch.equal(unrounded, ref)  # values of no 16-bit dtype: no rounding
    if dist == "normal":
        assert 0.05 < float(ref.std()) < 3.0
    else:
        assert float(ref.abs().max()) > 10.0  # silu deep in its tails, still finite in fp16
    # the harness's path says the dtype (its fp64 copies lose it), as spec.py's reference contract has it
    from astra_sglang.harness.oracle import references

    assert torch.equal(references(SPEC, inp, dims, {}, None)[0]["out"], ref)
    assert SPEC.bytes_moved((1, 4096, 12288), "bf16") == (4096 + 2 * 12288 * 4096 + 12288) * 2


def test_an_fp16_input_of_bf16_representable_values_is_rounded_as_fp16_by_the_harness():
    """The case value inference gets wrong: fp16 tensors whose every value is also a bf16 value. The harness passes
    the dtype, so the reference rounds g, u and the output to fp16, as SGLang's fp16 GEMM and activation do."""
    from astra_sglang.harness.inputs import takes_model_dtype
    from astra_sglang.harness.oracle import references

    dims = (1, 64, 8)
    g = torch.Generator().manual_seed(1)
    # multiples of 1/8 in [-2, 2]: exact in bf16 and in fp16; products and sums need fp16's 10 mantissa bits
    x = (torch.randint(-16, 17, (1, 64), generator=g) / 8.0).to(torch.float16)
    w = (torch.randint(-16, 17, (16, 64), generator=g) / 8.0).to(torch.float16)
    inp = {"x": x, "weight": w, "out": torch.empty(1, 8, dtype=torch.float16)}
    assert takes_model_dtype(SPEC)
    got = references(SPEC, inp, dims, {}, None)[0]["out"]
    gu64 = x.double() @ w.double().t()
    gg, uu = gu64[:, :8].half().double(), gu64[:, 8:].half().double()
    assert torch.equal(got, (torch.nn.functional.silu(gg) * uu).half().double())
    assert all(torch.equal(t.to(torch.bfloat16).to(t.dtype), t) for t in (x, w))  # what inference alone sees
    inferred = SPEC.reference({"x": x.double(), "weight": w.double()}, dims, {})["out"]
    assert not torch.equal(inferred, got)  # rounded as bf16: the case the dtype argument fixes


def test_harness_runs_every_edge_shape_on_cpu():
    from reference_harness import run_edge_cases_on_cpu

    run_edge_cases_on_cpu(SPEC)


# ------------------------------------------------------------------------------------------ installed variant
def _src(which, request):
    return (Path(request.getfixturevalue("sglang_0_5_17_source")) if which == "0.5.17"
            else Path(request.getfixturevalue("wheel_sources")["sglang"]))


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, request):
    assert_extract_installed(OP, TARGETS[0], which, tmp_path, capsys, request)


def assert_extract_installed(op, callable_, which, tmp_path, capsys, request):
    """`extract op` against SGLang `which`'s wheel: every source fact of the installed variant holds, the manifest
    names `callable_` and production's fast-math flags (gate_up_gelu_tanh's and gate_up_gelu's tests ask the same)."""
    code, _, err = run_cli(["extract", op, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(_src(which, request))], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / op / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == callable_
    assert len(m["source_facts"]) == len(get_op(op).variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == which
    assert "--use_fast_math" in m["flags"]  # the activation's math as SGLang's JIT build does it on sm_90


def _stub_activation(monkeypatch, forward_cuda_name="forward_cuda"):
    """A stand-in sglang.srt.layers.activation: SiluAndMul (dispatch fixed at construction, as 0.5.17's) and
    silu_and_mul(input, out) computing SGLang's rounded activation."""
    mod = types.ModuleType("sglang.srt.layers.activation")
    calls = []

    def silu_and_mul(input, out=None):
        calls.append(tuple(input.shape))
        out.copy_(_silu_mul_rounded(input))
        return out

    class SiluAndMul:
        def __init__(self):
            self.is_torch_compile = False
            self._forward_method = getattr(self, forward_cuda_name)

        def forward_cuda(self, x):
            out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype)
            silu_and_mul(x, out)
            return out

        def forward_native(self, x):
            raise AssertionError("not the CUDA path")

        def __call__(self, x):
            return self._forward_method(x)

    mod.SiluAndMul, mod.silu_and_mul, mod.calls = SiluAndMul, silu_and_mul, calls
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def _stub_models(monkeypatch):
    """Stand-in sglang.srt.models.llama / .qwen2 with the MLP classes the adapter tells apart (Qwen2's module reads
    the RL on-policy target through get_exec)."""
    llama = types.ModuleType("sglang.srt.models.llama")
    qwen2 = types.ModuleType("sglang.srt.models.qwen2")

    class LlamaMLP:
        def forward(self, x, forward_batch=None):
            raise AssertionError("the adapter runs instead")

    class Qwen2MLP:
        def forward(self, x, forward_batch=None):
            raise AssertionError("the adapter runs instead")

    llama.LlamaMLP, qwen2.Qwen2MLP = LlamaMLP, Qwen2MLP
    qwen2.target = None
    qwen2.get_exec = lambda: types.SimpleNamespace(deterministic=types.SimpleNamespace(
        rl_on_policy_target=qwen2.target))
    for m in (llama, qwen2):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    return llama, qwen2


def test_installed_impl_runs_sglang_s_two_steps(monkeypatch):
    """The installed baseline names LlamaMLP.forward (module:Class.method); the binder runs the adapter's `sequence`:
    F.linear, then SGLang's silu_and_mul, into the ABI's out (no copy: silu_and_mul writes it)."""
    from astra_sglang.harness.installed import InstalledImpl

    act = _stub_activation(monkeypatch)
    llama, _ = _stub_models(monkeypatch)
    impl = InstalledImpl(TARGETS[0], SPEC)
    assert impl.fn is llama.LlamaMLP.forward and not impl.returns_outputs
    t = SPEC.make_inputs((2, 64, 16), "bf16", torch.Generator().manual_seed(1), device="cpu")
    t["out"].zero_()
    impl(t, (2, 64, 16), "bf16", {})
    assert act.calls == [(2, 32)]
    assert torch.equal(t["out"], _sglang_act(t["x"], t["weight"]))


# ------------------------------------------------------------------------------------------ the adapter's routing
class _GateUp:
    """gate_up_proj's stand-in: an instance of the stub MergedColumnParallelLinear; counts its calls."""

    def __call__(self, x):
        self.calls += 1
        return torch.nn.functional.linear(x, self.weight), None


class _Down:
    """down_proj's stand-in (any layer): records each call's keywords, returns (act @ W^T, None)."""

    def __init__(self, weight):
        self.weight, self.calls = weight, []

    def __call__(self, x, **kw):
        self.calls.append(kw)
        return torch.nn.functional.linear(x, self.weight), None


@pytest.fixture
def sglang_mlp(sglang_unquant_standin, monkeypatch):
    """Stand-in SGLang modules the adapter reads (activation, linear, unquant, the two model modules), CPU tensors
    allowed, and a factory of MLP stand-ins shaped like LlamaMLP's / Qwen2MLP's attributes."""
    monkeypatch.setattr(AD, "DEVICES", ("cuda", "cpu"))
    act_mod = _stub_activation(monkeypatch)
    llama, qwen2 = _stub_models(monkeypatch)
    lin = types.ModuleType("sglang.srt.layers.linear")

    class MergedColumnParallelLinear(_GateUp):
        pass

    lin.MergedColumnParallelLinear = MergedColumnParallelLinear
    monkeypatch.setitem(sys.modules, lin.__name__, lin)
    monkeypatch.delitem(sys.modules, "sglang.kernels.fused_op", raising=False)

    def make(hidden=64, inter=128, dtype=torch.bfloat16, kind="llama", gate_up_cls=MergedColumnParallelLinear):
        method = sglang_unquant_standin.UnquantizedLinearMethod()
        gate_up = gate_up_cls()
        gate_up.weight = (torch.randn(2 * inter, hidden) / hidden ** 0.5).to(dtype)
        gate_up.bias, gate_up.quant_method, gate_up.gather_output, gate_up.calls = None, method, False, 0
        gate_up.tp_size = 1
        cls = llama.LlamaMLP if kind == "llama" else qwen2.Qwen2MLP
        mlp = cls()
        mlp.gate_up_proj, mlp.act_fn = gate_up, act_mod.SiluAndMul()
        mlp.down_proj = _Down((torch.randn(hidden, inter) / inter ** 0.5).to(dtype))
        mlp.dual_gemm = types.SimpleNamespace(mode=None)
        mlp.activation_quant = types.SimpleNamespace(enabled=False)
        return mlp

    return types.SimpleNamespace(make=make, act=act_mod, lin=lin, unquant=sglang_unquant_standin, qwen2=qwen2)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_expand_takes_a_decode_mlp_without_work_and_returns_what_sglang_s_forward_returns(sglang_mlp, kind):
    mlp = sglang_mlp.make(kind=kind)
    x = torch.randn(2, 64).to(torch.bfloat16)
    fb = object()
    c = A.expand({"self": mlp, "x": x, "forward_batch": fb})
    assert not isinstance(c, str), c
    assert mlp.gate_up_proj.calls == 0 and mlp.down_proj.calls == []  # no work before the kernel
    assert c["out"].shape == (2, 128) and c["out"].dtype == torch.bfloat16
    views, dims = A.normalize(c)
    assert dims == (2, 64, 128) and views["weight"] is mlp.gate_up_proj.weight and views["x"] is x
    A.sequence(c)  # SGLang's result: what the self-check compares with and what serves a declined call
    act = _sglang_act(x, mlp.gate_up_proj.weight)
    assert torch.equal(c["out"], act) and sglang_mlp.act.calls == [(2, 256)]
    y = A.returns(c)  # the forward's own down_proj call on the activation
    assert torch.equal(y, torch.nn.functional.linear(act, mlp.down_proj.weight))
    # LlamaMLP.forward calls down_proj(x); Qwen2MLP.forward down_proj(x, forward_batch=forward_batch)
    assert mlp.down_proj.calls == ([{}] if kind == "llama" else [{"forward_batch": fb}])
    ref = SPEC.reference(views, dims, {})["out"]
    assert (c["out"].double() - ref).abs().max() <= 0.02 * ref.abs().max()


def test_tensor_parallel_is_taken(sglang_mlp):
    """At TP > 1 gate_up_proj's forward is the same local F.linear on the rank's [I/tp gate; I/tp up] rows; the
    all-reduce is inside down_proj, which the replacement calls as SGLang does."""
    mlp = sglang_mlp.make(kind="qwen2", inter=64)  # a rank's shard of a 128-wide MLP at TP 2
    mlp.gate_up_proj.tp_size = 2
    mlp.down_proj.tp_size, mlp.down_proj.reduce_results = 2, True
    c = A.expand({"self": mlp, "x": torch.randn(1, 64).to(torch.bfloat16), "forward_batch": None})
    assert not isinstance(c, str), c
    assert A.normalize(c)[1] == (1, 64, 64)


def _lora_like():
    class MergedColumnParallelLinearWithLoRA(_GateUp):
        pass

    return MergedColumnParallelLinearWithLoRA


def _sp_on(m):
    sys.modules["sglang.srt.layers.linear"].get_forward = lambda: types.SimpleNamespace(sp_active=True)


@pytest.mark.parametrize("why,make_kw,edit,x_shape,x_dtype", [
    ("tokens", {}, None, (3, 64), torch.bfloat16),
    ("2-D", {}, None, (1, 1, 64), torch.bfloat16),
    ("not SGLang's LlamaMLP / Qwen2MLP", {}, lambda m: setattr(m, "__class__", type("OtherMLP", (), {})), (1, 64),
     torch.bfloat16),
    ("bias", {}, lambda m: setattr(m.gate_up_proj, "bias", torch.zeros(256)), (1, 64), torch.bfloat16),
    ("gathers", {}, lambda m: setattr(m.gate_up_proj, "gather_output", True), (1, 64), torch.bfloat16),
    ("sequence parallel", {}, _sp_on, (1, 64), torch.bfloat16),
    ("plain MergedColumnParallelLinear", {"gate_up_cls": _lora_like()}, None, (1, 64), torch.bfloat16),
    ("down_proj", {}, lambda m: setattr(m, "down_proj", None), (1, 64), torch.bfloat16),
    ("SiluAndMul", {}, lambda m: setattr(m, "act_fn", object()), (1, 64), torch.bfloat16),
    ("torch.compile", {}, lambda m: setattr(m.act_fn, "is_torch_compile", True), (1, 64), torch.bfloat16),
    ("forward_native", {}, lambda m: setattr(m.act_fn, "_forward_method", m.act_fn.forward_native), (1, 64),
     torch.bfloat16),
    ("dual GEMM", {}, lambda m: setattr(m.dual_gemm, "mode", "UNQUANT"), (1, 64), torch.bfloat16),
    ("FP8 quant", {}, lambda m: setattr(m.activation_quant, "enabled", True), (1, 64), torch.bfloat16),
    ("in_features 60 is not a multiple of 8", {"hidden": 60}, None, (1, 60), torch.bfloat16),
    ("12288", {"hidden": 12296}, None, (1, 12296), torch.bfloat16),
    ("intermediate width 100", {"inter": 100}, None, (1, 64), torch.bfloat16),
    ("not [2I, 64]", {"hidden": 72}, None, (1, 64), torch.bfloat16),
    ("fp16 / bf16", {"dtype": torch.float32}, None, (1, 64), torch.float32),
    ("fp16 / bf16", {}, None, (1, 64), torch.float16),  # x and the weight disagree
    ("gate_up_proj: ", {}, lambda m: setattr(m.gate_up_proj, "quant_method", object()), (1, 64), torch.bfloat16),
    ("AMX", {}, lambda m: setattr(m.gate_up_proj, "use_intel_amx_backend", True), (1, 64), torch.bfloat16),
])
def test_expand_declines_before_any_work(sglang_mlp, why, make_kw, edit, x_shape, x_dtype):
    mlp = sglang_mlp.make(**make_kw)
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    if edit:
        edit(mlp)
    r = A.expand({"self": mlp, "x": torch.randn(*x_shape).to(x_dtype), "forward_batch": None})
    assert isinstance(r, str) and why in r, r
    assert gate_up.calls == 0 and down.calls == [] and sglang_mlp.act.calls == []  # the method's work is its own


def test_expand_declines_sglang_s_bf16_gemm_backends_and_qwen2_s_rl_target(sglang_mlp):
    mlp = sglang_mlp.make()
    x = torch.randn(1, 64).to(torch.bfloat16)
    sglang_mlp.unquant.backend = types.SimpleNamespace(is_cutedsl=lambda: False, is_gemv=lambda: True)  # 0.5.23
    assert "backend" in A.expand({"self": mlp, "x": x})
    sglang_mlp.unquant.backend = types.SimpleNamespace(is_cutedsl=lambda: False, is_gemv=lambda: False)
    q = sglang_mlp.make(kind="qwen2")
    sglang_mlp.qwen2.target = "fsdp"
    assert "RL on-policy" in A.expand({"self": q, "x": x})
    assert not isinstance(A.expand({"self": mlp, "x": x}), str)  # LlamaMLP.forward has no such cast
    sglang_mlp.qwen2.target = None
    assert not isinstance(A.expand({"self": q, "x": x}), str)
    sglang_mlp.qwen2.get_exec = lambda: (_ for _ in ()).throw(ValueError("config namespace 'exec' not published"))
    assert not isinstance(A.expand({"self": q, "x": x}), str)  # outside a server: the default, no target
    # sequence parallelism off (0.5.23's forward context), or no context readable: taken
    sys.modules["sglang.srt.layers.linear"].get_forward = lambda: types.SimpleNamespace(sp_active=False)
    assert not isinstance(A.expand({"self": mlp, "x": x}), str)
    sys.modules["sglang.srt.layers.linear"].get_forward = lambda: (_ for _ in ()).throw(RuntimeError("no context"))
    assert not isinstance(A.expand({"self": mlp, "x": x}), str)


def test_sglang_0_5_23_s_lazy_dispatch_is_resolved_as_its_forward_would(sglang_mlp, monkeypatch):
    """0.5.23's SiluAndMul resolves its forward on first call (BaseFusedOp); the adapter resolves it the same way
    and caches it as that forward does, and declines under a forced fused-op backend."""
    mlp = sglang_mlp.make()
    act = mlp.act_fn
    act._forward_method = None
    resolved = []
    act._resolve_forward_method = lambda: resolved.append(1) or act.forward_cuda
    x = torch.randn(1, 64).to(torch.bfloat16)
    assert not isinstance(A.expand({"self": mlp, "x": x}), str)
    assert not isinstance(A.expand({"self": mlp, "x": x}), str)
    assert resolved == [1] and act._forward_method == act.forward_cuda
    fused = types.ModuleType("sglang.kernels.fused_op")
    fused.get_fused_op_backend = lambda: "triton"
    monkeypatch.setitem(sys.modules, fused.__name__, fused)
    assert "forced" in A.expand({"self": mlp, "x": x})
    fused.get_fused_op_backend = lambda: None
    act._forward_method = None
    act._resolve_forward_method = lambda: act.forward_native
    assert "forward_native" in A.expand({"self": mlp, "x": x})


def test_the_shape_rule_is_validate_s_n_a_and_the_precheck_s_token_limit():
    assert AD.MAX_TOKENS == 2 and A.max_tokens == 2 and AD.MAX_IN_FEATURES == 12288  # linear's 4-row CTA bound
    assert "tokens" in A.kept_by_sglang((3, 4096, 12288))
    assert "multiple of 8" in A.kept_by_sglang((1, 1002, 40))
    assert "multiple of 8" in A.kept_by_sglang((1, 4096, 1004))
    assert A.kept_by_sglang((1, 4096, 14336)) is None and A.kept_by_sglang((2, 8192, 3584)) is None
    assert "12288" in A.kept_by_sglang((1, 16384, 8192))
    pre = A.precheck
    assert "tokens" in pre((None, torch.randn(3, 64)), {}) and "tokens" in pre((None,), {"x": torch.randn(3, 64)})
    assert pre((None, torch.randn(2, 64)), {}) is None and pre((None,), {}) is None


def assert_on_by_default_and_binds(op, forward):
    """op is in `--ops all`, `all,-op` takes it out, and its adapter binds `forward` (the replaced MLPs' signature);
    gate_up_gelu_tanh's test asks the same."""
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.adapters import Binder, adapter_mismatch
    from astra_sglang.patch.config import default_ops, parse_ops

    spec, adapter = get_op(op), op_part(op, "adapter").ADAPTER
    assert op_part(op, "adapter").DEFAULT_OFF == ""
    known = patchable_ops()
    assert op in known and op in parse_ops("all", known, default_ops(known))
    assert op not in parse_ops(f"all,-{op}", known, default_ops(known))
    assert adapter_mismatch(spec, adapter) is None and adapter.returned == ()
    assert Binder(forward, adapter, spec).ok


def assert_listed_complete(op, capsys):
    """`astra-sglang ops` lists op with every part, its installed variant, on by default."""
    code, out, _ = run_cli(["ops", "--json"], capsys)
    assert code == 0
    row = {r["op"]: r for r in json.loads(out)}[op]
    assert row["kernel"] and row["patch"] and row["validate"] and row["missing"] == []
    assert row["extract"] == ["installed"] and row["default_off"] == ""


def test_on_by_default_and_binds_both_forwards():
    def forward(self, x, forward_batch=None):  # both MLPs' signature
        raise AssertionError("not called")

    assert_on_by_default_and_binds(OP, forward)


def test_astra_sglang_ops_lists_it(capsys):
    assert_listed_complete(OP, capsys)
    code, out, _ = run_cli(["ops"], capsys)
    assert code == 0 and OP in out


def test_layer_imports_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)


# ------------------------------------------------------------------------------------------ real SGLang sources
def _body(fn: ast.FunctionDef):
    return [ast.unparse(n) for n in fn.body]


# What the replacement reproduces: gate_up_proj, the activation, down_proj. 0.5.23 adds its Blackwell fusions (the
# adapter declines where they are on) and routes the decode activation through DenseSiluAndMulQuant, which returns
# act_fn(x) where it is not enabled (checked below).
_LLAMA_BODY = {
    "0.5.17": ["gate_up, _ = self.gate_up_proj(x)", "x = self.act_fn(gate_up)", "x, _ = self.down_proj(x)",
               "return x"],
    "0.5.23": ["if self.dual_gemm.can_run(x, self.gate_up_proj):\n    x = self.dual_gemm(x, self.gate_up_proj)\n"
               "else:\n    gate_up, _ = self.gate_up_proj(x)\n"
               "    if forward_batch is not None and forward_batch.forward_mode.is_decode():\n"
               "        x = self.activation_quant.forward_decode(gate_up, self.act_fn, self.down_proj)\n"
               "    else:\n        x = self.act_fn(gate_up)",
               "x, _ = self.down_proj(x)", "return x"],
}
_RL = "if get_exec().deterministic.rl_on_policy_target is not None:\n    x = x.bfloat16()"


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_replaced_forwards_are_the_sequence_the_op_fuses_then_down_proj(version, request):
    root = _sglang_root(version, request)
    llama = _method(_class(root, "srt/models/llama.py", "LlamaMLP"), "forward")
    qwen2 = _method(_class(root, "srt/models/qwen2.py", "Qwen2MLP"), "forward")
    for fn in (llama, qwen2):
        assert [a.arg for a in fn.args.args] == ["self", "x", "forward_batch"]
    assert _body(llama) == _LLAMA_BODY[version]
    # Qwen2's down_proj call passes forward_batch (the adapter's down_kw): RowParallelLinear reads it at TP > 1
    q = _LLAMA_BODY[version][:-2] + ["x, _ = self.down_proj(x, forward_batch=forward_batch)", "return x"]
    assert _body(qwen2) == [_RL] + q
    assert "from sglang.srt.models.qwen2 import Qwen2MLP as Qwen3MLP" in (root / "srt/models/qwen3.py").read_text()
    # the layers the adapter checks are the ones __init__ builds: a bias-free gate_up of two equal halves, SiluAndMul
    for rel, cls in (("srt/models/llama.py", "LlamaMLP"), ("srt/models/qwen2.py", "Qwen2MLP")):
        init = ast.unparse(_method(_class(root, rel, cls), "__init__"))
        assert "self.gate_up_proj = MergedColumnParallelLinear(" in init and "self.act_fn = SiluAndMul()" in init
        assert "[intermediate_size] * 2" in init and init.count("bias=False") == 2
        if version == "0.5.23":
            assert "self.dual_gemm = DualGemm(" in init and "self.activation_quant = DenseSiluAndMulQuant(" in init


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_what_the_adapter_reads_of_the_layers_holds(version, request):
    root = _sglang_root(version, request)
    silu = _class(root, "srt/layers/activation.py", "SiluAndMul")
    assert _body(_method(silu, "forward_cuda")) == [
        "d = x.shape[-1] // 2", "output_shape = x.shape[:-1] + (d,)",
        "out = torch.empty(output_shape, dtype=x.dtype, device=x.device)", "silu_and_mul(x, out)", "return out"]
    act_src = (root / "srt/layers/activation.py").read_text()
    assert "def silu_and_mul(input: torch.Tensor, out=None) -> torch.Tensor:" in act_src  # what `sequence` calls
    # gate_up_proj: MergedColumnParallelLinear inherits ColumnParallelLinear.forward, a local apply without gather
    merged = _class(root, "srt/layers/linear.py", "MergedColumnParallelLinear")
    assert [ast.unparse(b) for b in merged.bases] == ["ColumnParallelLinear"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in merged.body)
    col = ast.unparse(_method(_class(root, "srt/layers/linear.py", "ColumnParallelLinear"), "forward"))
    assert "bias = self.bias if not self.skip_bias_add else None" in col
    assert "output_parallel = self.quant_method.apply(self, input_, bias)" in col
    assert "if self.gather_output:" in col and "output = output_parallel" in col
    if version == "0.5.23":  # the only other path: sequence parallelism, declined
        assert "if get_forward().sp_active and tp_size > 1:\n        output = layernorm_sp.column_parallel_g_matmul(" \
            in col
        assert "from sglang.srt.runtime_context import get_exec, get_forward, get_parallel" in (
            root / "srt/layers/linear.py").read_text()
    else:
        assert "sp_active" not in col
    # each rank's gate_up weight is [I/tp gate; I/tp up]: shard i at sum(output_sizes[:i]) / tp
    loader = ast.unparse(_method(merged, "weight_loader"))
    tp = "self.tp_size" if version == "0.5.17" else "tp_size"  # 0.5.23: get_group_rank_size(self.tp_group)
    assert f"shard_offset = sum(self.output_sizes[:loaded_shard_id]) // {tp}" in loader
    assert f"shard_size = self.output_sizes[loaded_shard_id] // {tp}" in loader
    if version == "0.5.17":
        base_op = _class(root, "srt/layers/utils/multi_platform.py", "MultiPlatformOp")
        assert "self._forward_method: Callable = self.dispatch_forward()" in ast.unparse(_method(base_op, "__init__"))
        assert "self.is_torch_compile = False" in ast.unparse(_method(base_op, "__init__"))
    else:
        fused = _class(root, "kernels/fused_op.py", "BaseFusedOp")
        fwd = ast.unparse(_method(fused, "forward"))
        assert "method = self._forward_method = self._resolve_forward_method()" in fwd
        assert "forced = get_fused_op_backend()" in fwd
        assert "self.is_torch_compile = False" in ast.unparse(_method(fused, "__init__"))
        dual = ast.unparse(_class(root, "srt/layers/dual_gemm.py", "DualGemm"))
        assert "self.mode = self._select_mode(gate_up_proj, hidden_size)" in dual
        assert "return self.mode is not None and 1 <= input_tensor.shape[0] <= self.max_tokens" in dual
        quant = _class(root, "srt/layers/quantization/fp8_activation.py", "DenseSiluAndMulQuant")
        assert "if not self.enabled or torch.compiler.is_compiling():\n        return act_fn(x)" in ast.unparse(
            _method(quant, "forward_decode"))
    # RowParallelLinear.forward (down_proj) takes the forward_batch keyword Qwen2MLP passes
    row = _method(_class(root, "srt/layers/linear.py", "RowParallelLinear"), "forward")
    assert "forward_batch" in [a.arg for a in row.args.args]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_discovery_finds_both_mlp_forwards_and_the_binder_takes_their_signatures(version, request):
    from astra_sglang.patch.adapters import Binder
    from astra_sglang.patch.discover import discover_for_specs
    from sglang_signatures import real_function

    root = _sglang_root(version, request)
    disc = discover_for_specs([SPEC], roots={"sglang": root})
    found = {(s.kind, s.module, s.local_name) for s in disc.for_op(OP)}
    assert ("definition", "sglang.srt.models.llama", "LlamaMLP.forward") in found
    assert ("definition", "sglang.srt.models.qwen2", "Qwen2MLP.forward") in found
    for mod in ("sglang.srt.models.llama", "sglang.srt.models.qwen2"):
        fn = real_function(root.parent, mod, "forward", names={"ForwardBatch": object})
        assert Binder(fn, A, SPEC).ok


# ------------------------------------------------------------------------------------------ the patched forward
def test_the_patched_forward_runs_the_kernel_then_down_proj_and_leaves_prefill_to_sglang(tmp_path):
    """Through the real patch machinery (stand-in SGLang modules, a CPU stand-in backend, a fresh interpreter): a
    prefill call runs SGLang's forward without expand; a 1-token call runs the op's kernel (no gate_up_proj, no
    silu_and_mul), then down_proj once, and returns what SGLang's forward returns."""
    script = f'''
import sys, types
import torch
for p in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.quantization", "sglang.srt.models"):
    sys.modules.setdefault(p, types.ModuleType(p))
unq = types.ModuleType("sglang.srt.layers.quantization.unquant")
class UnquantizedLinearMethod:
    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x, layer.weight, bias)
unq.UnquantizedLinearMethod = UnquantizedLinearMethod
sys.modules[unq.__name__] = unq
act = types.ModuleType("sglang.srt.layers.activation")
seen = {{"silu": 0, "down": 0, "gate_up": 0, "forward": 0}}
def silu_and_mul(x, out=None):
    seen["silu"] += 1
    k = x.shape[-1] // 2
    out.copy_((torch.nn.functional.silu(x[:, :k].float()) * x[:, k:].float()).to(x.dtype))
    return out
class SiluAndMul:
    def __init__(self):
        self.is_torch_compile, self._forward_method = False, self.forward_cuda
    def forward_cuda(self, x):
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype)
        return silu_and_mul(x, out)
    def __call__(self, x):
        return self._forward_method(x)
act.SiluAndMul, act.silu_and_mul = SiluAndMul, silu_and_mul
sys.modules[act.__name__] = act
lin = types.ModuleType("sglang.srt.layers.linear")
class MergedColumnParallelLinear:
    def __init__(self, w):
        self.weight, self.bias, self.quant_method, self.gather_output = w, None, UnquantizedLinearMethod(), False
    def __call__(self, x):
        seen["gate_up"] += 1
        return self.quant_method.apply(self, x), None
class RowParallelLinear:
    def __init__(self, w):
        self.weight, self.bias, self.quant_method = w, None, UnquantizedLinearMethod()
    def __call__(self, x, forward_batch=None):
        seen["down"] += 1
        return self.quant_method.apply(self, x), None
lin.MergedColumnParallelLinear, lin.RowParallelLinear = MergedColumnParallelLinear, RowParallelLinear
sys.modules[lin.__name__] = lin
llama = types.ModuleType("sglang.srt.models.llama")
class LlamaMLP:  # the 0.5.17 body's three steps
    def __init__(self, h, i):
        self.gate_up_proj = MergedColumnParallelLinear((torch.randn(2 * i, h) / h ** 0.5).to(torch.bfloat16))
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear((torch.randn(h, i) / i ** 0.5).to(torch.bfloat16))
    def forward(self, x, forward_batch=None):
        seen["forward"] += 1
        gate_up, _ = self.gate_up_proj(x)
        x = self.act_fn(gate_up)
        x, _ = self.down_proj(x)
        return x
llama.LlamaMLP = LlamaMLP
sys.modules[llama.__name__] = llama
from astra_sglang.registry import get_op, op_part
ad = op_part("gate_up_silu", "adapter")
ad.DEVICES = ("cuda", "cpu")
spec = get_op("gate_up_silu")
class Cpu:
    name = "cpu"; devices, dtypes = frozenset({{"cpu"}}), ("bf16", "fp16")
    launched = 0
    def launch(self, views, dims, dt, scalars):
        Cpu.launched += 1
        views["out"].copy_(spec.reference(views, dims, {{}})["out"].to(views["out"].dtype))
from astra_sglang.patch import apply_astra_kernels
from astra_sglang.patch.counters import totals
cdir = {str(tmp_path)!r}
apply_astra_kernels(["gate_up_silu"], backends={{"gate_up_silu": Cpu()}}, counter_dir=cdir, propagate=False,
                    plan=False, self_check="off")
mlp = LlamaMLP(64, 128)
real = ad.ADAPTER.expand
def no_expand(a):
    raise AssertionError("expand ran for a prefill call")
object.__setattr__(ad.ADAPTER, "expand", no_expand)
y = mlp.forward(torch.randn(16, 64, dtype=torch.bfloat16))
assert y.shape == (16, 64) and seen == {{"silu": 1, "down": 1, "gate_up": 1, "forward": 1}}, seen
object.__setattr__(ad.ADAPTER, "expand", real)
x1 = torch.randn(1, 64, dtype=torch.bfloat16)
y1 = mlp.forward(x1)
assert Cpu.launched == 1 and seen == {{"silu": 1, "down": 2, "gate_up": 1, "forward": 1}}, seen
want = LlamaMLP.forward.__astra_original__(mlp, x1)
assert (y1.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max(), (y1, want)
c = totals(cdir)["gate_up_silu"]
print(c["calls"], c["fallbacks"])
'''
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    calls, fallbacks = map(int, r.stdout.split()[-2:])
    assert calls == 1 and fallbacks == 1


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_builds_with_the_op_s_flags_and_passes_the_static_checks(tmp_path, monkeypatch):
    if not shutil.which("nm"):
        pytest.skip("needs binutils nm")
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.patch.apply import build_kernel
    from astra_sglang.registry import shipped_kernel
    from astra_sglang.static_checks import errors, scan_file

    src = shipped_kernel(OP)
    assert not errors(scan_file(src, []))
    text = src.read_text()
    assert "namespace astra_gus {" in text and "griddepcontrol.wait" in text and "#include \"" not in text
    assert SPEC.c_signature().split("(")[0] in text
    # linear's memory pattern: weights issued before the PDL wait, streamed past L1; the trigger after the wait
    assert "ld.global.nc.L1::no_allocate" in text
    assert text.index("wv[r] = live ? load_stream") < text.index("pdl_wait();\n      if (!ASTRA_GUS_LATE_TRIGGER) pdl_trigger();")
    assert "--use_fast_math" in kernel_flags(SPEC, Arch(9, 0))  # SGLang's activation math on sm_90
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    lib = build_kernel(OP, arch="sm_90")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert SPEC.symbol in syms


@pytest.mark.nvcc
@pytest.mark.parametrize("pairs", [2, 4])
def test_no_register_spills_at_sm_90a_for_either_pair_count(pairs, tmp_path):
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.registry import shipped_kernel

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, *kernel_flags(SPEC, Arch(9, 0)), f"-DASTRA_GUS_PAIRS={pairs}", "-Xptxas", "-v", "-c",
           str(shipped_kernel(OP)), "-o", str(tmp_path / "k.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    assert len(spills) == 10  # 2 dtypes x (4 token groups + the scalar path)
    assert all(s == ("0", "0") for s in spills), r.stderr
