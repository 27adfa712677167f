"""GPU: every deliberately wrong candidate in tests/bad_candidates/ is rejected with the right reason;
correct candidates written differently from production, and the production kernels themselves, pass.

Workspaces: $ASTRA_TEST_WORKSPACES/<op> when set (e.g. extracted beforehand with --arch), else extracted
here from the pinned wheels (tests/conftest.py). $ASTRA_RESULTS_DIR, when set, receives every
CheckResult as JSON (the GPU run's record).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

HERE = Path(__file__).resolve().parent
BAD = HERE / "bad_candidates"
OPS = ("silu_and_mul", "fused_add_rmsnorm", "merge_state")


def meta(path: Path):
    text = path.read_text()
    op = re.search(r"^// op: (\w+)", text, re.M).group(1)
    expect = re.search(r"^// expect: (.+)$", text, re.M).group(1).strip()
    return op, expect


CANDIDATES = sorted(BAD.glob("*.cu"))


@pytest.fixture(scope="session")
def workspaces(request, tmp_path_factory):
    env = os.environ.get("ASTRA_TEST_WORKSPACES")
    if env:
        return Path(env)
    src = request.getfixturevalue("wheel_sources")
    from astra_sglang.cli import main

    root = tmp_path_factory.mktemp("workspaces")
    for op in OPS:
        try:
            main(["extract", op, "--out", str(root), "--sglang-src", str(src["sglang"]),
                  "--flashinfer-src", str(src["flashinfer"]), "--tvm-ffi-src", str(src["tvm"]), "--no-build"])
        except SystemExit as e:
            if e.code:
                raise
    return root


def _workspace(root: Path, op: str):
    from astra_sglang.build.workspace import Workspace

    if not (root / op / "manifest.json").exists():
        pytest.skip(f"no {op} workspace under {root}")
    return Workspace.open(op, path=root / op)


def _record(res, name: str) -> None:
    out = os.environ.get("ASTRA_RESULTS_DIR")
    if out:
        res.to_json(Path(out) / f"{name}.json")


@pytest.mark.parametrize("op", OPS)
def test_production_passes_its_own_check(workspaces, op):
    from astra_sglang.harness.check import check_candidate

    res = check_candidate(op, _workspace(workspaces, op), None, timeout=120)
    _record(res, f"production-{op}")
    assert res.ok, res.reason
    assert res.details and all(d["ok"] for d in res.details)


@pytest.mark.parametrize("cand", CANDIDATES, ids=[c.stem for c in CANDIDATES])
def test_candidate_verdict(workspaces, cand):
    from astra_sglang.harness.check import check_candidate

    op, expect = meta(cand)
    hang = "timed out" in expect
    res = check_candidate(op, _workspace(workspaces, op), cand, timeout=15 if hang else 120)
    _record(res, f"candidate-{cand.stem}")
    if expect == "pass":
        assert res.ok, res.reason
    else:
        assert not res.ok, f"{cand.name} was accepted"
        assert re.search(expect, res.reason), f"{cand.name}: {res.reason!r} does not match {expect!r}"


def test_bench_times_and_rechecks(workspaces, tmp_path):
    from astra_sglang.harness.bench import bench

    ws = _workspace(workspaces, "silu_and_mul")
    rep = bench("silu_and_mul", ws, BAD / "ok_silu_simple.cu", shapes="16x4096,1024x4096", dtypes=("fp16",),
                replays=10)
    assert rep.ok, rep.reason
    assert len(rep.rows) == 2 and all(r.prod_us > 0 and r.cand_us > 0 for r in rep.rows)
    assert rep.ceiling_gbps > 500 and 0 < rep.launch_floor_us < 10
    assert rep.recheck["ok"] and rep.recheck["cases"] == 2
    rep.to_json(tmp_path / "b.json")
    assert "geomean" in rep.table()


# ------------------------------------------------------------------ issue 12: cheats caught dynamically

# what check's dynamic cases say about each cheating candidate when the static rules are off (H200,
# 2026-11-23: capture_skip and early_exit_time by the in-graph case; ignore_stream by the in-graph case
# too (its default-stream launch is not captured: poison left); pointer_memo by the stream case (it
# skipped the work on a pointer it had seen))
DYNAMIC = {
    "cheat_capture_skip": r"in a CUDA graph.*never wrote .* \(poison left\)",
    "cheat_pointer_memo": r"in a CUDA graph|fresh inputs|same buffers|cached by pointer|non-default stream.*stale inputs",
    "cheat_ignore_stream": r"non-default stream behind queued work.*stale inputs read|in a CUDA graph.*poison left",
    "cheat_early_exit_time": r"in a CUDA graph|never wrote|error .* > tolerance",
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_cheat_is_caught_by_the_dynamic_checks_alone(workspaces, name):
    from astra_sglang.harness.check import check_candidate

    cand = BAD / f"{name}.cu"
    if not cand.exists():
        pytest.skip(f"{cand.name} not written yet")
    op, _ = meta(cand)
    res = check_candidate(op, _workspace(workspaces, op), cand, shapes="16x4096,1024x4096", dtypes=("fp16",),
                          timeout=120, static=False)
    _record(res, f"dynamic-{name}")
    assert not res.ok, f"{cand.name} was accepted without the static rules"
    assert re.search(DYNAMIC[name], res.reason), res.reason


def test_bench_refuses_the_capture_cheat(workspaces):
    from astra_sglang.harness.bench import bench

    ws = _workspace(workspaces, "silu_and_mul")
    rep = bench("silu_and_mul", ws, BAD / "cheat_capture_skip.cu", shapes="16x4096,1024x4096", dtypes=("fp16",),
                replays=10, static=False)
    _record_bench(rep, "bench-cheat_capture_skip")
    assert not rep.ok
    assert all(r.failed for r in rep.rows)
    assert re.search(r"timed graph replayed on fresh inputs.*never wrote|impossible number", rep.reason), rep.reason


@pytest.mark.parametrize("op", ["silu_and_mul", "fused_add_rmsnorm"])
def test_shipped_kernel_passes_check_and_bench_on_decode_shapes_with_both_bases(workspaces, op):
    from astra_sglang.harness.bench import bench
    from astra_sglang.harness.check import check_candidate
    from astra_sglang.registry import shipped_kernel

    ws = _workspace(workspaces, op)
    # the decode corpus; ASTRA_TEST_SHAPES_<op> narrows it (a device run on a budget)
    shapes = os.environ.get(f"ASTRA_TEST_SHAPES_{op}", "decode")
    res = check_candidate(op, ws, shipped_kernel(op), shapes=shapes, dtypes=("fp16",), timeout=120)
    _record(res, f"shipped-{op}-decode")
    assert res.ok, res.reason
    assert any(d["run"] == "stream" for d in res.details) and any(d["run"] == "graph-1" for d in res.details)
    rep = bench(op, ws, shipped_kernel(op), shapes=shapes, dtypes=("fp16",), replays=20,
                command=f"bench({op!r}, ws, {shipped_kernel(op).name!r}, shapes={shapes!r}, dtypes=('fp16',), replays=20)")
    _record_bench(rep, f"bench-shipped-{op}-decode")
    assert rep.ok, rep.reason
    for r in rep.rows:
        assert not r.failed
        assert r.context_base_us is not None and r.context_cand_us is not None and r.context_speedup
        assert r.timing_basis == ("in-context" if int(r.shape.split("x")[0]) <= 256 else "chained")
        assert r.speedup == (r.context_speedup if r.timing_basis == "in-context" else r.chained_speedup)


def _record_bench(rep, name: str) -> None:
    out = os.environ.get("ASTRA_RESULTS_DIR")
    if out:
        rep.to_json(Path(out) / f"{name}.json")
        (Path(out) / f"{name}.txt").write_text(rep.table() + "\n")
