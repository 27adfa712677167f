"""moe_gate (kernels/moe_gate/): the MoE router's logits GEMM at decode sizes, replacing SGLang's ReplicatedLinear gate
(F.linear -> cuBLAS). The spec and its fp64 reference, the corpus from real configs, the installed-variant extract
against the real sglang 0.5.17 and 0.5.23 sources (a changed fact fails it), the harness's installed baseline
resolving a layer method, the adapter's routing (which ReplicatedLinear calls it takes: stand-in layers and a stand-in
unquant module, as a unit test of the decisions), and the shipped kernel's sm_90a build.

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

from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import one_error, run_cli  # noqa: E402

SPEC = get_op("moe_gate")
ADAPTER_MOD = op_part("moe_gate", "adapter")
A = ADAPTER_MOD.ADAPTER


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_and_symbols():
    assert SPEC.symbol == "astra_moe_gate"
    assert SPEC.dim_names == ("num_tokens", "hidden", "num_experts")
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_moe_gate(const void* x, const void* weight, void* out, int64_t num_tokens, '
        "int64_t hidden, int64_t num_experts, int dtype, cudaStream_t stream)")
    assert SPEC.replaces == ("sglang.srt.layers.linear:ReplicatedLinear.forward",)
    assert [v.name for v in SPEC.variants] == ["installed"]
    assert SPEC.variant("installed").callable == SPEC.replaces[0]
    import re

    pat = re.compile(SPEC.kernel_symbols[0])
    assert pat.search("void astra_moeg::(anonymous namespace)::moe_gate_kernel<__nv_bfloat16, 8>(...)")
    assert not pat.search("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT")


def test_corpus_covers_the_gate_models_at_decode_and_prefill():
    dims = {s.dims for s in SPEC.corpus}
    assert (1, 2048, 128) in dims and (32, 2048, 128) in dims  # Qwen3-30B-A3B
    assert (1, 4096, 8) in dims  # Mixtral
    assert {s.tags[0] for s in SPEC.corpus} == {"decode", "prefill"}
    assert all(s.dims[1] <= ADAPTER_MOD.MAX_HIDDEN and s.dims[2] <= ADAPTER_MOD.MAX_EXPERTS for s in SPEC.corpus)
    assert any(s.dims[1] % 8 for s in SPEC.edge_shapes)  # the kernel's scalar path


@pytest.mark.parametrize("dist", ["normal", "outlier"])
def test_reference_is_the_fp64_product(dist):
    g = torch.Generator().manual_seed(0)
    inp = SPEC.make_inputs((3, 256, 12), "bf16", g, dist=dist, device="cpu")
    assert inp["x"].dtype == inp["weight"].dtype == inp["out"].dtype == torch.bfloat16
    assert tuple(inp["out"].shape) == (3, 12)
    ref = SPEC.reference(inp, (3, 256, 12), {})["out"]
    want = inp["x"].double() @ inp["weight"].double().t()
    assert ref.dtype == torch.float64 and torch.equal(ref, want)
    # logits of a trained-like gate: order 1, not order sqrt(hidden)
    if dist == "normal":
        assert 0.3 < float(ref.std()) < 3.0
    assert SPEC.bytes_moved((1, 2048, 128), "bf16") == (2048 + 128 * 2048 + 128) * 2


# ------------------------------------------------------------------------------------------ installed variant
def _src(which, sglang_0_5_17_source, wheel_sources):
    return Path(sglang_0_5_17_source) if which == "0.5.17" else Path(wheel_sources["sglang"])


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, sglang_0_5_17_source,
                                                             wheel_sources):
    code, _, err = run_cli(["extract", "moe_gate", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(_src(which, sglang_0_5_17_source, wheel_sources))], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / "moe_gate" / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == "sglang.srt.layers.linear:ReplicatedLinear.forward"
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == which


@pytest.mark.wheels
def test_extract_fails_when_the_gate_gets_a_bias(tmp_path, capsys, sglang_0_5_17_source):
    pkg = tmp_path / "sglang-copy" / "sglang"
    for rel in ("srt/models/qwen3_moe.py", "srt/layers/linear.py", "srt/layers/quantization/unquant.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(sglang_0_5_17_source) / "sglang" / rel, pkg / rel)
    f = pkg / "srt/models/qwen3_moe.py"
    f.write_text(f.read_text().replace("config.num_experts,\n            bias=False,",
                                       "config.num_experts,\n            bias=True,"))
    code, _, err = run_cli(["extract", "moe_gate", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(tmp_path / "sglang-copy")], capsys)
    assert code == 2
    one_error(err, "qwen3_moe.py", "bias-free")
    assert not (tmp_path / "ws" / "moe_gate").exists()


def test_installed_impl_resolves_a_layer_method(monkeypatch):
    """The installed baseline names ReplicatedLinear.forward (module:Class.method); the binder then runs the
    adapter's `sequence` (F.linear into the ABI's out), as the patch's fallback does."""
    from astra_sglang.harness.installed import InstalledImpl

    mod = types.ModuleType("sglang.srt.layers.linear")

    class ReplicatedLinear:
        def forward(self, x):
            raise AssertionError("the binder runs the adapter's sequence, not the method")

    mod.ReplicatedLinear = ReplicatedLinear
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.linear", mod)
    impl = InstalledImpl(SPEC.replaces[0], SPEC)
    assert impl.fn is ReplicatedLinear.forward and impl.returns_outputs
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


