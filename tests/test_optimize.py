"""`astra-sglang optimize` end to end, offline: the scripted model drives the SDK's real Runner, the CPU
stand-in executor compiles C candidates with the host compiler and checks them with the project's
oracle (astra_sglang.harness, device cpu).

The main run replays tests/optimize_fixtures/cpu/script.json: round 1 does not compile (nor does
its fix), round 2 is wrong (an unwritten tail), round 3 is correct but slower, round 4 is correct
and faster, round 5 writes nothing. It is interrupted in round 3 and resumed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CPU = Path(__file__).parent / "optimize_fixtures" / "cpu"
SECRET = "sk-astra-test-0123456789abcdefSECRET"
# Small shapes: the CPU checks and times these in milliseconds.
SMALL = ["--shapes", "4x4096,8x2048", "--check-shapes", "1x4096,3x1368,7x1001", "--final-shapes", "edge"]


def _need(mod: str):
    try:
        __import__(mod)
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"needs {mod} ({e}): pip install -e '.[agents]'")


@pytest.fixture(scope="module", autouse=True)
def _prereqs():
    _need("agents")
    _need("torch")
    if not (shutil.which("cc") or shutil.which("gcc")):
        if os.environ.get("CI"):
            raise RuntimeError("the CPU stand-in executor needs a C compiler")
        pytest.skip("needs a C compiler")


def optimize(*args: str, env_extra=None, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_") and k != "ASTRA_MODEL"}
    env["OPENAI_API_KEY"] = SECRET  # must never show up in any output or file
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "astra_sglang.cli", "optimize", "silu_and_mul", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def events(run_dir: Path):
    return [json.loads(l) for l in (run_dir / "log.jsonl").read_text().splitlines() if l.strip()]


def rounds(run_dir: Path):
    out = {}
    for e in events(run_dir):
        if e["event"] == "round":
            assert e["round"] not in out, f"round {e['round']} logged twice"
            out[e["round"]] = e
    return out


def no_secret(run_dir: Path, *texts: str) -> None:
    for t in texts:
        assert SECRET not in t
    for p in run_dir.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), f"the API key leaked into {p}"


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """The scripted run, interrupted in round 3 (after round 3's candidate was written), then resumed."""
    tmp = tmp_path_factory.mktemp("opt")
    fx = tmp / "fx"
    shutil.copytree(CPU, fx)
    script = json.loads((fx / "script.json").read_text())
    script["rounds"]["3"]["testing"] = [{"interrupt": "test: the machine went away"}]
    (fx / "script_interrupt.json").write_text(json.dumps(script))
    run = tmp / "run"
    common = ["--executor", "cpu", "--baseline", str(fx / "baseline.c"), "--rounds", "5", "--max-fixes", "1",
              "--run-dir", str(run), *SMALL]
    first = optimize("--model", f"scripted:{fx / 'script_interrupt.json'}", *common)
    after_first = events(run)
    again = optimize("--model", f"scripted:{fx / 'script.json'}", *common)  # no --resume: refused
    resumed = optimize("--model", f"scripted:{fx / 'script.json'}", "--resume", *common)
    return {"run": run, "fx": fx, "first": first, "after_first": after_first, "again": again, "resumed": resumed}


def test_interrupt_keeps_the_log_and_says_how_to_resume(resumed_run):
    first = resumed_run["first"]
    assert first.returncode == 130, first.stderr[-3000:]
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("error: interrupted in round 3") and "--resume" in last
    ev = resumed_run["after_first"]
    assert [e["round"] for e in ev if e["event"] == "round"] == [0, 1, 2]
    assert ev[-1]["event"] == "stop" and "interrupted" in ev[-1]["reason"]
    again = resumed_run["again"]
    assert again.returncode == 2
    assert "a run already exists" in again.stderr and "--resume" in again.stderr


def test_resumed_run_log(resumed_run):
    res, run = resumed_run["resumed"], resumed_run["run"]
    assert res.returncode == 0, res.stderr[-4000:]
    ev = events(run)
    kinds = [e["event"] for e in ev]
    assert kinds[0] == "start" and "resume" in kinds and kinds[-1] == "final"
    start = ev[0]
    assert start["op"] == "silu_and_mul" and start["mode"] == "multi" and start["bench_shapes"] == ["4x4096", "8x2048"]
    assert start["provider"]["kind"] == "scripted"
    rs = rounds(run)
    assert sorted(rs) == [0, 1, 2, 3, 4, 5]
    status = {r: rs[r]["status"] for r in rs}
    assert status == {0: "production", 1: "compile-error", 2: "wrong", 3: "correct", 4: "correct", 5: "no-candidate"}
    # every round: code hash and file, correctness with its reason, per-shape times, model usage
    for r in (0, 1, 2, 3, 4):
        rec = rs[r]
        f = run / rec["file"]
        assert f.exists()
        import hashlib

        assert rec["code_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
        assert rec["usage"]["total_tokens"] > 0 and rec["usage"]["requests"] > 0
        assert rec["reason"]
    assert rs[1]["compile"]["attempts"] == 2 and "expff" in rs[1]["compile"]["error"]
    assert (run / "candidates" / "r01.fail1.c").exists()  # the first attempt is kept
    assert "never wrote" in rs[2]["reason"] and "7x1001" in rs[2]["reason"]
    for r in (0, 3, 4):
        shapes = sorted(t["shape"] for t in rs[r]["timings"])
        assert shapes == ["4x4096", "8x2048"]
        for t in rs[r]["timings"]:
            assert t["baseline_us"] > 0 and t["candidate_us"] > 0 and "speedup" in t
    assert rs[0]["geomean"] == 1.0
    assert rs[3]["geomean"] < 1.0 < rs[4]["geomean"]
    # each round starts from the best correct kernel, not the last one: round 3 was correct but
    # slower, so round 4 starts from the production kernel; round 5 from round 4
    assert [rs[r]["parent"] for r in (1, 2, 3, 4, 5)] == [0, 0, 0, 0, 4]
    # the planner's first answer in round 2 was not JSON: re-asked, then valid
    assert rs[2]["plan"]["valid"] and rs[2]["plan"]["change"] == "Unroll the fused loop by 4."
    purposes = [e["purpose"] for e in ev if e["event"] == "agent" and e["round"] == 2]
    assert "re-asked for a valid plan" in purposes
    # round 3 was redone whole after the interruption: its agents ran in both sessions
    assert sum(1 for e in ev if e["event"] == "agent" and e["round"] == 3 and e["role"] == "coding") == 2


def test_testing_agent_adds_tests_never_replaces(resumed_run):
    ev = events(resumed_run["run"])
    added = [s for e in ev if e["event"] == "tests_added" for s in e["shapes"]]
    assert added == ["9x777", "2x2050", "6x1003"]  # 7x1001 already in the suite; 0x16, "5" rejected
    testing = [e for e in ev if e["event"] == "agent" and e["role"] == "testing" and e["round"] == 2][0]
    assert testing["tool_calls"] == ["add_tests"]
    rs = rounds(resumed_run["run"])
    assert rs[4]["extra_tests"] == ["9x777", "2x2050", "6x1003"]


def test_best_is_reverified_and_reported(resumed_run):
    run, res = resumed_run["run"], resumed_run["resumed"]
    final = events(run)[-1]
    assert final["best_round"] == 4
    assert "cases passed" in final["reverify"]
    best = run / "best.c"
    assert best.read_text() == (resumed_run["fx"] / "r4_faster.c").read_text()
    md = (run / "report.md").read_text()
    assert "| 4 | 0 |" in md and "← best" in md and "Round 4" in md
    rep = json.loads((run / "report.json").read_text())
    assert rep["final"]["best_round"] == 4 and rep["final"]["geomean"] > 1.0
    assert len(rep["final"]["timings"]) == 2
    if (run / "report.png").exists():
        assert (run / "report.png").stat().st_size > 1000
    assert "Round 4" in res.stdout and "← best" in res.stdout
    no_secret(run, res.stdout, res.stderr, resumed_run["first"].stderr)


def test_token_budget_stops_and_keeps_best_so_far(tmp_path):
    run = tmp_path / "run"
    res = optimize("--executor", "cpu", "--baseline", str(CPU / "baseline.c"), "--model",
                   f"scripted:{CPU / 'script.json'}", "--rounds", "5", "--max-tokens", "4000",
                   "--run-dir", str(run), *SMALL)
    assert res.returncode == 3, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: budget exhausted: tokens") and "best round 0" in last
    ev = events(run)
    stop = [e for e in ev if e["event"] == "stop"][0]
    assert stop["reason"].startswith("budget exhausted: tokens")
    assert [e["round"] for e in ev if e["event"] == "round"] == [0]  # round 0 done, then the budget ran out
    assert ev[-1]["event"] == "final" and ev[-1]["best_round"] == 0
    assert (run / "report.md").exists()
    used = sum(e["usage"]["total_tokens"] for e in ev if e["event"] == "agent")
    assert used >= 4000
    no_secret(run, res.stdout, res.stderr)


def test_wall_and_cost_budgets(tmp_path):
    common = ["--executor", "cpu", "--baseline", str(CPU / "baseline.c"), "--model", f"scripted:{CPU / 'script.json'}",
              *SMALL]
    res = optimize(*common, "--run-dir", str(tmp_path / "a"), "--max-minutes", "0.0001")
    assert res.returncode == 3 and "budget exhausted: wall time" in res.stderr.strip().splitlines()[-1]
    res = optimize(*common, "--run-dir", str(tmp_path / "b"), "--max-cost", "0.01")
    assert res.returncode == 2 and "--max-cost needs a price" in res.stderr
    res = optimize(*common, "--run-dir", str(tmp_path / "c"), "--max-cost", "0.001", "--price", "100,100")
    assert res.returncode == 3 and "budget exhausted: cost" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]


def test_single_agent_ablation(tmp_path):
    script = {"rounds": {"1": {"single": [
        {"tool_calls": [{"name": "read_log", "arguments": {}}, {"name": "roofline", "arguments": {}}]},
        {"tool_calls": [{"name": "write_candidate", "arguments": {"source_file": str(CPU / "r4_faster.c")}}]},
        {"final": "Fused fp32 pass."}]}}}
    s = tmp_path / "single.json"
    s.write_text(json.dumps(script))
    run = tmp_path / "run"
    res = optimize("--executor", "cpu", "--baseline", str(CPU / "baseline.c"), "--model", f"scripted:{s}",
                   "--rounds", "1", "--single-agent", "--run-dir", str(run), *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    ev = events(run)
    assert ev[0]["mode"] == "single"
    roles = {e["role"] for e in ev if e["event"] == "agent"}
    assert roles == {"single"}
    rs = rounds(run)
    assert rs[1]["status"] == "correct" and rs[1]["geomean"] > 1.0
    assert ev[-1]["best_round"] == 1
    res = optimize("--executor", "cpu", "--baseline", str(CPU / "baseline.c"), "--model", f"scripted:{s}",
                   "--rounds", "2", "--resume", "--run-dir", str(run), *SMALL)
    assert res.returncode == 2 and "resume it with --single-agent" in res.stderr


@pytest.fixture(scope="module")
def policies_run(tmp_path_factory):
    """tests/optimize_fixtures/cpu/policies.json: --profile-from-round 2 --beam 2, a refused round."""
    tmp = tmp_path_factory.mktemp("policies")
    fx = tmp / "fx"
    shutil.copytree(CPU, fx)
    run = tmp / "run"
    res = optimize("--executor", "cpu", "--baseline", str(fx / "baseline.c"), "--model",
                   f"scripted:{fx / 'policies.json'}", "--rounds", "4", "--profile-from-round", "2", "--beam", "2",
                   "--run-dir", str(run), *SMALL)
    reqs = [json.loads(l) for l in (fx / "requests.jsonl").read_text().splitlines()]
    return {"run": run, "res": res, "requests": reqs}


def test_policies_refused_round_and_beam_parents(policies_run):
    res, run = policies_run["res"], policies_run["run"]
    assert res.returncode == 0, res.stderr[-4000:]
    ev = events(run)
    assert ev[0]["profile_from_round"] == 2 and ev[0]["beam"] == 2
    rs = rounds(run)
    assert {r: rs[r]["status"] for r in rs} == {0: "production", 1: "refused", 2: "correct", 3: "correct",
                                                4: "no-candidate"}
    assert rs[1]["refused"] and "bench refused the timing" in rs[1]["reason"]
    assert any(w in rs[1]["refused"][0] for w in ("faster than copying its bytes", "under the launch floor"))
    # beam 2: round 2 has only production to start from; round 3 the never-expanded round 2; round 4 round 3
    assert [rs[r]["parent"] for r in (1, 2, 3, 4)] == [0, 0, 2, 3]
    assert rs[3]["beam"] == [0, 2] and rs[4]["beam"] == [3, 0]
    assert rs[3]["geomean"] > 1.0 and ev[-1]["best_round"] == 3
    # each round logs the regimes its planner was shown and whether profiling was given
    assert [rs[r]["profiling"] for r in range(5)] == [False, False, True, True, True]
    for r in (1, 2, 3, 4):
        assert sorted(w["shape"] for w in rs[r]["workload"]) == ["4x4096", "8x2048"]
        assert all(w["regime"] in ("latency-bound", "in between", "bandwidth-bound") for w in rs[r]["workload"])
    # the stand-in measured its references: launch floor, copy % per shape
    assert rs[0]["bench_info"]["launch_floor_us"] > 0
    assert all(t["baseline_pct_ceiling"] > 0 for t in rs[0]["timings"])


def test_policies_prompts_per_round(policies_run):
    reqs = policies_run["requests"]

    def of(r, role):
        return [q for q in reqs if q["round"] == r and q["role"] == role]

    # Nsight Compute withheld before round 2: not offered, and the instructions say so
    for r in (0, 1):
        for q in reqs:
            if q["round"] == r:
                assert "ncu" not in q["tools"], (r, q["role"], q["tools"])
    assert "Nsight Compute metrics are not given before round 2" in of(0, "profiling")[0]["instructions"]
    assert "timings only: Nsight Compute metrics come from round 2 on" in of(1, "planning")[0]["input"]
    # from round 2 on the profiler holds ncu, and production is profiled again with it
    prof2 = of(2, "profiling")
    assert prof2 and "ncu" in prof2[0]["tools"] and "Kernel under study: round 0" in prof2[0]["input"]
    assert "timings only" not in of(2, "planning")[0]["input"]
    # workload-aware: every timed shape with its regime, both times, the strategies per regime
    for r in (1, 2, 3, 4):
        plan = of(r, "planning")[0]
        assert "Workload (each timed shape's regime, measured in this run)" in plan["input"]
        for shape in ("| 4x4096 | fp32 |", "| 8x2048 | fp32 |"):
            assert shape in plan["input"]
        assert "in-context / chained" in plan["input"]
        assert "Strategies by regime" in plan["instructions"] and "CuTe" in plan["instructions"]
    # the planner after the refused round is told why it failed
    assert "REFUSED" in of(2, "planning")[0]["input"] and "- round 1:" in of(2, "planning")[0]["input"]
    assert "REFUSED" not in of(1, "planning")[0]["input"]
    assert "With --beam 2 this round starts from round 2" in of(3, "planning")[0]["input"]
