"""optimize's policies, fast (no executor runs): the tools written once over a RoundContext and the
import order without cycles, workload regimes, in-context timings as the basis, parents under
--beam, refused bench rows, the CuTe include path."""
from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from astra_sglang.agents.context import OptimizeConfig, RoundContext, Run, best_of, choose_parent
from astra_sglang.agents.executor import BenchResult, Timing
from astra_sglang.agents.runlog import Redactor, RunLog
from astra_sglang.agents.workload import LATENCY_X, STRATEGIES, classify, regimes, workload_table

AGENTS = Path(__file__).resolve().parents[1] / "astra_sglang" / "agents"
CUTE = Path(__file__).parent / "optimize_fixtures" / "cute"


# -- structure -----------------------------------------------------------------------------------------
def _local_imports(path: Path):
    """Modules of the agents package that `path` imports (at any depth, TYPE_CHECKING included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.add(node.module or "")
    return out


def test_agents_package_has_no_import_cycle():
    mods = {p.stem: _local_imports(p) for p in AGENTS.glob("*.py")}
    order = ["context", "tools", "roles", "orchestrator", "cli"]
    for i, m in enumerate(order):  # each imports only what comes before it in the chain
        assert not mods[m] & set(order[i + 1:]), (m, mods[m])
    seen, stack = set(), []

    def visit(m):
        assert m not in stack, f"import cycle: {' -> '.join(stack + [m])}"
        if m in seen or m not in mods:
            return
        stack.append(m)
        for n in mods[m]:
            visit(n)
        stack.pop()
        seen.add(m)

    for m in mods:
        visit(m)


def test_each_tool_is_one_function_over_the_round_context():
    from astra_sglang.agents import tools

    src = (AGENTS / "tools.py").read_text()
    assert "class ToolBox" not in src
    for name in {n for names in tools.ROLE_TOOLS.values() for n in names}:
        fn = tools.TOOLS[name]
        assert src.count(f"def {name}(") == 1, name
        assert "RunContextWrapper[RoundContext]" in src.split(f"def {name}(", 1)[1].split(")", 1)[0]
        assert fn.__doc__ and fn.__doc__.strip()
    orch = (AGENTS / "orchestrator.py").read_text()
    for name in ("def add_tests", "def read_source", "def write_candidate"):
        assert name not in orch  # the orchestrator holds no second copy of a tool


def test_sdk_tools_take_the_context_and_strictness_follows_the_provider():
    agents = pytest.importorskip("agents")
    from astra_sglang.agents.tools import sdk_tools, tools_for

    for strict in (True, False):
        ft = {t.name: t for t in sdk_tools(tools_for("single", True), strict)}
        assert set(ft) == {"list_tests", "add_tests", "read_source", "read_log", "write_candidate", "bench", "ncu",
                           "roofline"}
        assert all(t.strict_json_schema is strict for t in ft.values())
        assert set(ft["bench"].params_json_schema["properties"]) == {"shapes"}  # the context is not a parameter
    assert "ncu" not in tools_for("profiling", False) and "ncu" in tools_for("profiling", True)
    assert "ncu" not in tools_for("single", False)
    assert agents  # used


def _run(tmp_path, records=None):
    spec = SimpleNamespace(name="silu_and_mul", symbol="astra_silu_and_mul", dim_names=("num_tokens", "hidden"),
                           distributions=("normal",))
    ex = SimpleNamespace(source_suffix=".c", read_include=lambda w: f"include {w}")
    cfg = OptimizeConfig(rounds=3, bench_shapes=[(4, 4096)], bench_dtypes=["fp32"], profile_from_round=2)
    return Run(spec, ex, cfg, tmp_path, RunLog(tmp_path, Redactor()), lambda m: None, records or {})


def test_tools_act_on_the_context_they_are_given(tmp_path):
    agents = pytest.importorskip("agents")
    from astra_sglang.agents.tools import TOOLS

    (tmp_path / "candidates").mkdir()
    (tmp_path / "candidates" / "r00.c").write_text("// production\n")
    run = _run(tmp_path, {0: {"round": 0, "correct": True, "geomean": 1.0, "file": "candidates/r00.c"}})
    ctx = RoundContext(run, 1, parent=0, profiling=False)
    wrap = agents.RunContextWrapper(ctx)
    assert TOOLS["read_source"](wrap, "current") == "// production\n"
    assert TOOLS["read_source"](wrap, "csrc/x.cuh") == "include csrc/x.cuh"
    assert TOOLS["write_candidate"](wrap, "int x;").startswith("error: no candidate is being written")
    ctx.write_to(tmp_path / "candidates" / "r01.c")
    assert "must define the ABI entry point" in TOOLS["write_candidate"](wrap, "int x;")
    assert TOOLS["write_candidate"](wrap, "int astra_silu_and_mul;").startswith("wrote r01.c")
    assert ctx.written and TOOLS["read_source"](wrap, "candidate") == "int astra_silu_and_mul;\n"
    # Nsight Compute withheld before --profile-from-round, even if a model names the tool
    assert TOOLS["ncu"](wrap, "4x4096", "fp32").startswith("withheld: Nsight Compute metrics are given from round 2")
    ctx.profiling = True
    assert TOOLS["ncu"](wrap, "4x4096", "fp32") == "unavailable: no kernel is under study in this step"


# -- workload regimes ----------------------------------------------------------------------------------
def _t(shape, prod, cand, pct=None, **kw):
    return Timing(shape, "fp16", prod, cand, 0.01, 0.01, None, pct, **kw)


def test_regimes_from_launch_floor_and_copy_ceiling():
    floor = 0.5
    assert classify(_t((16, 4096), 1.65, 1.2, 5.8), floor).regime == "latency-bound"  # 3.3x the floor
    assert classify(_t((1024, 4096), 7.1, 7.0, 86.0), floor).regime == "bandwidth-bound"
    mid = classify(_t((256, 4096), 3.03, 2.47, 50.0), floor)
    assert mid.regime == "in between" and "50% of the copy ceiling" in mid.why and "6.1x the launch floor" in mid.why
    assert classify(_t((64, 8192), LATENCY_X * floor, 1.0, 34.0), floor).regime == "latency-bound"  # the bound
    assert classify(_t((1, 1), 5.0, 4.0), None).regime == "unknown"


def test_in_context_times_are_the_basis_when_bench_has_them():
    chained = _t((16, 4096), 1.65, 1.20, 5.8)
    assert chained.basis == "chained" and chained.speedup == pytest.approx(1.375)
    ctx = _t((16, 4096), 1.65, 1.20, 5.8, context_base_us=2.89, context_cand_us=2.80, context_spread_us=0.05,
             timing_basis="in-context")
    assert ctx.basis == "in-context" and ctx.speedup == pytest.approx(2.89 / 2.80) and not ctx.noise
    assert Timing.from_json(ctx.to_json()) == ctx and ctx.to_json()["timing_basis"] == "in-context"
    # a row that says in-context but has no context times falls back to the chained ones
    assert _t((1, 8), 2.0, 1.0, timing_basis="in-context").speedup == 2.0
    assert BenchResult(True, timings=[ctx]).geomean == pytest.approx(2.89 / 2.80)
    table = workload_table(regimes([ctx.to_json(), _t((512, 14336), 11.5, 11.4, 93.0).to_json()],
                                   {"launch_floor_us": 0.5}))
    assert "| 16x4096 | fp16 | latency-bound" in table and "| 2.89 / 1.65 | 2.80 / 1.20 | 1.032x (in-context) |" in table
    assert "| 512x14336 | fp16 | bandwidth-bound: 93% of the copy ceiling | — / 11.50 |" in table
    assert "Regimes: 1 latency-bound, 1 bandwidth-bound." in table
    from astra_sglang.agents.report import timing_table

    tt = timing_table([ctx, _t((512, 14336), 11.5, 11.4, 93.0)])
    assert "in-context production / candidate µs" in tt and "| 2.89 / 2.80 | 1.032x (in-context) |" in tt
    assert "| — | 1.009x (chained) (noise) |" in tt
    assert "in-context" not in timing_table([chained])  # a bench without in-context rows: the old table
    assert "attainable" not in tt  # no floor measured: no column
    floored = _t((1, 4096), 2.0, 1.7, 5.0, context_base_us=2.01, context_cand_us=1.60, context_spread_us=0.05,
                 timing_basis="in-context", context_headroom=2.01 / 0.41)
    assert floored.attainable == pytest.approx(2.01 / 0.41) and Timing.from_json(floored.to_json()) == floored
    assert _t((1, 4096), 2.0, 1.7, 5.0, context_headroom=2.01 / 0.41).attainable is None  # a chained row: no bound
    ft = timing_table([floored, ctx])
    assert "| speedup | attainable |" in ft and "| 1.256x (in-context) | 4.90x |" in ft and "| — |" in ft
    assert "no candidate can be faster than that" in ft
    only_chained = workload_table(regimes([_t((16, 4096), 1.65, 1.2, 5.8)], {"launch_floor_us": 0.5}))
    assert "In-context times were not measured by this bench: the chained times are the basis." in only_chained
    for regime in ("latency-bound", "bandwidth-bound", "in between", "CuTe"):
        assert regime in STRATEGIES
    assert "`attainable` column" in STRATEGIES and "removing its launch" in STRATEGIES  # the floor's lesson


def test_gpu_rows_map_context_fields_and_refusals():
    from astra_sglang.agents.gpu_executor import refusals, timing_of

    base = dict(shape="16x4096", dtype="fp16", prod_us=1.65, prod_spread=0.01, cand_us=1.2, cand_spread=0.01,
                cand_pct_of_ceiling=8.0, prod_pct_of_ceiling=5.8)
    old = SimpleNamespace(**base)  # a row from a bench without in-context timing
    assert timing_of(old).basis == "chained" and timing_of(old).context_base_us is None
    new = SimpleNamespace(**base, context_base_us=2.9, context_cand_us=2.1, context_spread_us=0.04,
                          context_speedup=1.38, timing_basis="in-context", refused="")
    assert timing_of(new).speedup == pytest.approx(2.9 / 2.1) and timing_of(new).attainable is None
    floored = SimpleNamespace(**vars(new), context_floor_us=0.5, context_floor_spread_us=0.1, headroom=5.8)
    assert timing_of(floored).attainable == pytest.approx(2.9 / 0.5)
    unbounded = SimpleNamespace(**vars(new), context_floor_us=0.05, headroom=None)  # floor within its spread of 0
    assert timing_of(unbounded).attainable is None
    bad = SimpleNamespace(**{**base, "shape": "64x8192"}, refused="3.1 TB/s above the 2.9 TB/s copy ceiling")
    assert refusals([old, new, bad]) == ["64x8192 fp16: 3.1 TB/s above the 2.9 TB/s copy ceiling"]
    assert refusals([{"shape": "1x8", "dtype": "bf16", "refused": "under the launch floor"}]) == [
        "1x8 bf16: under the launch floor"]
    assert refusals([{"shape": "1x8", "dtype": "bf16", "failed": "timed graph re-check: out differs"}]) == [
        "1x8 bf16: timed graph re-check: out differs"]


def test_standin_refuses_impossible_timings():
    from astra_sglang.agents.standin import impossible

    rows = [{"shape": [4, 4096], "candidate_us": 100.0, "candidate_spread": 0.02, "copy_min_us": 2.0},
            {"shape": [8, 2048], "candidate_us": 0.4, "candidate_spread": 9.0, "copy_min_us": 2.0},
            {"shape": [1, 64], "candidate_us": 0.1, "candidate_spread": 0.02, "copy_min_us": 0.05},
            {"shape": [2, 64], "candidate_us": 0.95, "candidate_spread": 0.02, "copy_min_us": 1.0}]
    out = impossible(rows, 0.3)
    # a candidate's own spread is no excuse; within the CPU margin of a reference is not refused
    assert out[0].startswith("8x2048 fp32: 0.400 µs per call is faster than copying its bytes (2.000 µs at best)")
    assert out[1].startswith("1x64 fp32: 0.100 µs per call is under the launch floor (0.300 µs)")
    assert len(out) == 2


# -- parents -------------------------------------------------------------------------------------------
def _rec(r, g, parent=None, correct=True):
    return {"round": r, "geomean": g, "correct": correct, "parent": parent}


def test_beam_parents():
    recs = {0: _rec(0, 1.0)}
    assert choose_parent(recs, 1)["round"] == 0 and choose_parent(recs, 3)["round"] == 0
    recs.update({1: _rec(1, 1.2, 0), 2: _rec(2, 1.1, 0), 3: _rec(3, 5.0, 0, correct=False)})
    assert choose_parent(recs, 1)["round"] == 1  # one evolving kernel: always the best
    assert choose_parent(recs, 2)["round"] == 1  # 1 and 2 never expanded: the better one first
    recs[4] = _rec(4, None, 1, correct=False)
    assert choose_parent(recs, 2)["round"] == 2  # 1 was expanded once, 2 not yet
    recs[5] = _rec(5, 0.9, 2)
    assert choose_parent(recs, 2)["round"] == 1  # tie (one use each): the better
    assert choose_parent(recs, 3)["round"] == 1  # 0 was expanded three times, 1 and 2 once each
    assert best_of(recs)["round"] == 1


# -- CuTe --------------------------------------------------------------------------------------------------
def _fake_cutlass(root: Path) -> Path:
    inc = root / "flashinfer" / "data" / "cutlass" / "include"
    (inc / "cute").mkdir(parents=True)
    (inc / "cute" / "tensor.hpp").write_text("#pragma once\n")
    (inc / "cutlass").mkdir()
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 5\n#define CUTLASS_PATCH 0\n")
    (root / "flashinfer" / "data" / "include").mkdir(parents=True)
    return inc


def test_cute_headers_found_beside_the_workspace_flashinfer_source(tmp_path, monkeypatch):
    from astra_sglang.agents.cute import ENV, cutlass_version, find_include, with_includes

    monkeypatch.delenv(ENV, raising=False)
    inc = _fake_cutlass(tmp_path)
    manifest = {"include_dirs": ["src/sglang_jit/include"],
                "sources": {"flashinfer": {"path": str(tmp_path / "flashinfer" / "data" / "include")}}}
    assert find_include(manifest) == inc.resolve()
    assert cutlass_version(inc) == "4.5.0"
    monkeypatch.setenv(ENV, str(tmp_path / "nowhere"))
    assert find_include(manifest) == inc.resolve()  # a wrong override is skipped, the next place used
    ws = SimpleNamespace(path=tmp_path / "ws", manifest=manifest)
    wide = with_includes(ws, [inc])
    assert wide.manifest["include_dirs"] == ["src/sglang_jit/include", str(inc.resolve())]
    assert ws.manifest["include_dirs"] == ["src/sglang_jit/include"]  # the workspace itself is untouched
    assert (ws.path / wide.manifest["include_dirs"][1]) == inc.resolve()  # absolute survives the join


def test_cute_candidate_passes_the_static_checks():
    from astra_sglang.static_checks import errors, scan_file

    assert not errors(scan_file(CUTE / "silu_cute.cu", []))


def test_refused_round_is_reported_to_the_planner(tmp_path):
    from astra_sglang.agents.orchestrator import _status
    from astra_sglang.agents.report import outcome_text

    rec = {"round": 2, "compile": {"ok": True, "attempts": 1}, "correct": False, "refused": ["4x4096 fp32: skipped"],
           "reason": "bench refused the timing: 4x4096 fp32: skipped"}
    rec["status"] = _status(rec)
    assert rec["status"] == "refused"
    assert outcome_text(rec) == "refused by bench: 4x4096 fp32: skipped"
    assert json.loads(json.dumps(rec))["refused"] == ["4x4096 fp32: skipped"]
