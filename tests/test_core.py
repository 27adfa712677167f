"""Core contracts: registry, spec shapes, arch/flag parsing, CLI error handling."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from astra_sglang.build import Arch, compile_flags, parse_arch
from astra_sglang.cli import cli, main
from astra_sglang.errors import AstraError
from astra_sglang.registry import get_op, op_names


def test_registry_lists_ops_and_rejects_unknown():
    assert "silu_and_mul" in op_names()
    with pytest.raises(AstraError, match="known ops: .*silu_and_mul"):
        get_op("no_such_op")


def test_paper_shapes_are_in_the_corpus():
    spec = get_op("silu_and_mul")
    paper = {s.dims for s in spec.shapes("paper")}
    assert (16, 4096) in paper and (512, 14336) in paper and len(paper) == 8
    assert spec.shapes("16x4096,3x1368")[1].dims == (3, 1368)
    with pytest.raises(AstraError):
        spec.shapes("16x4096x2")
    with pytest.raises(AstraError, match="AxB"):
        spec.shapes("16xab")
    # every corpus shape has a provenance
    assert all(s.source for s in spec.corpus)


def test_abi_signature_matches_argtypes():
    spec = get_op("silu_and_mul")
    sig = spec.c_signature()
    assert sig.startswith('extern "C" cudaError_t astra_silu_and_mul(')
    assert len(spec.ctypes_argtypes()) == len(spec.abi) + 1  # + stream


@pytest.mark.parametrize("text,expect", [("sm_90", (9, 0)), ("90", (9, 0)), ("9.0", (9, 0)), ("sm_100a", (10, 0))])
def test_parse_arch(text, expect):
    a = parse_arch(text)
    assert (a.major, a.minor) == expect


@pytest.mark.parametrize("bad", ["sm_70", "hopper", ""])
def test_parse_arch_rejects(bad):
    with pytest.raises(AstraError):
        parse_arch(bad)


def test_jit_flags_reproduce_sglang():
    f = compile_flags("sglang_jit", Arch(9, 0), ("--use_fast_math",))
    assert "-DSGL_CUDA_ARCH=900" in f and "-std=c++20" in f
    assert "-gencode=arch=compute_90a,code=sm_90a" in f and "--use_fast_math" in f


def test_cli_unknown_op_is_one_line_nonzero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["extract", "no_such_op", "--arch", "sm_90"])
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown op") and "silu_and_mul" in err[0]


def test_cli_help_lists_extract():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0 and "extract" in r.output


# ------------------------------------------------------------------ one cache root, one build path


def test_cache_root_reads_one_variable_and_the_old_name_as_an_alias(monkeypatch, tmp_path):
    from pathlib import Path

    from astra_sglang.build import cache_root

    monkeypatch.delenv("ASTRA_CACHE_DIR", raising=False)
    monkeypatch.delenv("ASTRA_SGLANG_CACHE", raising=False)
    assert cache_root() == Path.home() / ".cache" / "astra-sglang"
    monkeypatch.setenv("ASTRA_SGLANG_CACHE", str(tmp_path / "old"))
    with pytest.warns(DeprecationWarning, match="ASTRA_CACHE_DIR"):
        assert cache_root("patch") == tmp_path / "old" / "patch"
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path / "new"))
    assert cache_root("patch") == tmp_path / "new" / "patch"  # the new name wins


@pytest.mark.parametrize("op", ["silu_and_mul", "fused_add_rmsnorm", "merge_state"])
def test_patch_builds_the_shipped_kernel_with_the_flags_check_and_bench_use(op, monkeypatch, tmp_path):
    """One build path: patch's build_kernel passes the flags a workspace of the op's default production
    variant records (what check and bench build the same kernel.cu with)."""
    from astra_sglang.build import cache as cache_mod
    from astra_sglang.build import kernel_flags
    from astra_sglang.patch import apply

    seen = {}

    def fake_build(source, includes, flags, cache_dir, closure_hash, timeout=600.0):
        seen.update(source=source, flags=list(flags), cache_dir=cache_dir)
        return cache_mod.BuildResult(True, tmp_path / "x.so", 0.0, False, "", [])

    monkeypatch.setattr(cache_mod, "build_shared", fake_build)
    monkeypatch.setattr("astra_sglang.build.build_shared", fake_build)
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    apply.build_kernel(op, arch="sm_90")
    spec = get_op(op)
    arch = parse_arch("sm_90")
    v = spec.variant(spec.default_variant({r: True for r in ("sglang", "flashinfer", "tvm_ffi", "sglang_jit")}))
    assert seen["flags"] == kernel_flags(spec, arch) == compile_flags(v.flag_profile, arch, v.extra_flags)
    assert "-std=c++17" not in seen["flags"] or v.flag_profile != "sglang_jit"
    assert seen["cache_dir"] == tmp_path / "patch" / op


@pytest.mark.nvcc
def test_build_cache_key_includes_the_flags(tmp_path):
    import shutil as _sh

    from astra_sglang.build import build_shared

    if not _sh.which("nvcc") and not __import__("os").path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("needs nvcc")
    src = tmp_path / "k.cu"
    src.write_text('extern "C" int astra_k(void) { return 0; }\n')
    a = build_shared(src, [], ["-O3", "-Xcompiler", "-fPIC"], tmp_path / "c", "h")
    b = build_shared(src, [], ["-O2", "-Xcompiler", "-fPIC"], tmp_path / "c", "h")
    again = build_shared(src, [], ["-O3", "-Xcompiler", "-fPIC"], tmp_path / "c", "h")
    assert a.ok and b.ok and a.library != b.library
    assert again.cached and again.library == a.library


@pytest.mark.parametrize("op", op_names())
def test_every_distribution_makes_inputs_the_harness_accepts(op):
    """check refuses all-zero inputs on the GPU (moe_grouped_router's 'ties' bias could be all zero with one
    group, 2026-11-24): the same guard on CPU, every distribution, the two smallest corpus shapes, three seeds."""
    import math

    pytest.importorskip("torch")
    from astra_sglang.harness.inputs import make_case_inputs

    spec = get_op(op)
    for shape in sorted(spec.corpus, key=lambda s: math.prod(s.dims))[:2]:
        for dist in spec.distributions:
            for seed in range(3):
                make_case_inputs(spec, shape.dims, (spec.dtypes or ("fp32",))[0], dist, seed, "cpu")


def test_kernel_lib_args_follow_the_abi_order():
    """KernelLib.args walks the ABI through a plan made once (the patched eager call's hot path): pointers as
    ints, dims by name, scalars, the dtype code, in the ABI's order; a missing scalar is one clear error."""
    import torch

    from astra_sglang.build.loader import KernelLib
    from astra_sglang.spec import DTYPE_CODES

    spec = get_op("rmsnorm")
    lib = object.__new__(KernelLib)   # no library needed to build arguments
    lib.spec, lib._plan = spec, None
    t = {"out": torch.empty(3, 8), "input": torch.ones(3, 8), "weight": torch.ones(8)}
    got = lib.args(t, (3, 8), "bf16", {"eps": 1e-6})
    want = {"out": t["out"].data_ptr(), "input": t["input"].data_ptr(), "weight": t["weight"].data_ptr(),
            "num_tokens": 3, "hidden": 8, "eps": 1e-6, "dtype": DTYPE_CODES["bf16"]}
    assert got == [want[a.name] for a in spec.abi]
    assert lib.args(t, (5, 8), "fp16", {"eps": 1e-5})[3:5] == [5, 8]   # the plan is reused, the values are not
    with pytest.raises(AstraError, match="no value for ABI argument 'eps'"):
        lib.args(t, (3, 8), "bf16", {})
