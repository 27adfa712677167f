"""`e2e --collect`: several server A/Bs in one table and plot, each judged against its own A/A (CPU only)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from astra_sglang.e2e.collect import collect, judge, parse_runs, rows
from astra_sglang.errors import AstraError


def _cmp(metric: str, rel: float, lo: float, hi: float, a: float = 100.0) -> dict:
    return {"metric": metric, "a_mean": a, "b_mean": a * (1 + rel), "rel_change": rel, "rel_lo": lo, "rel_hi": hi,
            "boot_point": float("nan"), "boot_lo": float("nan"), "boot_hi": float("nan"), "n_rounds": 5}


def _summary(tput: tuple, tpot: tuple, parity: str = "8/8 identical") -> dict:
    return {"workloads": {"bs1": {
        "comparisons": {"output_throughput": _cmp("output_throughput", *tput),
                        "tpot_mean": _cmp("tpot_mean", *tpot, a=5.0)},
        "parity": {"ab": {"label": "A vs B (same round)", "summary": f"A vs B (same round): {parity}"}}}},
        "meta": {}}


def _run(tmp: Path, name: str, ab: dict, aa: dict | None = None) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(ab))
    if aa is not None:
        (d / "summary-aa.json").write_text(json.dumps(aa))
    return d


def test_each_run_is_judged_against_its_own_aa(tmp_path):
    """A gain past its own A/A's floor resolves; the same gain beside a wide A/A does not; no A/A: not judged."""
    tight_aa = _summary((0.002, -0.005, 0.009), (-0.001, -0.004, 0.002))
    wide_aa = _summary((0.04, -0.08, 0.16), (-0.03, -0.11, 0.05))
    gain = _summary((0.10, 0.08, 0.12), (-0.09, -0.10, -0.08))
    runs = [("dense", _run(tmp_path, "dense", gain, tight_aa)), ("moe", _run(tmp_path, "moe", gain, wide_aa)),
            ("bare", _run(tmp_path, "bare", gain))]
    rs = {r["run"]: r for r in rows(runs)}
    assert rs["dense"]["output_throughput"]["verdict"] == "resolved: B better"
    assert rs["dense"]["tpot_mean"]["verdict"] == "resolved: B better"      # lower TPOT is better
    assert rs["moe"]["output_throughput"]["verdict"] == "not resolved"      # +10% inside the A/A's ±12%
    assert rs["moe"]["output_throughput"]["floor"] == pytest.approx(0.12)
    assert rs["bare"]["output_throughput"]["verdict"] == "no A/A: not judged"
    assert rs["dense"]["aa_source"] == "same rounds" and rs["bare"]["aa_source"] == "none"


def test_judge_reads_an_offset_aa_by_its_far_edge_and_a_slower_b_as_worse():
    # the A/A excludes 0: the floor is its far edge (2%), and a -5% throughput is resolved, B worse
    floor, verdict = judge("output_throughput", (-0.05, -0.06, -0.04), (0.015, 0.01, 0.02))
    assert floor == pytest.approx(0.02) and verdict == "resolved: B worse"
    assert judge("tpot_mean", None, None) == (None, "—")


def test_collect_writes_table_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    aa = _summary((0.0, -0.01, 0.01), (0.0, -0.01, 0.01))
    a = _run(tmp_path, "qwen", _summary((0.2, 0.19, 0.21), (-0.17, -0.18, -0.16)), aa)
    b = _run(tmp_path, "llama", _summary((0.003, -0.007, 0.014), (0.003, -0.004, 0.01), "7/8 identical"), aa)
    md = collect([f"Qwen3-8B={a}", str(b)], tmp_path / "out")
    assert "| Qwen3-8B | bs1 |" in md and "| llama | bs1 |" in md
    assert "**+20.00% [+19.00%, +21.00%]**" in md and "not resolved" in md and "7/8 identical" in md
    assert (tmp_path / "out" / "collect.png").stat().st_size > 1000
    assert len(json.loads((tmp_path / "out" / "collect.json").read_text())) == 2


def test_bad_collect_inputs_are_one_error(tmp_path):
    with pytest.raises(AstraError, match="no summary.json"):
        parse_runs([str(tmp_path)])
    d = _run(tmp_path, "x", _summary((0.1, 0.0, 0.2), (0.0, -0.1, 0.1)))
    with pytest.raises(AstraError, match="names two runs"):
        parse_runs([str(d), f"x={d}"])


def test_cli_collect_runs_without_sglang_and_refuses_a_model(tmp_path):
    from click.testing import CliRunner

    from astra_sglang.e2e.cli import e2e_cmd

    d = _run(tmp_path, "run", _summary((0.1, 0.05, 0.15), (-0.1, -0.15, -0.05)),
             _summary((0.0, -0.01, 0.01), (0.0, -0.01, 0.01)))
    res = CliRunner().invoke(e2e_cmd, ["--collect", str(d), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "collect.md").is_file() and "resolved: B better" in res.output
    bad = CliRunner().invoke(e2e_cmd, ["--collect", str(d), "--model-path", "qwen3-8b", "--out", str(tmp_path / "p")])
    assert bad.exit_code != 0 and "--collect only reads earlier runs" in str(bad.exception or bad.output)
    missing = CliRunner().invoke(e2e_cmd, ["--collect", str(tmp_path / "nope"), "--out", str(tmp_path / "q")])
    assert missing.exit_code != 0 and "no summary.json" in str(missing.exception or missing.output)
