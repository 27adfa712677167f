"""moe_combine (kernels/moe_combine/): spec and reference, routes per shape, the adapter against SGLang's
signatures, extraction of both variants (a synthetic sgl-kernel checkout, the 0.5.17 / 0.5.23 wheels, and a
real checkout when ASTRA_SGL_CHECKOUT names one), discovery of every call site, the installed baseline."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from astra_sglang.registry import get_op, op_part
from cli_run import one_error, run_cli  # noqa: E402

SPEC = get_op("moe_combine")


# --------------------------------------------------------------------------- spec
def _spec_mod():
    import importlib

    return importlib.import_module("astra_sglang.kernels.moe_combine.spec")


def test_corpus_routes_and_scales():
    m = _spec_mod()
    dims = {s.dims: s for s in SPEC.corpus}
    for name, h, k, s in m.MOE_MODELS:
        for t in m.DECODE + m.PREFILL:
            assert (t, k, h) in dims, (name, t)
    assert m.route((1, 8, 2048)) == "torch_compile" and m.route((32, 8, 2048)) == "torch_compile"
    assert m.route((64, 8, 2048)) == "sgl_kernel"
    assert m.route((1, 2, 4096)) == "torch_add"  # Mixtral: SGLang's torch.add
    assert "torch_compile" in dims[(8, 9, 7168)].tags and "decode" in dims[(8, 9, 7168)].tags
    assert SPEC.scalars((1, 8, 7168)) == {"routed_scaling_factor": 2.5}
    assert SPEC.scalars((1, 8, 2048)) == {"routed_scaling_factor": 1.0}
    assert SPEC.bytes_moved((2, 8, 2048), "bf16") == 2 * 2048 * 9 * 2
    # tags select: the rows whose production is the installed torch.compile callable
    assert {s.dims[0] for s in SPEC.shapes("torch_compile")} == {1, 8, 32}


def test_reference_and_inputs_on_cpu():
    import torch

    g = torch.Generator().manual_seed(0)
    for dist in SPEC.distributions:
        for dt in SPEC.dtypes:
            inp = SPEC.make_inputs((3, 4, 16), dt, g, dist=dist, device="cpu")
            assert tuple(inp["input"].shape) == (3, 4, 16) and tuple(inp["output"].shape) == (3, 16)
            assert inp["input"].abs().sum() > 0
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    ref = SPEC.reference({"input": x}, (2, 3, 8), {"routed_scaling_factor": 2.5})["output"]
    want = torch.stack([sum(x[t, k] for k in range(3)) * 2.5 for t in range(2)])
    assert torch.allclose(ref, want, rtol=0, atol=1e-12)


def test_variant_support_says_why():
    sgl, jit = SPEC.variant("sgl_kernel"), SPEC.variant("jit_topk_sum")
    assert sgl.supports((300, 8, 2056), "bf16") and "never written" in sgl.supports((300, 8, 2056), "bf16")
    assert sgl.supports((300, 8, 2056), "fp16") is None and sgl.supports((256, 8, 2056), "bf16") is None
    assert jit.supports((1, 8, 2048), "bf16") is None
    assert "bf16 only" in jit.supports((1, 8, 2048), "fp16")
    assert "scale" in jit.supports((1, 8, 7168), "bf16")
    assert SPEC.default_variant({"sglang_jit": True}) == "jit_topk_sum"
    assert SPEC.default_variant({"sglang_jit": True, "sglang_checkout": True}) == "sgl_kernel"
    # installed: only the rows fused_moe hands sgl_kernel.moe_sum_reduce (its prefill corpus)
    inst = SPEC.variant("installed")
    assert inst.installed and inst.callable == "sgl_kernel:moe_sum_reduce"
    assert "torch.compile" in inst.supports((32, 8, 2048), "bf16") and "torch.add" in inst.supports((4096, 2, 4096), "bf16")
    assert inst.supports((33, 8, 2048), "bf16") is None and inst.supports((16384, 9, 7168), "bf16") is None
    assert "never written" in inst.supports((300, 8, 2056), "bf16")
    prefill = [s.dims for s in SPEC.corpus if "prefill" in s.tags and "sgl_kernel" in s.tags]
    assert prefill and all(inst.supports(d, "bf16") is None for d in prefill)


# --------------------------------------------------------------------------- adapter
def _sglang_signatures():
    # SGLang's signatures (fused_moe.py, sgl_kernel/moe.py, fused_moe_triton_kernels.py); bodies not needed
    def moe_sum_reduce_torch_compile(x, out, routed_scaling_factor):
        pass

    def moe_sum_reduce(input_tensor, output_tensor, routed_scaling_factor=0):
        pass

    def moe_sum_reduce_triton(input, output, routed_scaling_factor):
        pass

    return moe_sum_reduce_torch_compile, moe_sum_reduce, moe_sum_reduce_triton


def test_adapter_binds_every_sglang_signature_and_normalizes():
    import torch

    from astra_sglang.patch.adapters import Binder, adapter_mismatch

    ad = op_part("moe_combine", "adapter")
    assert not ad.DEFAULT_OFF and ad.ADAPTER.kept_by_sglang((32, 8, 2048)) is None  # on for the <= 32-token route
    assert adapter_mismatch(SPEC, ad.ADAPTER) is None
    x, out = torch.randn(3, 8, 64), torch.empty(3, 64)
    for fn in _sglang_signatures():
        b = Binder(fn, ad.ADAPTER, SPEC)
        assert b.ok, (fn.__name__, b.problem)
        canon, _ = b.bind((x, out, 2.5), {})
        assert canon["input"] is x and canon["output"] is out and canon["routed_scaling_factor"] == 2.5
        views, dims = ad.ADAPTER.normalize(dict(canon))
        assert dims == (3, 8, 64) and views["output"] is out
    canon, _ = Binder(_sglang_signatures()[1], ad.ADAPTER, SPEC).bind((x, out), {})
    c = dict(canon)
    ad.ADAPTER.normalize(c)
    assert c["routed_scaling_factor"] == 0.0  # sgl_kernel's default, passed through
    norm = ad.ADAPTER.normalize
    assert "not contiguous" in norm({"input": x.transpose(0, 1), "output": torch.empty(8, 64)})
    assert "output shape" in norm({"input": x, "output": torch.empty(3, 32)})
    assert "2-d, not" in norm({"input": x[0], "output": out})


# --------------------------------------------------------------------------- discovery / installed
@pytest.mark.wheels
def test_discovery_finds_every_call_site(wheel_sources, sglang_0_5_17_source):
    from astra_sglang.patch.discover import discover_for_specs

    for src, ver in ((sglang_0_5_17_source, "0.5.17"), (wheel_sources["sglang"], "0.5.23")):
        pkg = Path(src) / "sglang"
        d = discover_for_specs([SPEC], roots={"sglang": pkg})
        sites = {(s.kind, s.module, s.target) for s in d.for_op("moe_combine")}
        fm = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
        assert ("definition", fm, f"{fm}:moe_sum_reduce_torch_compile") in sites, ver
        assert ("import_binding", fm, "sgl_kernel:moe_sum_reduce") in sites, ver
        assert ("import_binding", fm, "sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton") in sites
        assert ("import_binding", "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe",
                "sgl_kernel:moe_sum_reduce") in sites, ver


def test_installed_baseline_is_the_torch_compile_path(monkeypatch):
    import importlib.util

    from astra_sglang.harness.installed import resolve_installed

    have = {"sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe", "sgl_kernel"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: object() if m in have else None)
    assert resolve_installed(SPEC).endswith("fused_moe:moe_sum_reduce_torch_compile")


# --------------------------------------------------------------------------- extraction
# A stand-in with the structure extract relies on in sgl-kernel's csrc/moe/moe_sum_reduce.cu: the device part
# (to_acc ... the warp-per-token general kernel) and a torch-bound host function holding the dispatch facts.
# Written for this test (simple loops); it is not SGLang's file.
SYNTHETIC_MSR_CU = r"""
#include <ATen/OpMathType.h>
#include <torch/all.h>
template <typename T>
using opmath_t = at::opmath_type<T>;

