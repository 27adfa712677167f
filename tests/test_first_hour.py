"""A new user's first hour (issue 17): every bad input and missing piece is named up front, one
`error:` line each, exit 2, nothing written; `extract --download` fetches the sources an SGLang
release pins; a failed extract leaves nothing behind."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from astra_sglang import preconditions as pre
from astra_sglang.errors import AstraError
from astra_sglang.extract import download as dl
from astra_sglang.extract import extractor as extractor_mod
from astra_sglang.extract import sources as sources_mod

from conftest import CACHE
from cli_run import error_lines, one_error, run_cli  # noqa: E402


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to download fails the test: argument errors must come before the network."""
    def boom(*a, **k):
        raise AssertionError("extract reached for the network before checking its arguments")

    monkeypatch.setattr(dl, "_pip_download", boom)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(root))
    return root


def _nothing_installed(monkeypatch):
    monkeypatch.setattr(sources_mod, "_pkg_dir", lambda name: None)


# --------------------------------------------------------------------------- AstraError, require


def test_one_error_holds_several_lines(capsys):
    e = AstraError("first", "second")
    assert e.messages == ("first", "second") and f"error: {e}" == "error: first\nerror: second"
    assert AstraError("only").messages == ("only",) and str(AstraError("only")) == "only"


def test_require_lists_every_missing_piece_at_once(monkeypatch):
    monkeypatch.setitem(pre.CHECKS, "gpu", lambda: "no GPU")
    monkeypatch.setitem(pre.CHECKS, "nvcc", lambda: ["nvcc missing"])
    monkeypatch.setitem(pre.CHECKS, "sglang", lambda: None)
    with pytest.raises(AstraError) as e:
        pre.require("gpu", "sglang", "nvcc", lambda: "custom", lambda: None, lambda: "no GPU")
    assert e.value.messages == ("no GPU", "nvcc missing", "custom")  # in order, each once
    assert e.value.exit_code == 2
    pre.require("sglang", lambda: None)  # all there: returns
    with pytest.raises(ValueError, match="unknown precondition 'gpus'"):
        pre.require("gpus")


def test_torch_needs_say_one_thing_each(monkeypatch):
    monkeypatch.setattr(pre, "_torch", lambda: None)
    # no torch at all: one line, not three (cuda_torch and torch say the same)
    assert pre.missing("torch", "cuda_torch") == [pre.check_torch()]
    assert "not installed" in pre.check_torch() and "Set up" in pre.check_torch()

    class CpuTorch:
        __version__ = "2.13.0+cpu"

        class version:
            cuda = None

    monkeypatch.setattr(pre, "_torch", lambda: CpuTorch)
    monkeypatch.setattr(pre, "_nvidia_smi_gpus", lambda: 0)
    got = pre.missing("gpu", "cuda_torch", "torch")
    assert len(got) == 2
    assert "no NVIDIA GPU" in got[0] and "2.13.0+cpu is a CPU-only build" in got[1]


