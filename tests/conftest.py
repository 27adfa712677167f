"""Shared fixtures: GPU/nvcc gating and the real sglang / flashinfer / tvm-ffi wheels."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# Pinned to what sglang 0.5.23 requires (its METADATA): flashinfer_python==0.7.2, apache-tvm-ffi==0.1.11.
WHEELS = {"sglang": "sglang==0.5.23", "flashinfer": "flashinfer-python==0.7.2", "tvm": "apache-tvm-ffi==0.1.11"}
# Fetched only by the tests that ask for them (not part of wheel_sources).
EXTRA_WHEELS = {"sglang_0_5_17": "sglang==0.5.17",
                # what sglang 0.5.17 requires (its METADATA): the FlashInfer its servers run
                "flashinfer_0_6_15": "flashinfer-python==0.6.15.post1"}
CACHE = Path(os.environ.get("ASTRA_TEST_CACHE", Path.home() / ".cache" / "astra-sglang-tests"))


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# The fixtures that unpack a wheel: a test using one (directly or through another fixture) is a `wheels` test
_WHEEL_FIXTURES = {"wheel_sources", "sglang_0_5_17_source", "flashinfer_0_6_15_source"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the markers added here count
def pytest_collection_modifyitems(config, items):
    gpu = _has_gpu()
    nvcc = shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")
    for item in items:
        if _WHEEL_FIXTURES & set(getattr(item, "fixturenames", ())) and "wheels" not in item.keywords:
            item.add_marker(pytest.mark.wheels)
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if "nvcc" in item.keywords and not nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc"))


def _fetch(key: str) -> Path:
    """Download (once) and unpack a pinned wheel; return the unpack dir."""
    req = WHEELS.get(key) or EXTRA_WHEELS[key]
    dest = CACHE / key
    done = dest / ".unpacked"
    if done.exists():
        return dest
    dl = CACHE / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    # Any platform tag: only the sources/headers inside are used, never the binaries.
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
           "--platform", "any", "-d", str(dl), req]
    subprocess.run(cmd, check=True, timeout=900)
    name = req.split("==")[0].replace("-", "_")
    whl = sorted(p for p in dl.glob("*.whl") if p.name.lower().startswith(name.lower() + "-" + req.split("==")[1]))
    if not whl:
        raise RuntimeError(f"downloaded no wheel for {req}")
    if dest.exists():
        shutil.rmtree(dest)
    with zipfile.ZipFile(whl[0]) as z:
        z.extractall(dest)
    done.touch()
    return dest


@pytest.fixture(scope="session")
def wheel_sources():
    """Unpacked real wheels: {'sglang': dir, 'flashinfer': dir, 'tvm': dir}."""
    try:
        return {k: _fetch(k) for k in WHEELS}
    except Exception as e:  # no registry reachable: say so rather than pass vacuously
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot fetch the sglang/flashinfer wheels: {e}")


def _extra(key: str) -> Path:
    """One of EXTRA_WHEELS, unpacked; no registry reachable: an error on CI, else a skip (never a vacuous pass)."""
    try:
        return _fetch(key)
    except Exception as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot fetch {EXTRA_WHEELS[key]}: {e}")


@pytest.fixture(scope="session")
def sglang_0_5_17_source():
    """The unpacked sglang 0.5.17 wheel (the version the GPU test machine runs)."""
    return _extra("sglang_0_5_17")


@pytest.fixture(scope="session")
def flashinfer_0_6_15_source():
    """The unpacked flashinfer-python 0.6.15.post1 wheel (what sglang 0.5.17 pins)."""
    return _extra("flashinfer_0_6_15")


@pytest.fixture(params=["0.5.17", "0.5.23"])
def sglang_pkg(request):
    """The unpacked sglang wheel of each version the adapters must bind: 0.5.17 (served) and 0.5.23 (pinned)."""
    if request.param == "0.5.23":
        return Path(request.getfixturevalue("wheel_sources")["sglang"])
    return Path(request.getfixturevalue("sglang_0_5_17_source"))


@pytest.fixture
def sglang_unquant_standin(monkeypatch):
    """A stand-in `sglang.srt.layers.quantization.unquant`: the names linear's and moe_gate's adapters read (the method
    class, the AMX test, aiter, the bf16 GEMM backend), as a unit test of their routing decisions."""
    import sys
    import types

    mod = types.ModuleType("sglang.srt.layers.quantization.unquant")

    class UnquantizedLinearMethod:
        pass

    mod.UnquantizedLinearMethod = UnquantizedLinearMethod
    mod.use_intel_amx_backend = lambda layer: getattr(layer, "use_intel_amx_backend", False)
    mod._use_aiter = False
    mod.backend = types.SimpleNamespace(is_cutedsl=lambda: False, is_gemv=lambda: False)
    mod.get_bf16_gemm_backend = lambda: mod.backend
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod
