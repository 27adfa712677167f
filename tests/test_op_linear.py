"""linear (kernels/linear/): an unquantized linear at decode sizes, replacing SGLang's UnquantizedLinearMethod.apply
(F.linear -> cuBLAS) for 1-2 token calls. The spec and its fp64 reference, the corpus from real configs, the
installed-variant extract against the real sglang 0.5.17 and 0.5.23 sources (a changed fact fails it), the harness's
installed baseline resolving the method, the adapter's routing (which apply calls it takes: stand-in layers and a
stand-in unquant module, as a unit test of the decisions), moe_gate sharing the apply-path rule, and the shipped
kernel's sm_90a build.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.errors import AstraError  # noqa: E402
from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import one_error, run_cli  # noqa: E402

SPEC = get_op("linear")
ADAPTER_MOD = op_part("linear", "adapter")
A = ADAPTER_MOD.ADAPTER
TARGET = "sglang.srt.layers.quantization.unquant:UnquantizedLinearMethod.apply"


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_and_symbols():
    assert SPEC.symbol == "astra_linear"
    assert SPEC.dim_names == ("num_tokens", "in_features", "out_features")
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_linear(const void* x, const void* weight, void* out, int64_t num_tokens, '
        "int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream)")
    assert SPEC.replaces == (TARGET,)
    assert [v.name for v in SPEC.variants] == ["installed"] and SPEC.variant("installed").callable == TARGET
    import re

    pat = re.compile(SPEC.kernel_symbols[0])
    assert pat.search("void astra_lin::(anonymous namespace)::linear_kernel<__nv_bfloat16, 1>(...)")
    assert pat.search("void astra_lin::(anonymous namespace)::linear_mma_kernel<__nv_bfloat16, 4, 2, 1>(...)")
    assert not pat.search("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT")


def test_corpus_covers_the_dense_projections_at_decode():
    dims = {s.dims for s in SPEC.corpus}
    assert (1, 4096, 6144) in dims and (1, 14336, 4096) in dims  # Llama-3-8B qkv, down
    assert (1, 4096, 2048) in dims and (1, 2048, 5120) in dims  # Qwen3-30B-A3B o, qkv
    assert (1, 1024, 8192) in dims  # Llama-3-70B's o_proj at TP 8: a sharded width
    assert {s.tags[0] for s in SPEC.corpus} == {"decode"}
    assert {s.dims[0] for s in SPEC.corpus} == {1, 2, 4, 8}  # both paths: FMA at 1-2, tensor cores at 3-8
    assert all(s.dims[1] % 8 == 0 for s in SPEC.corpus)
    assert any(s.dims[1] % 8 for s in SPEC.edge_shapes)  # the kernel's scalar path
    assert any(s.dims[0] > 8 for s in SPEC.edge_shapes)  # two token groups
    # the tensor-core path's two CTA shapes (kernel.cu's launch_mma), each with a partial last tile
    mma_edges = [n for t, _, n in (s.dims for s in SPEC.edge_shapes) if 3 <= t <= 8 and n % 16]
    assert {(n + 15) // 16 >= 200 for n in mma_edges} == {True, False}


@pytest.mark.parametrize("dist", ["normal", "outlier"])
def test_reference_is_the_fp64_product(dist):
    g = torch.Generator().manual_seed(0)
    inp = SPEC.make_inputs((2, 256, 12), "bf16", g, dist=dist, device="cpu")
    assert inp["x"].dtype == inp["weight"].dtype == inp["out"].dtype == torch.bfloat16
    assert tuple(inp["out"].shape) == (2, 12)
    ref = SPEC.reference(inp, (2, 256, 12), {})["out"]
    assert ref.dtype == torch.float64 and torch.equal(ref, inp["x"].double() @ inp["weight"].double().t())
    if dist == "normal":
        assert 0.3 < float(ref.std()) < 3.0
    assert SPEC.bytes_moved((1, 4096, 2048), "bf16") == (4096 + 2048 * 4096 + 2048) * 2


# ------------------------------------------------------------------------------------------ installed variant
def _src(which, sglang_0_5_17_source, wheel_sources):
    return Path(sglang_0_5_17_source) if which == "0.5.17" else Path(wheel_sources["sglang"])


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, sglang_0_5_17_source,
                                                             wheel_sources):
    code, _, err = run_cli(["extract", "linear", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(_src(which, sglang_0_5_17_source, wheel_sources))], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / "linear" / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == TARGET
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == which


@pytest.mark.wheels
def test_extract_fails_when_row_parallel_stops_calling_apply(tmp_path, capsys, sglang_0_5_17_source):
    pkg = tmp_path / "sglang-copy" / "sglang"
    for rel in ("srt/layers/linear.py", "srt/layers/quantization/unquant.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(sglang_0_5_17_source) / "sglang" / rel, pkg / rel)
    f = pkg / "srt/layers/linear.py"
    text = f.read_text()
    assert "self, input_parallel, bias=bias_" in text
    f.write_text(text.replace("self, input_parallel, bias=bias_", "self, input_parallel, bias_"))
    code, _, err = run_cli(["extract", "linear", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(tmp_path / "sglang-copy")], capsys)
    assert code == 2
    one_error(err, "linear.py", "RowParallelLinear")
    assert not (tmp_path / "ws" / "linear").exists()


def test_installed_impl_resolves_the_method(monkeypatch):
    """The installed baseline names UnquantizedLinearMethod.apply (module:Class.method); the binder then runs the
    adapter's `sequence` (F.linear into the ABI's out), as the patch's fallback does."""
    from astra_sglang.harness.installed import InstalledImpl

    mod = types.ModuleType("sglang.srt.layers.quantization.unquant")

    class UnquantizedLinearMethod:
        def apply(self, layer, x, bias=None):
            raise AssertionError("the binder runs the adapter's sequence, not the method")

    mod.UnquantizedLinearMethod = UnquantizedLinearMethod
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    impl = InstalledImpl(TARGET, SPEC)
    assert impl.fn is UnquantizedLinearMethod.apply and impl.returns_outputs
    g = torch.Generator().manual_seed(1)
    t = SPEC.make_inputs((2, 64, 8), "bf16", g, device="cpu")
    t["out"].zero_()
    impl(t, (2, 64, 8), "bf16", {})
    assert torch.equal(t["out"], torch.nn.functional.linear(t["x"], t["weight"]))


