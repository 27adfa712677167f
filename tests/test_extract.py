"""`astra-sglang extract`: real sglang / flashinfer-python / apache-tvm-ffi wheels in, standalone
workspaces out that compile with nvcc alone (sm_90, no GPU); manifests; bad input."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from astra_sglang.build import nvcc as build_mod
from astra_sglang.build import Arch
from astra_sglang.errors import AstraError
from astra_sglang.extract import available_variants, discover, extract
from astra_sglang.extract import extractor as extractor_mod
from astra_sglang.extract import sources as sources_mod
from astra_sglang.extract.extractor import validate_dtype
from astra_sglang.registry import get_op, op_names
from astra_sglang.build.workspace import Workspace
from cli_run import one_error, run_cli  # noqa: E402

# Every variant extractable from the wheels alone (merge_state's sgl_kernel needs a checkout).
WHEEL_VARIANTS: List[Tuple[str, str]] = [
    ("silu_and_mul", "jit"),
    ("silu_and_mul", "aot"),
    ("fused_add_rmsnorm", "flashinfer"),
    ("fused_add_rmsnorm", "jit_hf"),
    ("merge_state", "flashinfer"),
]
DEFAULTS_FROM_WHEELS = {"silu_and_mul": "jit", "fused_add_rmsnorm": "flashinfer", "merge_state": "flashinfer"}
COLD_BUILD_GOAL_S = 10.0  # the goal per workspace
COLD_BUILD_LIMIT_S = 180.0  # what the test enforces (CI machines vary; the real time is printed)


def _src_args(ws: Dict[str, Path]) -> List[str]:
    return ["--sglang-src", str(ws["sglang"]), "--flashinfer-src", str(ws["flashinfer"]), "--tvm-ffi-src", str(ws["tvm"])]


def _tree_digest(root: Path) -> Dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def wheel_roots(wheel_sources):
    return discover(wheel_sources["sglang"], wheel_sources["flashinfer"], wheel_sources["tvm"])


@pytest.fixture(scope="session")
def built(wheel_sources, wheel_roots, tmp_path_factory):
    """Every wheel variant extracted for sm_90 and cold-built once: {(op, variant): (ws, BuildResult)}."""
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        pytest.skip("needs nvcc")
    root = tmp_path_factory.mktemp("ws")
    out = {}
    for op, variant in WHEEL_VARIANTS:
        dest = root / variant / op
        extract(get_op(op), wheel_roots, dest, Arch(9, 0), variant=variant)
        ws = Workspace.open(op, path=dest)
        out[(op, variant)] = (ws, ws.build())
    rows = [f"  {op:18s} {v:11s} {res.seconds:6.1f} s{'' if res.ok else '  FAILED'}" for (op, v), (_, res) in out.items()]
    print("\ncold nvcc builds for sm_90 (goal <= %.0f s each):\n%s" % (COLD_BUILD_GOAL_S, "\n".join(rows)))
    return out


# --------------------------------------------------------------------------- real wheels


# ops whose launcher was written against SGLang 0.5.17 (the serving version on the GPU machines) and
# refuses the pinned newer wheel's source by its source facts, as `extract --list` says
NEEDS_LAUNCHER_UPDATE = {"moe_align": "0.5.23's JIT align kernel takes new template flags and a rounded buffer"}


@pytest.mark.wheels
def test_wheel_variants_are_the_defaults_plus_every_available(wheel_roots):
    found = set()
    for op in op_names():  # every registered op: its default extracts from the wheels alone
        spec = get_op(op)
        default = spec.default_variant({n: True for n in wheel_roots.roots})
        avail = {v.name: (ok, why) for v, ok, why in available_variants(spec, wheel_roots)}
        if op in NEEDS_LAUNCHER_UPDATE:
            assert not avail[default][0] and "needs a launcher update" in avail[default][1], (op, avail[default])
            continue
        assert avail[default][0], (op, default, avail[default][1])
        if op not in DEFAULTS_FROM_WHEELS:
            continue  # a newer op: its own tests cover its variants
        assert default == DEFAULTS_FROM_WHEELS[op]
        for name, (ok, why) in avail.items():
            if ok:
                found.add((op, name))
            else:
                assert (op, name) == ("merge_state", "sgl_kernel") and "sglang_checkout" in why
    assert found == set(WHEEL_VARIANTS)


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("op,variant", WHEEL_VARIANTS, ids=[f"{o}-{v}" for o, v in WHEEL_VARIANTS])
def test_extracted_workspace_compiles_for_sm90(built, op, variant):
    ws, res = built[(op, variant)]
    assert res.ok, res.log[-3000:]
    assert res.library is not None and res.library.exists() and not res.cached
    print(f"cold build {op}/{variant}: {res.seconds:.1f} s (goal <= {COLD_BUILD_GOAL_S:.0f} s)")
    assert res.seconds < COLD_BUILD_LIMIT_S
    # the library exports the ABI entry point
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    assert get_op(op).symbol in syms
    # the content-hashed cache: an identical rebuild is free
    again = ws.build()
    assert again.ok and again.cached and again.library == res.library


@pytest.mark.wheels
@pytest.mark.nvcc
def test_manifest_records_versions_hashes_and_flags(built, wheel_sources):
    for (op, variant), (ws, _) in built.items():
        m = ws.manifest
        spec = get_op(op)
        assert m["op"] == op and m["variant"] == variant and m["arch"] == "sm_90"
        assert m["abi"] == spec.c_signature() and m["symbol"] == spec.symbol
        assert m["nvcc"] and m["created"] and m["provenance"] == spec.variant(variant).provenance
        # versions and where each root came from
        for name, src in m["sources"].items():
            assert Path(src["path"]).exists() and src["origin"] == "wheel-dir"
            want = {"sglang_jit": "0.5.23", "flashinfer": "0.7.2", "tvm_ffi": "0.1.11", "dlpack": "0.1.11"}[name]
            assert src["version"].startswith(want), (name, src)
        # every copied file is present with the recorded content hash; the closure hash covers them
        assert m["files"]
        for rel, sha in m["files"].items():
            assert hashlib.sha256((ws.path / rel).read_bytes()).hexdigest() == sha, rel
        assert m["closure_sha256"] == hashlib.sha256(json.dumps(m["files"], sort_keys=True).encode()).hexdigest()
        assert "cuda_runtime.h" in m["external_includes"]
        assert not any(e.startswith(("flashinfer/", "sgl_kernel/", "tvm/")) for e in m["external_includes"])
        # flags reproduce the production build
        f = m["flags"]
        assert "-gencode=arch=compute_90a,code=sm_90a" in f and "-DSGL_CUDA_ARCH=900" in f
        if spec.variant(variant).flag_profile == "sglang_jit":
            assert "-std=c++20" in f
        if spec.variant(variant).flag_profile == "sgl_kernel_aot":
            for flag in ("-std=c++17", "-use_fast_math", "-maxrregcount=128", "-U__CUDA_NO_HALF_OPERATORS__",
                         "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                         "-U__CUDA_NO_HALF2_OPERATORS__", "-DFLASHINFER_ENABLE_BF16"):
                assert flag in f, flag
        if spec.variant(variant).flag_profile == "flashinfer_jit":
            assert "-std=c++17" in f and "-use_fast_math" in f
        assert spec.symbol in ws.baseline.read_text()
        assert "@" not in "".join(ln for ln in ws.baseline.read_text().splitlines() if not ln.startswith("//"))
        ninja = (ws.path / "build.ninja").read_text()
        assert "baseline.so" in ninja and " ".join(f) in ninja
    jit = built[("silu_and_mul", "jit")][0].manifest
    assert jit["launch_facts"]["BLOCK_SIZE"] and jit["launch_facts"]["ACT_LAUNCH_BOUNDS"] == "256"
    assert built[("merge_state", "flashinfer")][0].manifest["attrs"]["lse_base"] == 2.0
    norm = built[("fused_add_rmsnorm", "flashinfer")][0].manifest
    assert set(norm["shims"]) == {"cublasLt.h", "cublas_v2.h", "curand_kernel.h"}


@pytest.mark.wheels
@pytest.mark.nvcc
def test_cli_extracts_and_builds_the_default_variant(wheel_sources, tmp_path, capsys):
    code, out, err = run_cli(["extract", "merge_state", "--arch", "sm_90", "--out", str(tmp_path)]
                              + _src_args(wheel_sources), capsys)
    assert code == 0, err
    assert out.strip() == str(tmp_path / "merge_state")
    assert "cold build" in err and "variant flashinfer" in err
    m = json.loads((tmp_path / "merge_state" / "manifest.json").read_text())
    assert m["variant"] == "flashinfer"


@pytest.mark.wheels
def test_list_shows_ops_variants_and_sources(wheel_sources, capsys):
    code, out, err = run_cli(["extract", "--list"] + _src_args(wheel_sources), capsys)
    assert code == 0, err
    for op in op_names():
        assert f"\n{op}\n" in f"\n{out}"
    assert "* jit " in out and "* flashinfer " in out
    assert "sgl_kernel   unavailable (missing sglang_checkout)" in out
    assert "source sglang_jit       0.5.23" in out


# --------------------------------------------------------------------------- bad input


def test_unknown_op_lists_the_known_ones(capsys):
    code, _, err = run_cli(["extract", "no_such_op", "--arch", "sm_90"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    one_error(err, "unknown op 'no_such_op'", *op_names())


def test_unknown_op_via_the_console_script():
    exe = shutil.which("astra-sglang")
    cmd = [exe] if exe else [sys.executable, "-m", "astra_sglang.cli"]
    p = subprocess.run(cmd + ["extract", "no_such_op", "--arch", "sm_90"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: unknown op")


@pytest.mark.parametrize("arch,needle", [("sm_70", "sm_80 or newer"), ("hopper", "unsupported arch"), ("sm_9", "unsupported arch")])
def test_unsupported_arch(arch, needle, capsys, tmp_path):
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", arch, "--out", str(tmp_path)], capsys)
    assert code != 0
    one_error(err, needle)
    assert not any(tmp_path.iterdir())


def test_no_gpu_and_no_arch_says_pass_arch(monkeypatch, capsys, tmp_path, wheel_sources):
    monkeypatch.setattr(build_mod.shutil, "which", lambda name: None)  # no nvidia-smi
    code, _, err = run_cli(["extract", "silu_and_mul", "--out", str(tmp_path)] + _src_args(wheel_sources), capsys)
    assert code == 2
    one_error(err, "--arch sm_90")
    assert not any(tmp_path.iterdir())


def test_unsupported_dtype_is_one_clear_line():
    spec = get_op("fused_add_rmsnorm")
    with pytest.raises(AstraError, match=r"jit_hf does not support fp32 .*supported: fp16, bf16") as e:
        validate_dtype(spec, spec.variant("jit_hf"), "fp32")
    assert "\n" not in str(e.value)
    with pytest.raises(AstraError, match="unknown dtype 'fp8'"):
        validate_dtype(spec, spec.variant("flashinfer"), "fp8")
    validate_dtype(spec, spec.variant("flashinfer"), "fp32")  # sgl-kernel's AOT path takes fp32
    ms = get_op("merge_state")
    with pytest.raises(AstraError, match="flashinfer does not support fp32"):
        validate_dtype(ms, ms.variant("flashinfer"), "fp32")


def test_unknown_variant_lists_the_known_ones(capsys, tmp_path, wheel_sources):
    code, _, err = run_cli(["extract", "silu_and_mul", "--variant", "triton", "--arch", "sm_90", "--out",
                             str(tmp_path)] + _src_args(wheel_sources), capsys)
    assert code != 0
    one_error(err, "unknown variant 'triton'", "jit", "aot")


@pytest.mark.parametrize("flag", ["--sglang-src", "--flashinfer-src", "--tvm-ffi-src"])
def test_source_path_that_does_not_exist(flag, capsys, tmp_path):
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", flag, str(tmp_path / "nope")], capsys)
    assert code != 0
    line = one_error(err)
    assert "nope" in line and ("does not exist" in line or "no tvm/ffi headers" in line)


def test_source_dirs_without_sources_say_what_was_expected(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", "--sglang-src", str(empty)], capsys)
    assert code != 0
    one_error(err, "neither an SGLang checkout nor an unpacked sglang wheel")
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", "--flashinfer-src", str(empty)], capsys)
    assert code != 0
    one_error(err, "holds no FlashInfer headers")


def _nothing_installed(monkeypatch):
    monkeypatch.setattr(sources_mod, "_pkg_dir", lambda name: None)


def test_sglang_not_found_says_how_to_install(monkeypatch, capsys, tmp_path, wheel_sources):
    _nothing_installed(monkeypatch)
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", "--out", str(tmp_path),
                             "--flashinfer-src", str(wheel_sources["flashinfer"]),
                             "--tvm-ffi-src", str(wheel_sources["tvm"])], capsys)
    assert code != 0
    one_error(err, "pip install sglang", "--sglang-src")


def test_flashinfer_not_found_says_how_to_install(monkeypatch, capsys, tmp_path, wheel_sources):
    _nothing_installed(monkeypatch)
    code, _, err = run_cli(["extract", "fused_add_rmsnorm", "--arch", "sm_90", "--out", str(tmp_path),
                             "--sglang-src", str(wheel_sources["sglang"]),
                             "--tvm-ffi-src", str(wheel_sources["tvm"])], capsys)
    assert code != 0
    one_error(err, "pip install flashinfer-python", "--flashinfer-src")


def test_sgl_kernel_variant_without_checkout_says_pass_one(capsys, tmp_path, wheel_sources):
    code, _, err = run_cli(["extract", "merge_state", "--variant", "sgl_kernel", "--arch", "sm_90", "--out",
                             str(tmp_path)] + _src_args(wheel_sources), capsys)
    assert code != 0
    one_error(err, "git checkout", "--sglang-src")


def test_nvcc_missing(monkeypatch, capsys, tmp_path, wheel_sources):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(build_mod, "FALLBACK_NVCC", ())
    out = tmp_path / "ws"
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", "--out", str(out)]
                            + _src_args(wheel_sources), capsys)
    assert code != 0
    one_error(err, "nvcc not found", "CUDA_HOME")
    assert not (out / "silu_and_mul").exists()


@pytest.mark.wheels
def test_existing_workspace_is_never_clobbered(monkeypatch, capsys, tmp_path, wheel_sources):
    args = ["extract", "silu_and_mul", "--arch", "sm_90", "--out", str(tmp_path), "--no-build"] + _src_args(wheel_sources)
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    ws = tmp_path / "silu_and_mul"
    (ws / "candidates" / "round_1.cu").write_text("// the user's work\n")
    before = _tree_digest(ws)

    code, _, err = run_cli(args, capsys)  # again, without --force
    assert code != 0
    one_error(err, "already exists", "--force")
    assert _tree_digest(ws) == before

    def boom(*a, **k):
        raise AstraError("launcher exploded")

    monkeypatch.setattr(extractor_mod, "render_launcher", boom)
    code, _, err = run_cli(args + ["--force"], capsys)  # --force, but extraction fails midway
    assert code != 0
    one_error(err, "launcher exploded")
    assert _tree_digest(ws) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["silu_and_mul"]  # no half-written temp dirs

    monkeypatch.undo()
    code, _, err = run_cli(args + ["--force", "--variant", "aot"], capsys)
    assert code == 0, err
    assert json.loads((ws / "manifest.json").read_text())["variant"] == "aot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["silu_and_mul"]


# --------------------------------------------------------------------------- checkouts (sgl-kernel csrc)

# A stand-in with the structure extract relies on in sgl-kernel's merge_attn_states.cu: the
# device part (to_float / from_float, merge_attn_states_kernel) and a torch-bound host launcher.
# Written for this test; it is not SGLang's file.
SYNTHETIC_MERGE_CU = r"""
#include <ATen/cuda/CUDAContext.h>
#include "pytorch_extension_utils.h"