def _gate(unquant, e=128, h=2048, dtype=torch.bfloat16, bias=None, method=None):
    return types.SimpleNamespace(weight=torch.randn(e, h).to(dtype), bias=bias, skip_bias_add=False,
                                 quant_method=method or unquant.UnquantizedLinearMethod())


def test_expand_takes_qwen3_moes_gate_and_allocates_like_f_linear(unquant):
    layer = _gate(unquant)
    x = torch.randn(8, 2048).to(torch.bfloat16)
    c = A.expand({"self": layer, "x": x})
    assert not isinstance(c, str), c
    assert c["out"].shape == (8, 128) and c["out"].dtype == torch.bfloat16
    views, dims = A.normalize(c)
    assert dims == (8, 2048, 128) and views["weight"] is layer.weight
    A.sequence(c)
    assert torch.equal(c["out"], torch.nn.functional.linear(x, layer.weight))
    out, out_bias = A.returns(c)
    assert out is c["out"] and out_bias is None


@pytest.mark.parametrize("why,layer_kw,x_shape,x_dtype", [
    ("bias", {"bias": torch.zeros(128)}, (1, 2048), torch.bfloat16),
    ("router", {"e": 2048}, (1, 2048), torch.bfloat16),                 # a projection, not a router
    ("router", {"h": 16384, "e": 8}, (1, 16384), torch.bfloat16),       # wider than the kernel's rows
    ("tokens", {}, (ADAPTER_MOD.MAX_TOKENS + 1, 2048), torch.bfloat16),  # prefill: cuBLAS
    ("fp16 / bf16", {"dtype": torch.float32}, (1, 2048), torch.float32),
    ("fp16 / bf16", {}, (1, 2048), torch.float16),                      # x and weight disagree
    ("does not match", {}, (1, 1024), torch.bfloat16),
])
def test_expand_leaves_other_linears_to_the_method(unquant, why, layer_kw, x_shape, x_dtype):
    layer = _gate(unquant, **layer_kw)
    r = A.expand({"self": layer, "x": torch.randn(*x_shape).to(x_dtype)})
    assert isinstance(r, str) and why in r, r


def test_expand_follows_sglangs_own_apply_branches(unquant):
    x = torch.randn(1, 2048).to(torch.bfloat16)
    assert "unquantized" in A.expand({"self": _gate(unquant, method=object()), "x": x})
    layer = _gate(unquant)
    layer.use_intel_amx_backend = True
    assert "AMX" in A.expand({"self": layer, "x": x})
    unquant._use_aiter = True
    assert "aiter" in A.expand({"self": _gate(unquant), "x": x})
    unquant._use_aiter = False
    unquant.backend = types.SimpleNamespace(is_cutedsl=lambda: False, is_gemv=lambda: True)  # 0.5.23's gemv backend
    assert "backend" in A.expand({"self": _gate(unquant), "x": x})
    # the bf16 backends take bf16 only: an fp16 gate still ends in F.linear
    assert not isinstance(A.expand({"self": _gate(unquant, dtype=torch.float16), "x": x.to(torch.float16)}), str)