# ------------------------------------------------------------------------------------------ the adapter's routing
@pytest.fixture
def unquant(sglang_unquant_standin, monkeypatch):
    """conftest's stand-in unquant module, with the adapter taking CPU tensors."""
    monkeypatch.setattr(ADAPTER_MOD, "DEVICES", ("cuda", "cpu"))
    return sglang_unquant_standin


def _proj(unquant, n=2048, k=4096, dtype=torch.bfloat16, method=None):
    m = method or unquant.UnquantizedLinearMethod()
    return m, types.SimpleNamespace(weight=torch.randn(n, k).to(dtype), quant_method=m)


def test_expand_takes_a_decode_projection_and_allocates_like_f_linear(unquant):
    m, layer = _proj(unquant)
    x = torch.randn(1, 1, 4096).to(torch.bfloat16)  # any leading shape, as F.linear takes
    c = A.expand({"self": m, "layer": layer, "x": x, "bias": None})
    assert not isinstance(c, str), c
    assert c["out"].shape == (1, 1, 2048) and c["out"].dtype == torch.bfloat16
    views, dims = A.normalize(c)
    assert dims == (1, 4096, 2048) and views["weight"] is layer.weight and views["out"].shape == (1, 2048)
    A.sequence(c)
    assert torch.equal(c["out"], torch.nn.functional.linear(x, layer.weight))
    assert A.returns(c) is c["out"]


@pytest.mark.parametrize("why,proj_kw,x_shape,x_dtype,bias", [
    ("tokens", {}, (ADAPTER_MOD.MAX_TOKENS + 1, 4096), torch.bfloat16, None),  # prefill: cuBLAS
    ("bias", {}, (1, 4096), torch.bfloat16, torch.zeros(2048)),
    ("fp16 / bf16", {"dtype": torch.float32}, (1, 4096), torch.float32, None),
    ("fp16 / bf16", {}, (1, 4096), torch.float16, None),                       # x and weight disagree
    ("does not match", {}, (1, 1024), torch.bfloat16, None),
    ("multiple of 8", {"k": 1002}, (1, 1002), torch.bfloat16, None),
    ("in_features", {"k": 28672}, (1, 28672), torch.bfloat16, None),          # longer than any row measured
    ("tensor-core", {"k": 14336, "n": 4096}, (4, 14336), torch.bfloat16, None),  # down_proj at 4 tokens
    ("outputs", {"n": 6144}, (4, 4096), torch.bfloat16, None),                 # qkv at 4 tokens: cuBLAS as fast
])
def test_expand_leaves_other_calls_to_the_method(unquant, why, proj_kw, x_shape, x_dtype, bias):
    m, layer = _proj(unquant, **proj_kw)
    r = A.expand({"self": m, "layer": layer, "x": torch.randn(*x_shape).to(x_dtype), "bias": bias})
    assert isinstance(r, str) and why in r, r