inline __device__ float to_float(float u) { return u; }
inline __device__ float to_float(half u) { return __half2float(u); }
inline __device__ float to_float(__nv_bfloat16 u) { return __bfloat162float(u); }
inline __device__ void from_float(float& d, float s) { d = s; }
inline __device__ void from_float(half& d, float s) { d = __float2half(s); }
inline __device__ void from_float(__nv_bfloat16& d, float s) { d = __float2bfloat16(s); }

template <typename scalar_t, const uint NUM_THREADS>
__global__ void merge_attn_states_kernel(scalar_t* output, float* output_lse, const scalar_t* prefix_output,
    const float* prefix_lse, const scalar_t* suffix_output, const float* suffix_lse, const uint num_tokens,
    const uint num_heads, const uint head_size) {
  const uint pack_size = 16 / sizeof(scalar_t);
  const uint per_head = head_size / pack_size;
  const uint gid = blockIdx.x * NUM_THREADS + threadIdx.x;
  if (gid >= num_tokens * num_heads * per_head) return;
  const uint token_idx = gid / per_head / num_heads, head_idx = gid / per_head % num_heads, pack_idx = gid % per_head;
  float p_lse = prefix_lse[token_idx * num_heads + head_idx];
  float s_lse = suffix_lse[token_idx * num_heads + head_idx];
  p_lse = std::isinf(p_lse) ? -std::numeric_limits<float>::infinity() : p_lse;
  s_lse = std::isinf(s_lse) ? -std::numeric_limits<float>::infinity() : s_lse;
  const float m = fmaxf(p_lse, s_lse), pw = expf(p_lse - m), sw = expf(s_lse - m), out_se = pw + sw;
  const uint base = (token_idx * num_heads + head_idx) * head_size + pack_idx * pack_size;
  for (uint i = 0; i < pack_size; ++i)
    from_float(output[base + i], (to_float(prefix_output[base + i]) * pw + to_float(suffix_output[base + i]) * sw) / out_se);
  if (output_lse != nullptr && pack_idx == 0) {
    float out_lse = logf(out_se) + m;
    output_lse[token_idx * num_heads + head_idx] = out_lse;
  }
}

