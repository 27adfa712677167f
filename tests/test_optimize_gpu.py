"""optimize's GPU demo fixtures (tests/optimize_fixtures/gpu): without a GPU, that nvcc rejects and
accepts exactly the candidates the script says it does, on a workspace extracted from the real
wheels; with a GPU, the whole 5-round demo (run_gpu_demo.sh, recorded in results/2026-11-22-h200/optimize/README.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astra_sglang.build import Arch
from astra_sglang.extract import discover, extract
from astra_sglang.registry import get_op

FX = Path(__file__).parent / "optimize_fixtures" / "gpu"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workspace(wheel_sources, tmp_path_factory):
    from astra_sglang.build.workspace import Workspace

    dest = tmp_path_factory.mktemp("optws") / "silu_and_mul"
    roots = discover(wheel_sources["sglang"], wheel_sources["flashinfer"], wheel_sources["tvm"])
    extract(get_op("silu_and_mul"), roots, dest, Arch(9, 0), variant="jit")
    return Workspace.open("silu_and_mul", path=dest)


@pytest.mark.nvcc
@pytest.mark.wheels
def test_gpu_fixtures_compile_as_the_script_says(workspace):
    from astra_sglang.agents.gpu_executor import GpuExecutor

    ex = GpuExecutor(get_op("silu_and_mul"), workspace)
    res = {f.stem: ex.compile(f) for f in sorted(FX.glob("*.cu"))}
    for ok in ("r2_wrong", "r3_slower", "r4_faster"):
        assert res[ok].ok, f"{ok}: {res[ok].error}"
    for bad, needle in (("r1_compile_error", "error"), ("r1_fix_attempt", "error"),
                        ("r5_static", "stream-create"), ("r5_fix_attempt", "host-sync")):
        assert not res[bad].ok and needle in res[bad].error, (bad, res[bad].error)
        assert res[bad].log  # what goes back to the coding agent
    # every candidate the script writes exists
    script = json.loads((FX / "script.json").read_text())
    files = {c["arguments"]["source_file"] for r in script["rounds"].values() for turns in r.values()
             for t in turns for c in t.get("tool_calls", []) if "source_file" in c.get("arguments", {})}
    assert files == {f.name for f in FX.glob("*.cu")}


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.wheels
def test_gpu_demo_names_the_faster_candidate_best(workspace, tmp_path):
    env = dict(os.environ, WS=str(workspace.path), OUT=str(tmp_path / "out"), RUN=str(tmp_path / "run"))
    proc = subprocess.run(["bash", str(FX / "run_gpu_demo.sh")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ev = [json.loads(l) for l in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    status = {e["round"]: e["status"] for e in ev if e["event"] == "round"}
    assert status == {0: "production", 1: "compile-error", 2: "wrong", 3: "correct", 4: "correct", 5: "compile-error"}
    rounds = {e["round"]: e for e in ev if e["event"] == "round"}
    assert rounds[3]["geomean"] < 1.0 < rounds[4]["geomean"]
    assert ev[-1]["event"] == "final" and ev[-1]["best_round"] == 4


CUTE = Path(__file__).parent / "optimize_fixtures" / "cute"


@pytest.mark.nvcc
@pytest.mark.wheels
def test_cute_candidate_builds_with_flashinfer_cutlass(workspace, monkeypatch):
    """The CuTe fixture builds through the loop's compile path because flashinfer's CUTLASS headers
    are on the candidates' include path, and only then; the cold compile time is the one
    agents/cute.py's COMPILE_NOTE reports."""
    from astra_sglang.agents.cute import ENV
    from astra_sglang.agents.gpu_executor import GpuExecutor

    monkeypatch.delenv(ENV, raising=False)
    spec = get_op("silu_and_mul")
    ex = GpuExecutor(spec, workspace)  # found beside the flashinfer source the workspace came from
    assert ex.cute_include is not None and (ex.cute_include / "cute" / "tensor.hpp").is_file()
    desc = ex.describe()
    assert desc["cute_include"] == str(ex.cute_include) and desc["cutlass_version"].count(".") == 2
    assert "CuTe is available" in ex.language_notes()
    assert workspace.manifest["include_dirs"] == json.loads((workspace.path / "manifest.json").read_text())["include_dirs"]
    without = GpuExecutor(spec, workspace, cute=False).compile(CUTE / "silu_cute.cu")
    assert not without.ok and "cute/tensor.hpp" in without.log
    res = ex.compile(CUTE / "silu_cute.cu")
    assert res.ok, res.log[-3000:]
    print(f"CuTe candidate cold compile: {res.seconds:.1f} s")
    assert "tensor_impl.hpp" in ex.read_include("cute/tensor.hpp")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.wheels
def test_gpu_cute_candidate_is_checked_and_timed(workspace, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "astra_sglang.cli", "optimize", "silu_and_mul", "--workspace", str(workspace.path),
         "--model", f"scripted:{CUTE / 'script.json'}", "--rounds", "1", "--shapes", "decode", "--dtypes", "fp16",
         "--replays", "20", "--final-shapes", "edge", "--run-dir", str(run)],
        cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ev = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines()]
    r1 = [e for e in ev if e["event"] == "round" and e["round"] == 1][0]
    assert r1["status"] == "correct" and r1["compile"]["ok"], r1
    assert r1["timings"] and all(t["candidate_us"] > 0 for t in r1["timings"])
    assert ev[0]["executor"]["cute_include"]