def test_three_and_four_tokens_take_the_tensor_core_path_on_hopper_only(unquant, monkeypatch):
    """3-4 tokens of an out_features <= 4096 projection are the tensor-core path's: taken on sm_90, left to cuBLAS on
    other GPUs (the FMA path is slower than cuBLAS there); 1-2 tokens are the FMA path's anywhere."""
    m, layer = _proj(unquant, n=4096)
    for major, taken in ((9, True), (8, False)):
        monkeypatch.setattr(ADAPTER_MOD, "_major", lambda device, major=major: major)
        r = A.expand({"self": m, "layer": layer, "x": torch.randn(3, 4096).to(torch.bfloat16), "bias": None})
        assert (not isinstance(r, str)) == taken, r
        r = A.expand({"self": m, "layer": layer, "x": torch.randn(2, 4096).to(torch.bfloat16), "bias": None})
        assert not isinstance(r, str), r


def test_declined_shapes_are_validates_n_a_not_failures():
    """The shape rule is the adapter's `keeps`: validate reports a shape the adapter leaves to cuBLAS by design n/a
    (the edge shape of in_features 1002, 3-4 tokens of wide outputs, 8 tokens), and the taken corpus shapes are 1, 2
    and 4 tokens."""
    assert A.kept_by_sglang((3, 1002, 5)) and "multiple of 8" in A.kept_by_sglang((3, 1002, 5))
    assert "outputs" in A.kept_by_sglang((4, 4096, 6144))
    assert A.kept_by_sglang((4, 4096, 4096)) is None and A.kept_by_sglang((2, 4096, 28672)) is None
    assert "tokens" in A.kept_by_sglang((8, 4096, 4096))  # 8 tokens: the step at batch 8 did not gain
    # the 14336-wide down_proj: its 1-2-token calls take the 2-row CTAs; at 3-4 tokens the tensor-core path takes
    # Gemma-2-9B's (-> 3584, -2.53% of its batch-4 step) and leaves Llama-3-8B's (-> 4096, +0.37%) to cuBLAS
    assert A.kept_by_sglang((1, 14336, 4096)) is None and A.kept_by_sglang((2, 14336, 3584)) is None
    assert A.kept_by_sglang((4, 14336, 3584)) is None and A.kept_by_sglang((3, 14336, 2048)) is None
    assert "tensor-core" in A.kept_by_sglang((4, 14336, 4096)) and "28672" in A.kept_by_sglang((1, 28672, 4096))
    # Gemma-7B's 24576-wide down_proj (2026-12-01: -2.97% / -2.34% of its step at batch 1 / 2) at 1-2 tokens; its
    # 3-4-token calls stay cuBLAS's (the tensor-core path is measured to 21504 inputs)
    assert all(A.kept_by_sglang((t, 24576, 3072)) is None for t in (1, 2))
    assert all("not measured" in A.kept_by_sglang((t, 24576, 3072)) for t in (3, 4))
    assert A.kept_by_sglang((4, 21504, 3584)) is None
    # the longer down_proj rows (2026-11-30, 1.08-1.32x in context): Gemma-3-12B's and Gemma-3-27B's at 1-2 tokens,
    # Qwen2.5-7B's (-> 3584) at 1-4 tokens; Gemma-3-12B's -> 3840 at 3-4 tokens stays cuBLAS's (unmeasured there)
    assert all(A.kept_by_sglang((t, k, n)) is None for t in (1, 2) for k, n in ((15360, 3840), (21504, 5376)))
    assert all(A.kept_by_sglang((t, 18944, 3584)) is None for t in (1, 2, 3, 4))
    assert "tensor-core" in A.kept_by_sglang((4, 15360, 3840))
    assert "tensor-core" in A.kept_by_sglang((4, 12296, 3592))
    taken = [s.dims for s in SPEC.corpus if ADAPTER_MOD.declined(*s.dims) is None]
    assert {t for t, _, _ in taken} == {1, 2, 4}