template <typename T>
__device__ __forceinline__ opmath_t<T> to_acc(T x) { return static_cast<opmath_t<T>>(x); }
template <typename T>
__device__ __forceinline__ T from_acc(opmath_t<T> x) { return static_cast<T>(x); }
template <>
__device__ __forceinline__ opmath_t<at::Half> to_acc<at::Half>(at::Half x) { return __half2float(x); }
template <>
__device__ __forceinline__ at::Half from_acc<at::Half>(opmath_t<at::Half> x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ opmath_t<at::BFloat16> to_acc<at::BFloat16>(at::BFloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ at::BFloat16 from_acc<at::BFloat16>(opmath_t<at::BFloat16> x) { return __float2bfloat16_rn(x); }

#define ASTRA_TEST_BODY(KCOUNT)                                                      \
  for (int64_t t = 0; t < token_num; ++t)                                            \
    for (int64_t d = threadIdx.x; d < hidden_dim; d += blockDim.x) {                 \
      opmath_t<scalar_t> acc = 0;                                                    \
      for (int k = 0; k < KCOUNT; ++k) acc += to_acc<scalar_t>(x[t * stride_token + k * stride_topk + d]); \
      y[t * out_stride_token + d] = from_acc<scalar_t>(acc * scale);                 \
    }

template <int WARPS_PER_BLOCK>
__global__ void moe_sum_reduce_warp_per_token_vec_kernel(const at::BFloat16* x, at::BFloat16* y, const int64_t token_num,
    const int64_t hidden_dim, const int64_t topk_num, const int64_t stride_token, const int64_t stride_topk,
    const int64_t out_stride_token, const float scale) {
  using scalar_t = at::BFloat16;
  ASTRA_TEST_BODY(topk_num)
}
template <typename scalar_t, int TOPK, int WARPS_PER_BLOCK>
__global__ void moe_sum_reduce_kernel_warp_token_topk(const scalar_t* x, scalar_t* y, const int64_t token_num,
    const int64_t hidden_dim, const int64_t stride_token, const int64_t stride_topk, const int64_t out_stride_token,
    const opmath_t<scalar_t> scale) { ASTRA_TEST_BODY(TOPK) }
template <typename scalar_t, int TOPK>
__global__ void moe_sum_reduce_kernel(const scalar_t* x, scalar_t* y, const int64_t token_num,
    const int64_t hidden_dim, const int64_t stride_token, const int64_t stride_topk, const int64_t out_stride_token,
    const opmath_t<scalar_t> scale) { ASTRA_TEST_BODY(TOPK) }
template <typename scalar_t>
__global__ void moe_sum_reduce_kernel_general(const scalar_t* x, scalar_t* y, const int64_t token_num,
    const int64_t hidden_dim, const int64_t stride_token, const int64_t stride_topk, const int64_t out_stride_token,
    const int topk_num, const opmath_t<scalar_t> scale) { ASTRA_TEST_BODY(topk_num) }
template <typename scalar_t, int WARPS_PER_BLOCK>
__global__ void moe_sum_reduce_kernel_warp_token_general(const scalar_t* x, scalar_t* y, const int64_t token_num,
    const int64_t hidden_dim, const int64_t stride_token, const int64_t stride_topk, const int64_t out_stride_token,
    const int topk_num, const opmath_t<scalar_t> scale) {
  ASTRA_TEST_BODY(topk_num)
}

void moe_sum_reduce(at::Tensor& input, at::Tensor& output, double routed_scaling_factor) {
  const bool fast_bf16_vec_ok = (input.scalar_type() == at::kBFloat16) && (token_num > 256) && (hidden_dim % 8 == 0);
  if (fast_bf16_vec_ok) {
    constexpr int WARPS_PER_BLOCK = 8;
    constexpr int THREADS = WARPS_PER_BLOCK * 32;
    const int64_t n_chunks = hidden_dim / 8;
    int64_t grid_x = (n_chunks + 32 - 1) / 32;
  }
  const bool per_token_use_one_warp = (token_num > 128);
  if (!per_token_use_one_warp) {
    const int block_size = 256;
    int64_t grid_x = (hidden_dim + block_size - 1) / block_size;
    switch (topk_num) {
      case 2: LAUNCH_SMALL_TOKEN_KERNEL(2); break;
      case 4: LAUNCH_SMALL_TOKEN_KERNEL(4); break;
      case 8: LAUNCH_SMALL_TOKEN_KERNEL(8); break;
      case 9: LAUNCH_SMALL_TOKEN_KERNEL(9); break;
    }
  } else {
    constexpr int WARPS_PER_BLOCK = 4;
    constexpr int THREADS = WARPS_PER_BLOCK * 32;
    int64_t gx = (hidden_dim + 32 - 1) / 32;
  }
}
"""


def _fake_checkout(root: Path, text: str = SYNTHETIC_MSR_CU) -> Path:
    (root / "sgl-kernel" / "csrc" / "moe").mkdir(parents=True)
    (root / "sgl-kernel" / "include").mkdir(parents=True)
    (root / "sgl-kernel" / "csrc" / "moe" / "moe_sum_reduce.cu").write_text(text)
    (root / "sgl-kernel" / "pyproject.toml").write_text('[project]\nname = "sglang-kernel"\nversion = "0.4.5"\n')
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
    return root


@pytest.mark.nvcc
def test_sgl_kernel_variant_from_a_checkout_compiles(tmp_path, capsys):
    co = _fake_checkout(tmp_path / "sglang")
    code, _, err = run_cli(["extract", "moe_combine", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(co)], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / "moe_combine" / "manifest.json").read_text())
    assert m["variant"] == "sgl_kernel"
    assert m["launch_facts"] == {"VEC_MIN_TOKENS": "256", "VEC_WARPS": "8", "WARP_MIN_TOKENS": "128",
                                 "SMALL_BLOCK": "256", "WARP_WARPS": "4"}
    ex = (tmp_path / "ws" / "moe_combine" / "src" / "excerpts" / "moe_sum_reduce_kernels.cuh").read_text()
    assert "moe_sum_reduce_kernel_warp_token_general" in ex and "at::Tensor" not in ex and "opmath_type" not in ex


@pytest.mark.nvcc  # extract checks for nvcc before reading sources
def test_changed_dispatch_fails_loudly(tmp_path, capsys):
    co = _fake_checkout(tmp_path / "sglang", SYNTHETIC_MSR_CU.replace("(token_num > 128)", "(token_num > 128 + x)"))
    code, _, err = run_cli(["extract", "moe_combine", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(co), "--no-build"], capsys)
    assert code != 0
    one_error(err, "warp-per-token kernels above WARP_MIN_TOKENS", "needs a launcher update")
    assert not (tmp_path / "ws" / "moe_combine").exists()


@pytest.mark.nvcc
@pytest.mark.skipif(not os.environ.get("ASTRA_SGL_CHECKOUT"), reason="ASTRA_SGL_CHECKOUT names no sglang checkout")
def test_sgl_kernel_variant_from_a_real_checkout(tmp_path, capsys):
    code, _, err = run_cli(["extract", "moe_combine", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", os.environ["ASTRA_SGL_CHECKOUT"]], capsys)
    assert code == 0, err


@pytest.mark.wheels
@pytest.mark.nvcc
def test_jit_topk_sum_variant_from_both_wheels(tmp_path, capsys, wheel_sources, sglang_0_5_17_source):
    for i, src in enumerate((sglang_0_5_17_source, wheel_sources["sglang"])):
        out = tmp_path / f"ws{i}"
        code, _, err = run_cli(["extract", "moe_combine", "--arch", "sm_90", "--out", str(out), "--sglang-src",
                                 str(src), "--flashinfer-src", str(wheel_sources["flashinfer"]), "--tvm-ffi-src",
                                 str(wheel_sources["tvm"])], capsys)
        assert code == 0, err
        assert json.loads((out / "moe_combine" / "manifest.json").read_text())["variant"] == "jit_topk_sum"


@pytest.mark.wheels
def test_installed_variant_from_both_wheels(tmp_path, capsys, wheel_sources, sglang_0_5_17_source):
    """No checkout needed: the installed sgl_kernel.moe_sum_reduce is production, and fused_moe's route to it (above
    32 tokens, not topk 2 at scale 1) holds in 0.5.17 and 0.5.23."""
    for i, src in enumerate((sglang_0_5_17_source, wheel_sources["sglang"])):
        out = tmp_path / f"ws{i}"
        code, _, err = run_cli(["extract", "moe_combine", "--variant", "installed", "--arch", "sm_90", "--no-build",
                                 "--out", str(out), "--sglang-src", str(src)], capsys)
        assert code == 0, err
        m = json.loads((out / "moe_combine" / "manifest.json").read_text())
        assert (m["kind"], m["callable"], m["variant"]) == ("installed", "sgl_kernel:moe_sum_reduce", "installed")
        assert int(m["launch_facts"]["COMPILE_MAX_TOKENS"]) == _spec_mod().COMPILE_MAX_TOKENS == 32
        assert len(m["source_facts"]) == 3


@pytest.mark.nvcc
def test_shipped_kernel_compiles_for_sm90a(tmp_path):
    from astra_sglang.build import find_nvcc

    src = Path(__file__).resolve().parents[1] / "kernels" / "moe_combine" / "kernel.cu"
    lib = tmp_path / "k.so"
    r = subprocess.run([find_nvcc(), "-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "astra_moe_combine(const void* input, void* output" in src.read_text()


def test_precheck_declines_prefill_calls_off_the_raw_arguments():
    """A combine of more than TAKE_MAX_TOKENS tokens leaves before binding, whichever SGLang callable and argument
    name carried it; smaller or other-shaped calls are prepare's to decide."""
    import torch

    mod = op_part("moe_combine", "adapter")
    pre, n = mod.ADAPTER.precheck, mod.TAKE_MAX_TOKENS
    many = torch.randn(n + 1, 8, 16)
    assert "tokens" in pre((many, None), {})
    for name in ("x", "input", "input_tensor"):
        assert "tokens" in pre((), {name: many})
    assert pre((torch.randn(n, 8, 16), None), {}) is None and pre((torch.randn(n + 1, 16), None), {}) is None
    assert pre((), {}) is None


def test_takes_the_compiled_route_and_129_to_256_tokens_of_sgl_kernels():
    """The kernel takes <= 32 tokens (SGLang's compiled or Triton sum) and 129-256 (sgl_kernel.moe_sum_reduce, where
    every 256-token row won in context, 2026-12-02); 33-128 (64-token rows lost) and prefill stay SGLang's."""
    mod = op_part("moe_combine", "adapter")
    kept = mod.ADAPTER.kept_by_sglang
    for t in (1, 8, 32, 129, 200, 256):
        assert kept((t, 8, 2048)) is None, t
    for t in (33, 64, 128):
        assert "within 33-128" in kept((t, 8, 2048)), t
    for t in (257, 1024, 16384):
        assert "more than 256 tokens" in kept((t, 9, 7168)), t