def test_expand_declines_cpu_tensors_outside_tests():
    layer = types.SimpleNamespace(weight=torch.randn(8, 64), bias=None)
    assert "CUDA" in A.expand({"self": layer, "x": torch.randn(1, 64)})


def test_layer_and_adapter_import_without_sglang():
    assert callable(op_part("moe_gate", "layer").run_layer)
    assert A.op == "moe_gate" and A.max_tokens == ADAPTER_MOD.MAX_TOKENS and A.returned == ("out",)
    assert ADAPTER_MOD.DEFAULT_OFF == ""  # on by default: the step A/B measured it (RESULTS.md)


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.skipif(not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()), reason="needs nvcc")
def test_shipped_kernel_compiles_for_sm90a_and_passes_the_static_checks(tmp_path):
    from astra_sglang.build import find_nvcc
    from astra_sglang.registry import op_dir
    from astra_sglang.static_checks import errors, scan_file

    src = op_dir("moe_gate") / "kernel.cu"
    assert not errors(scan_file(src, []))
    r = subprocess.run([find_nvcc(), "-std=c++20", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", "-o", str(tmp_path / "k.so"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "astra_moe_gate" in subprocess.run(["nm", "-D", str(tmp_path / "k.so")], capture_output=True,
                                              text=True).stdout


def test_tensor_core_fragments_compute_the_product():
    """The mma path's lane -> k mapping (kernel.cu moe_gate_mma_kernel) against PTX's m16n8k16 fragment layouts,
    emulated: lane (g, q) loads 8 consecutive k of expert rows g, g + 8 and of token g per 32-wide chunk; words 0-1 feed
    mma 0, words 2-3 mma 1; word j of a pair fills k slots (2q, 2q + 1) for j = 0 and (2q + 8, 2q + 9) for j = 1, in A
    (regs {row g, row g + 8} x {slots 2q.., 2q + 8..}) and B alike. The sum over every chunk must be x @ W^T."""
    g_ = torch.Generator().manual_seed(2)
    hidden, warps = 512, 8
    W = torch.randn(16, hidden, generator=g_, dtype=torch.float64)
    X = torch.randn(8, hidden, generator=g_, dtype=torch.float64)
    C = torch.zeros(16, 8, dtype=torch.float64)
    for warp in range(warps):
        for i in range(hidden // (32 * warps)):
            base = (i * warps + warp) * 32
            for m in range(2):  # the two mmas of a chunk
                A = torch.zeros(16, 16, dtype=torch.float64)  # the fragment as PTX reads it: [row][k slot]
                B = torch.zeros(16, 8, dtype=torch.float64)   # [k slot][token]
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    k = base + 8 * q
                    for j in range(2):      # word 2m + j of the lane's 16-byte load
                        for h in range(2):  # low / high half of the word
                            phys = k + 4 * m + 2 * j + h
                            slot = 2 * q + 8 * j + h
                            A[g, slot] = W[g, phys]
                            A[g + 8, slot] = W[g + 8, phys]
                            B[slot, g] = X[g, phys]
                C += A @ B
    assert torch.allclose(C, W @ X.t(), rtol=1e-12, atol=1e-9)


def test_precheck_declines_prefill_calls_off_the_raw_arguments():
    """ReplicatedLinear.forward(self, x) with a prefill-sized x leaves before binding (every eager prefill of every
    ReplicatedLinear passes here); anything else is expand's to decide."""
    pre = ADAPTER_MOD.ADAPTER.precheck
    many = torch.randn(ADAPTER_MOD.MAX_TOKENS + 1, 64)
    assert "tokens" in pre((None, many), {}) and "tokens" in pre((None,), {"x": many})
    assert pre((None, torch.randn(ADAPTER_MOD.MAX_TOKENS, 64)), {}) is None
    assert pre((None, "not a tensor"), {}) is None and pre((None,), {}) is None