def test_validate_reports_three_plus_tokens_n_a_off_hopper(monkeypatch):
    """On a GPU that is not Hopper the adapter leaves 3+ tokens to cuBLAS, so validate must call them n/a there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ADAPTER_MOD, "_major", lambda device: 8)
    assert "Hopper" in A.kept_by_sglang((4, 4096, 4096))
    assert A.kept_by_sglang((2, 4096, 4096)) is None
    monkeypatch.setattr(ADAPTER_MOD, "_major", lambda device: 9)
    assert A.kept_by_sglang((4, 4096, 4096)) is None


def test_prefill_calls_leave_before_anything_else_is_read(unquant):
    """Every eager prefill call of every linear passes through expand: the token count is the first test."""
    layer = types.SimpleNamespace()  # no weight, no quant_method: reading either would raise
    r = A.expand({"self": None, "layer": layer, "x": torch.randn(64, 4096), "bias": torch.zeros(3)})
    assert "64 tokens" in r


def test_precheck_declines_prefill_calls_off_the_raw_arguments():
    """The patch asks precheck before binding: a prefill-sized x (positional or keyword) leaves at once; anything
    else is expand's to decide."""
    pre = A.precheck
    many = torch.randn(ADAPTER_MOD.MAX_TOKENS + 1, 64)
    assert "tokens" in pre((None, None, many), {})
    assert "tokens" in pre((None, None), {"x": many})
    # [batch, seq, hidden] counts every row
    assert "tokens" in pre((None, None, torch.randn(ADAPTER_MOD.MAX_TOKENS + 1, 1, 64)), {})
    assert pre((None, None, torch.randn(ADAPTER_MOD.MAX_TOKENS, 64)), {}) is None
    assert pre((None, None, "not a tensor"), {}) is None and pre((None,), {}) is None


def test_expand_follows_sglangs_own_apply_branches(unquant):
    x = torch.randn(1, 4096).to(torch.bfloat16)
    m, layer = _proj(unquant, method=object())
    assert "unquantized" in A.expand({"self": m, "layer": layer, "x": x})
    m, layer = _proj(unquant)
    layer.use_intel_amx_backend = True
    assert "AMX" in A.expand({"self": m, "layer": layer, "x": x})
    unquant._use_aiter = True
    assert "aiter" in A.expand({"self": m, "layer": _proj(unquant)[1], "x": x})
    unquant._use_aiter = False
    unquant.backend = types.SimpleNamespace(is_cutedsl=lambda: False, is_gemv=lambda: True)  # 0.5.23's gemv
    assert "backend" in A.expand({"self": m, "layer": _proj(unquant)[1], "x": x})
    # the bf16 backends take bf16 only: an fp16 projection still ends in F.linear
    m, layer = _proj(unquant, dtype=torch.float16)
    assert not isinstance(A.expand({"self": m, "layer": layer, "x": x.to(torch.float16)}), str)


def test_moe_gate_asks_the_same_apply_path_rule():
    assert op_part("moe_gate", "adapter").apply_path_problem is ADAPTER_MOD.apply_path_problem


def test_expand_declines_cpu_tensors_outside_tests():
    layer = types.SimpleNamespace(weight=torch.randn(8, 64))
    assert "CUDA" in A.expand({"self": None, "layer": layer, "x": torch.randn(1, 64)})