def test_gpu_need_with_a_cuda_torch_but_no_device(monkeypatch):
    class Cuda:
        @staticmethod
        def is_available():
            return False

        @staticmethod
        def device_count():
            return 0

    class CudaTorch:
        __version__ = "2.11.0+cu130"
        cuda = Cuda

        class version:
            cuda = "13.0"

    monkeypatch.setattr(pre, "_torch", lambda: CudaTorch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert pre.missing("cuda_torch") == []
    assert pre.missing("gpu") == ["no NVIDIA GPU visible to torch (CUDA_VISIBLE_DEVICES='')"
                                  ": run it on a machine with a GPU"]


def test_sglang_and_key_needs(monkeypatch):
    monkeypatch.setattr(pre.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    got = pre.missing("sglang", "openai_key")
    assert "SGLang is not installed" in got[0] and "pip install sglang" in got[0]
    assert "OPENAI_API_KEY is not set" in got[1]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert pre.missing("openai_key") == []


def test_pip_need(monkeypatch):
    real = pre.importlib.util.find_spec
    monkeypatch.setattr(pre.importlib.util, "find_spec", lambda name: None if name == "pip" else real(name))
    assert "pip is not installed" in pre.missing("pip")[0]


def test_real_checks_answer_on_this_machine():
    # whatever this machine has, every check returns None or text, never raises
    for name, check in pre.CHECKS.items():
        got = check()
        assert got is None or isinstance(got, (str, list)), name


# --------------------------------------------------------------------------- extract: arguments first


@pytest.mark.parametrize("args,needles", [
    (["extract", "silu_and_mul", "--sglang", "latest"], ("--sglang 'latest' is not a version",)),
    (["extract", "silu_and_mul", "--download", "--sglang-src", "."], ("either --download/--sglang or --sglang-src",)),
    (["extract", "--variant", "jit"], ("--variant needs an op",)),
    (["extract", "--list", "no_such_op", "--download"], ("unknown op 'no_such_op'",)),
    (["extract", "silu_and_mul", "--variant", "triton", "--download"], ("unknown variant 'triton'",)),
    (["extract", "silu_and_mul", "--arch", "hopper", "--download"], ("unsupported arch 'hopper'",)),
    (["extract", "silu_and_mul", "--download", "--flashinfer-src", "/nonexistent/fi"], ("/nonexistent/fi does not exist",)),
    (["extract"], ("give an op to extract",)),
])
def test_bad_arguments_are_one_line_before_the_network(args, needles, capsys, no_network, cache, tmp_path):
    code, out, err = run_cli(args + ["--out", str(tmp_path / "ws")], capsys)
    assert code == 2, err
    one_error(err, *needles)
    assert not (tmp_path / "ws").exists() and not cache.exists()


def test_out_that_is_a_file(capsys, tmp_path, no_network):
    f = tmp_path / "ws"
    f.write_text("not a directory\n")
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", "--download", "--out", str(f)], capsys)
    assert code == 2
    one_error(err, "is not a directory")
    assert f.read_text() == "not a directory\n"


def test_existing_workspace_is_refused_before_the_download(capsys, tmp_path, no_network):
    ws = tmp_path / "silu_and_mul"
    ws.mkdir()
    (ws / "mine.cu").write_text("// the user's\n")
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_90", "--sglang", "0.5.23", "--out", str(tmp_path)], capsys)
    assert code == 2
    one_error(err, "already exists", "--force")


def test_every_missing_piece_at_once(monkeypatch, capsys, tmp_path, no_network):
    """No GPU (so no arch), no nvcc, no SGLang / FlashInfer / tvm-ffi: five lines, exit 2, nothing written."""
    from astra_sglang.build import nvcc as nvcc_mod

    _nothing_installed(monkeypatch)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))  # no nvcc, no nvidia-smi
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nvcc_mod, "FALLBACK_NVCC", ())
    out = tmp_path / "ws"
    code, _, err = run_cli(["extract", "silu_and_mul", "--out", str(out)], capsys)
    assert code == 2
    errs = error_lines(err)
    assert len(errs) == 5, err
    for needle, line in zip(["--arch sm_90", "nvcc not found", "SGLang's JIT kernel sources", "FlashInfer headers",
                             "tvm-ffi headers"], errs):
        assert needle in line, line
    assert all("--download" in ln for ln in errs[2:])
    assert not out.exists()


# --------------------------------------------------------------------------- extract: nothing half-made


@pytest.mark.nvcc
def test_arch_nvcc_cannot_build_is_refused_up_front(capsys, tmp_path, wheel_sources):
    args = ["--sglang-src", str(wheel_sources["sglang"]), "--flashinfer-src", str(wheel_sources["flashinfer"]),
            "--tvm-ffi-src", str(wheel_sources["tvm"])]
    code, _, err = run_cli(["extract", "silu_and_mul", "--arch", "sm_999", "--out", str(tmp_path)] + args, capsys)
    assert code == 2
    one_error(err, "cannot build sm_999", "sm_90")
    assert not any(tmp_path.iterdir())


@pytest.mark.wheels
@pytest.mark.nvcc
def test_failed_build_leaves_nothing_and_the_rerun_needs_no_force(monkeypatch, capsys, tmp_path, wheel_sources):
    args = ["extract", "silu_and_mul", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
            "--sglang-src", str(wheel_sources["sglang"]), "--flashinfer-src", str(wheel_sources["flashinfer"]),
            "--tvm-ffi-src", str(wheel_sources["tvm"])]
    real = extractor_mod.render_launcher

    def broken(*a, **k):  # a baseline nvcc rejects at once
        return "#error astra-test: this baseline does not compile\n" + real(*a, **k)

    monkeypatch.setattr(extractor_mod, "render_launcher", broken)
    code, _, err = run_cli(args, capsys)
    assert code == 2
    line = one_error(err, "does not compile", "astra-test", "is left as it was")
    log = Path(line.split("nvcc log: ")[1].split(";")[0])
    assert "astra-test" in log.read_text()
    log.unlink()
    assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").iterdir())  # no workspace, no temp dirs

    monkeypatch.undo()
    code, out, err = run_cli(args + ["--no-build"], capsys)  # the corrected rerun: no --force needed
    assert code == 0, err
    assert out.strip() == str(tmp_path / "ws" / "silu_and_mul")
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["silu_and_mul"]