template <typename scalar_t>
void merge_attn_states_launcher(at::Tensor& output, at::Tensor& output_lse, const at::Tensor& prefix_output,
    const at::Tensor& prefix_lse, const at::Tensor& suffix_output, const at::Tensor& suffix_lse) {
  constexpr uint NUM_THREADS = 128;
  const uint head_size = output.size(2);
  const uint pack_size = 16 / sizeof(scalar_t);
  TORCH_CHECK(head_size % pack_size == 0, "headsize must be multiple of pack_size:", pack_size);
  const uint total_threads = output.numel() / pack_size;
  dim3 block(NUM_THREADS);
  dim3 grid((total_threads + NUM_THREADS - 1) / NUM_THREADS);
  auto stream = at::cuda::getCurrentCUDAStream();
  merge_attn_states_kernel<scalar_t, NUM_THREADS><<<grid, block, 0, stream>>>(nullptr, nullptr, nullptr, nullptr,
      nullptr, nullptr, 0, 0, 0);
}
"""


def _fake_checkout(root: Path, with_python: bool = True, head: str = "branch") -> Path:
    (root / "sgl-kernel" / "csrc" / "attention").mkdir(parents=True)
    (root / "sgl-kernel" / "include").mkdir(parents=True)
    (root / "sgl-kernel" / "csrc" / "attention" / "merge_attn_states.cu").write_text(SYNTHETIC_MERGE_CU)
    (root / "sgl-kernel" / "pyproject.toml").write_text('[project]\nname = "sglang-kernel"\nversion = "0.4.10"\n')
    if with_python:
        (root / "python" / "sglang" / "srt").mkdir(parents=True)
        (root / "python" / "sglang" / "kernels" / "jit" / "include").mkdir(parents=True)
        (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.23"\n')
    git = root / ".git"
    git.mkdir()
    sha = "0123456789abcdef0123456789abcdef01234567"
    if head == "branch":
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        (git / "refs" / "heads").mkdir(parents=True)
        (git / "refs" / "heads" / "main").write_text(sha + "\n")
    elif head == "packed":
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    else:
        (git / "HEAD").write_text(sha + "\n")
    return root


@pytest.mark.parametrize("head", ["branch", "packed", "detached"])
def test_checkout_discovery(tmp_path, head):
    co = _fake_checkout(tmp_path / "sglang", head=head)
    for given in (co, co / "python", co / "python" / "sglang"):
        s = discover(sglang_src=given, flashinfer_src=None, tvm_ffi_src=None)
        r = s.roots["sglang_checkout"]
        assert r.base == co.resolve() and r.origin == "checkout" and r.version == "0.5.23"
        assert r.commit == "0123456789abcdef0123456789abcdef01234567"
        assert s.roots["sglang_jit"].base == (co / "python" / "sglang" / "kernels" / "jit").resolve()
    spec = get_op("merge_state")
    assert spec.default_variant({n: True for n in s.roots}) == "sgl_kernel"
    assert spec.default_variant({"flashinfer": True}) == "flashinfer"


def test_csrc_only_checkout(tmp_path):
    co = _fake_checkout(tmp_path / "sglang", with_python=False)
    s = discover(sglang_src=co)
    assert "sglang_jit" not in s.roots
    assert s.roots["sglang_checkout"].version == "sgl-kernel 0.4.10"
    avail = {v.name: ok for v, ok, _ in available_variants(get_op("merge_state"), s)}
    assert avail["sgl_kernel"] is True


@pytest.mark.nvcc
def test_sgl_kernel_variant_from_a_checkout_compiles(tmp_path, capsys):
    co = _fake_checkout(tmp_path / "sglang")
    code, out, err = run_cli(["extract", "merge_state", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                               "--sglang-src", str(co)], capsys)
    assert code == 0, err
    ws = Workspace.open("merge_state", path=tmp_path / "ws" / "merge_state")
    m = ws.manifest
    assert m["variant"] == "sgl_kernel"  # the default when a checkout is given
    assert m["sources"]["sglang_checkout"]["commit"].startswith("0123456789")
    assert m["launch_facts"] == {"NUM_THREADS": "128"}
    ex = ws.path / "src" / "excerpts" / "merge_attn_states_kernel.cuh"
    text = ex.read_text()
    assert "merge_attn_states_kernel" in text and "ATen" not in text and "at::Tensor" not in text
    assert m["files"]["src/excerpts/merge_attn_states_kernel.cuh"] == hashlib.sha256(text.encode()).hexdigest()
    assert "src/sglang_checkout/sgl-kernel/csrc/attention/merge_attn_states.cu" in m["files"]
    print(f"cold build merge_state/sgl_kernel (synthetic checkout): {err.split('cold build')[1].split('s ')[0].strip()} s")


@pytest.mark.nvcc  # extract checks for nvcc before reading sources
def test_changed_sgl_kernel_source_fails_loudly(tmp_path, capsys):
    co = _fake_checkout(tmp_path / "sglang")
    cu = co / "sgl-kernel" / "csrc" / "attention" / "merge_attn_states.cu"
    cu.write_text(cu.read_text().replace("prefix_lse[token_idx * num_heads + head_idx]",
                                         "prefix_lse[head_idx * num_tokens + token_idx]"))
    code, _, err = run_cli(["extract", "merge_state", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(co), "--no-build"], capsys)
    assert code != 0
    one_error(err, "lse layout [num_tokens, num_heads]", "needs a launcher update")
    assert not (tmp_path / "ws" / "merge_state").exists()