def test_layer_and_adapter_import_without_sglang():
    assert callable(op_part("linear", "layer").run_layer)
    assert A.op == "linear" and A.max_tokens == ADAPTER_MOD.MAX_TOKENS and A.returned == ("out",)
    assert ADAPTER_MOD.DEFAULT_OFF == ""  # on by default: the step A/B measured it (RESULTS.md)


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.skipif(not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()), reason="needs nvcc")
def test_shipped_kernel_compiles_for_sm90a_and_passes_the_static_checks(tmp_path):
    from astra_sglang.build import find_nvcc
    from astra_sglang.registry import op_dir
    from astra_sglang.static_checks import errors, scan_file

    src = op_dir("linear") / "kernel.cu"
    assert not errors(scan_file(src, []))
    r = subprocess.run([find_nvcc(), "-std=c++20", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", "-o", str(tmp_path / "k.so"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "astra_linear" in subprocess.run(["nm", "-D", str(tmp_path / "k.so")], capture_output=True,
                                            text=True).stdout


def test_the_patched_apply_declines_prefill_before_binding(tmp_path):
    """Through the real patch machinery (a stand-in unquant module, a CPU stand-in backend, in a fresh interpreter):
    a prefill call reaches SGLang's apply without expand ever running and counts as a fallback; a 1-token call is
    the kernel's."""
    script = f'''
import sys, types, tempfile
import torch
for p in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.quantization"):
    sys.modules.setdefault(p, types.ModuleType(p))
mod = types.ModuleType("sglang.srt.layers.quantization.unquant")
seen = []
class UnquantizedLinearMethod:
    def apply(self, layer, x, bias=None):
        seen.append(x.shape[0])
        return torch.nn.functional.linear(x, layer.weight, bias)
mod.UnquantizedLinearMethod = UnquantizedLinearMethod
sys.modules[mod.__name__] = mod
from astra_sglang.registry import op_part
ad = op_part("linear", "adapter")
ad.DEVICES = ("cuda", "cpu")
def no_expand(a):
    raise AssertionError("expand ran for a prefill call")
class Cpu:
    name = "cpu"; devices, dtypes = frozenset({{"cpu"}}), ("bf16", "fp16")
    launched = 0
    def launch(self, views, dims, dt, scalars):
        Cpu.launched += 1
        views["out"].copy_(torch.nn.functional.linear(views["x"], views["weight"]))
from astra_sglang.patch import apply_astra_kernels
from astra_sglang.patch.counters import totals
cdir = {str(tmp_path)!r}
apply_astra_kernels(["linear"], backends={{"linear": Cpu()}}, counter_dir=cdir, propagate=False, plan=False,
                    self_check="off")
m = UnquantizedLinearMethod()
layer = types.SimpleNamespace(weight=torch.randn(16, 64, dtype=torch.bfloat16), quant_method=m)
real = ad.ADAPTER.expand
object.__setattr__(ad.ADAPTER, "expand", no_expand)
out = m.apply(layer, torch.randn(64, 64, dtype=torch.bfloat16))
assert out.shape == (64, 16) and seen == [64], seen
object.__setattr__(ad.ADAPTER, "expand", real)
x1 = torch.randn(1, 64, dtype=torch.bfloat16)
y = m.apply(layer, x1)
assert Cpu.launched == 1 and seen == [64], (Cpu.launched, seen)
assert torch.equal(y, torch.nn.functional.linear(x1, layer.weight))
c = totals(cdir)["linear"]
print(c["calls"], c["fallbacks"])
'''
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    calls, fallbacks = map(int, r.stdout.split()[-2:])
    assert fallbacks == 1 and calls >= 1


def test_the_in_features_bounds_read_their_dev_switches(monkeypatch):
    """ASTRA_LINEAR_MAX_IN_FEATURES / ASTRA_LINEAR_MMA_MAX_IN_FEATURES move the bounds for a step A/B (arm A keeps
    cuBLAS on down_proj); a value that is not a number stops with a one-line error instead of a traceback."""
    for name, default in (("ASTRA_LINEAR_MAX_IN_FEATURES", 24576), ("ASTRA_LINEAR_MMA_MAX_IN_FEATURES", 12288)):
        monkeypatch.delenv(name, raising=False)
        assert ADAPTER_MOD._env_bound(name, default) == default
        monkeypatch.setenv(name, " 16384 ")
        assert ADAPTER_MOD._env_bound(name, default) == 16384
        monkeypatch.setenv(name, "12k")
        with pytest.raises(AstraError, match=f"{name}='12k'"):
            ADAPTER_MOD._env_bound(name, default)
    assert (ADAPTER_MOD.MAX_IN_FEATURES, ADAPTER_MOD.MMA_MAX_IN_FEATURES) == (24576, 12288)


def test_the_rows_the_adapter_took_last_run_on_the_two_row_ctas():
    """MAX_IN_FEATURES went 12288 -> 14336 because the kernel runs such rows on 2-row CTAs (1.10x in context; the
    4-row CTAs tied cuBLAS there, 0.95x on 1 x 14336 -> 3584): every 1-2-token row above 12288 the adapter takes
    must be above kernel.cu's ASTRA_LONG_ROWS. 1-token rows above ASTRA_LONG_ROWS_1 take them too: Qwen3-8B's
    12288-wide down_proj (-1.29% of its batch-1 step; +0.54% at 2 tokens, which keep 12288)."""
    import re

    from astra_sglang.registry import op_dir

    src = (op_dir("linear") / "kernel.cu").read_text()
    long_rows = int(re.search(r"#define ASTRA_LONG_ROWS (\d+)", src).group(1))
    long_rows_1 = int(re.search(r"#define ASTRA_LONG_ROWS_1 (\d+)", src).group(1))
    assert long_rows <= 12288 < ADAPTER_MOD.MAX_IN_FEATURES
    assert long_rows_1 < 12288 <= long_rows
    assert ("if (static_cast<unsigned>(in_features) > static_cast<unsigned>(NT == 1 ? ASTRA_LONG_ROWS_1 : "
            "ASTRA_LONG_ROWS))") in src
    assert "linear_kernel<T, NT, 2>" in src