# --------------------------------------------------------------------------- extract --download


def test_pins_are_read_from_sglang_metadata():
    meta = ("Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.23\n"
            "Requires-Dist: apache-tvm-ffi==0.1.11\n"
            "Requires-Dist: flashinfer_python[cu13]==0.7.2\n"
            "Requires-Dist: flashinfer-python==0.1; extra == \"old\"\n"
            "Requires-Dist: torch==2.14.1\n")
    assert dl.pinned_requirements(meta) == {"flashinfer": "flashinfer-python==0.7.2", "tvm": "apache-tvm-ffi==0.1.11"}
    assert dl.pinned_requirements("Name: sglang\nRequires-Dist: torch\n") == {}


def _wheel_from_test_cache(req: str, dest: Path, progress) -> Path:
    """Stand-in for pip download: the wheel tests/conftest.py already fetched."""
    name, ver = req.split("==")
    stem = name.replace("-", "_").lower() + "-" + ver + "-"
    whl = [p for p in (CACHE / "dl").glob("*.whl") if p.name.lower().startswith(stem)]
    assert whl, f"{req} is not among the test wheels"
    out = dest / whl[0].name
    shutil.copy(whl[0], out)
    return out


@pytest.mark.wheels
def test_download_unpacks_the_pinned_wheels_into_the_cache(monkeypatch, capsys, cache, wheel_sources):
    calls = []

    def fake(req, dest, progress):
        calls.append(req)
        return _wheel_from_test_cache(req, dest, progress)

    monkeypatch.setattr(dl, "_pip_download", fake)
    got = dl.fetch("0.5.23")
    assert calls == ["sglang==0.5.23", "apache-tvm-ffi==0.1.11", "flashinfer-python==0.7.2"]
    rel = cache / "sources" / "sglang-0.5.23"
    assert {k: f.path for k, f in got.items()} == {k: rel / k for k in ("sglang", "flashinfer", "tvm")}
    rec = json.loads((rel / "sources.json").read_text())
    assert rec["sglang"] == "0.5.23" and rec["packages"]["flashinfer"]["requirement"] == "flashinfer-python==0.7.2"
    assert len(rec["packages"]["tvm"]["sha256"]) == 64
    # only what extract reads was unpacked (flashinfer's 258 MB csrc/ stays in the wheel)
    assert (rel / "flashinfer" / "flashinfer" / "data" / "include" / "flashinfer" / "norm.cuh").is_file()
    assert not (rel / "flashinfer" / "flashinfer" / "data" / "csrc").exists()
    # the second time: from the cache, no pip
    calls.clear()
    assert dl.fetch("0.5.23")["sglang"].path == rel / "sglang" and calls == []
    assert dl.listing() == ["0.5.23"]

    # --list says where every source came from
    code, out, err = run_cli(["extract", "--list", "--sglang", "0.5.23"], capsys)
    assert code == 0, err
    assert calls == []
    for name, ver in (("sglang_jit", "0.5.23"), ("flashinfer", "0.7.2"), ("tvm_ffi", "0.1.11"), ("dlpack", "0.1.11")):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"source {name} "))
        assert f" {ver} " in line and " download " in line and "(pip download " in line and str(rel) in line
    assert "sglang_checkout  -" in out and "cached downloads: sglang 0.5.23" in out


@pytest.mark.wheels
def test_a_half_unpacked_release_is_not_taken_for_complete(monkeypatch, cache, wheel_sources):
    monkeypatch.setattr(dl, "_pip_download", _wheel_from_test_cache)
    real = dl._unpack

    def dies(whl, members, dest):
        real(whl, members, dest)
        if "flashinfer" in whl.name:
            raise KeyboardInterrupt

    monkeypatch.setattr(dl, "_unpack", dies)
    with pytest.raises(KeyboardInterrupt):
        dl.fetch("0.5.23")
    assert dl.cached("0.5.23") is None
    assert [p.name for p in (cache / "sources").iterdir()] == ["wheels"]


@pytest.mark.wheels
@pytest.mark.nvcc
def test_extract_from_downloaded_sources_records_them(monkeypatch, capsys, cache, tmp_path, wheel_sources):
    monkeypatch.setattr(dl, "_pip_download", _wheel_from_test_cache)
    _nothing_installed(monkeypatch)  # as on a machine without SGLang
    code, out, err = run_cli(["extract", "fused_add_rmsnorm", "--download", "--sglang", "0.5.23", "--arch", "sm_90",
                           "--no-build", "--out", str(tmp_path / "ws")], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / "fused_add_rmsnorm" / "manifest.json").read_text())
    src = m["sources"]["flashinfer"]
    assert src["origin"] == "download" and src["version"] == "0.7.2"
    assert src["from"].startswith("flashinfer_python-0.7.2-") and "pip download flashinfer-python==0.7.2" in src["from"]


def test_pip_failure_is_one_line(monkeypatch, tmp_path):
    class Done:
        returncode = 1
        stdout = ("ERROR: Could not find a version that satisfies the requirement sglang==0.0.1 (from versions: 0.5.23)\n"
                  "ERROR: No matching distribution found for sglang==0.0.1\n")

    tried = []
    monkeypatch.setattr(dl.subprocess, "run", lambda cmd, **k: tried.append(cmd[cmd.index("--python-version") + 1]) or Done)
    with pytest.raises(AstraError) as e:
        dl._pip_download("sglang==0.0.1", tmp_path, lambda s: None)
    assert str(e.value) == "pip could not download sglang==0.0.1: No matching distribution found for sglang==0.0.1"
    assert len(tried) == len(set(tried)) >= 3  # each python tag tried once
    assert list(tmp_path.iterdir()) == []


@pytest.mark.network
def test_download_from_the_registry(capsys, cache, tmp_path):
    """The real thing: pip fetches sglang 0.5.23's pinned wheels (CI may run it; it needs the registry)."""
    code, out, err = run_cli(["extract", "--list", "--sglang", "0.5.23"], capsys)
    if code != 0 and "pip could not download" in err and not __import__("os").environ.get("CI"):
        pytest.skip(f"no registry: {err.strip()}")
    assert code == 0, err
    assert "source sglang_jit       0.5.23         download" in out
    assert "source flashinfer       0.7.2          download" in out
    rec = json.loads((cache / "sources" / "sglang-0.5.23" / "sources.json").read_text())
    assert set(rec["packages"]) == {"sglang", "flashinfer", "tvm"}
    for f in (cache / "sources" / "wheels").glob("*.whl"):
        assert zipfile.is_zipfile(f)


def test_bad_input_via_the_console_script(tmp_path):
    exe = shutil.which("astra-sglang")
    cmd = [exe] if exe else [sys.executable, "-m", "astra_sglang.cli"]
    p = subprocess.run(cmd + ["extract", "silu_and_mul", "--sglang", "0.5.x", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == "error: --sglang '0.5.x' is not a version (give it as 0.5.23)"
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- the other commands' preconditions


@pytest.fixture
def bare_machine(monkeypatch):
    """No GPU, a CPU-only torch, no SGLang: the answers of a fresh CPU machine, on any machine."""
    monkeypatch.setitem(pre.CHECKS, "gpu", lambda: "no NVIDIA GPU found (stand-in)")
    monkeypatch.setitem(pre.CHECKS, "cuda_torch", lambda: "torch is a CPU-only build (stand-in)")
    monkeypatch.setitem(pre.CHECKS, "sglang", lambda: "SGLang is not installed (stand-in)")


def test_e2e_without_sglang_is_named_up_front_and_leaves_no_out_dir(bare_machine, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["e2e", "--model-path", "llama3-8b", "--ops", "silu_and_mul"], capsys)
    assert code == 2
    assert error_lines(err)[0] == "error: SGLang is not installed (stand-in)"
    assert list(tmp_path.iterdir()) == []  # no e2e-out/


def test_patch_serve_without_sglang_is_one_line(bare_machine, capsys, tmp_path):
    code, _, err = run_cli(["patch", "--serve", "--ops", "none", "--", "--model-path", str(tmp_path)], capsys)
    assert code == 2
    one_error(err, "SGLang is not installed (stand-in)")


def test_validate_names_every_missing_piece(bare_machine, capsys):
    code, _, err = run_cli(["validate", "--ops", "silu_and_mul"], capsys)
    assert code == 2
    assert error_lines(err) == ["error: SGLang is not installed (stand-in)", "error: no NVIDIA GPU found (stand-in)",
                            "error: torch is a CPU-only build (stand-in)"]


def test_optimize_names_an_unknown_op_before_the_api_key(capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, _, err = run_cli(["optimize", "no_such_op", "--rounds", "1", "--model", "o4-mini"], capsys)
    assert code == 2
    one_error(err, "unknown op 'no_such_op'")
