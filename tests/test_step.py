"""CPU tests of the decode-step A/B (`astra-sglang e2e --step`): schedule, statistics, parity, the
generated tokenizer, and the whole driver against a stand-in worker (tests/step_fake_worker.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from astra_sglang.e2e import step_stats as ss
from astra_sglang.e2e.step import arms_for, arms_from_meta, kv_tokens_needed, parse_sizes, worker_server_args
from astra_sglang.e2e.tokenizer import model_dir_with_tokenizer, tokenizer_json
from astra_sglang.errors import AstraError

HERE = Path(__file__).resolve().parent
FAKE = str(HERE / "step_fake_worker.py")


# ----------------------------------------------------------------------------- schedule and stats

def test_schedule_abba_for_two_and_three_arms():
    s = ss.step_schedule(["A", "B"], 4)
    assert s[:2] == [(-1, "A"), (-1, "B")]
    assert "".join(a for r, a in s if r >= 0) == "ABBAABBA"
    s3 = [a for r, a in ss.step_schedule(["A", "A2", "B"], 2, warmup=0)]
    assert s3 == ["A", "A2", "B", "B", "A2", "A"]
    for arms in (["A", "B"], ["A", "A2", "B"]):
        meas = [a for r, a in ss.step_schedule(arms, 4) if r >= 0]
        pos = {a: np.mean([i for i, x in enumerate(meas) if x == a]) for a in arms}
        assert len(set(pos.values())) == 1          # every arm at the same mean position
    with pytest.raises(ValueError):
        ss.step_schedule(["A", "B"], 0)


def _rec(arm, rnd, bs, step_ms, prefill_ms=20.0, tokens=None):
    return {"arm": arm, "round": rnd, "batch_size": bs, "prefill_s": prefill_ms / 1e3,
            "decode_s": [step_ms / 1e3] * 5 + [9.0],        # one outlier step: the median ignores it
            "tokens": tokens if tokens is not None else [[1, 2, 3]] * bs}


def test_compare_is_paired_by_round_and_uses_the_median_step():
    recs = [_rec("A", -1, 1, 50.0)]          # warm-up: ignored
    for r, (a, b) in enumerate([(10.0, 9.8), (11.0, 10.78), (10.5, 10.29)]):
        recs += [_rec("A", r, 1, a), _rec("B", r, 1, b)]
    c = ss.compare(recs, "A", "B", 1)
    assert c["rounds"] == 3 and c["decode_ms"]["n"] == 3
    assert c["decode_ms"]["delta"] == pytest.approx(-0.02)
    assert c["decode_ms"]["ci_width"] == pytest.approx(0.0, abs=1e-9)   # same ratio every round
    assert c["decode_ms"]["base"] == pytest.approx(10.5)
    assert c["prefill_ms"]["delta"] == pytest.approx(0.0)


def test_ci_covers_a_null_effect_at_nominal_rate():
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(300):
        recs = []
        for r in range(6):
            noise = rng.normal(0, 0.01, 2)
            recs += [_rec("A", r, 1, 10 * (1 + noise[0])), _rec("B", r, 1, 10 * (1 + noise[1]))]
        d = ss.compare(recs, "A", "B", 1)["decode_ms"]
        hits += d["lo"] <= 0 <= d["hi"]
    assert 0.91 <= hits / 300 <= 0.99


def test_parity_same_round_and_self():
    recs = [_rec("A", 0, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]]), _rec("B", 0, 2, 10, tokens=[[1, 2, 3], [4, 9, 6]]),
            _rec("A", 1, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]]), _rec("B", 1, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]])]
    p = ss.parity(recs, "A", "B", 2)
    assert p == {"compared": 4, "identical": 3, "first_divergence": [1]}
    assert ss.self_parity(recs, "A", 2) == {"compared": 2, "identical": 2, "first_divergence": []}


def test_summary_report_and_prediction():
    recs = []
    for r in range(4):
        recs += [_rec("A", r, 8, 10.0 + 0.01 * r), _rec("B", r, 8, 9.8 + 0.01 * r)]
    s = ss.summarize(recs, [("A", "B")], {("B", 8): {"saved_us": 150.0, "in_context_saved_us": 100.0}})
    c = s["comparisons"][0]
    assert c["predicted"]["delta"] == pytest.approx(-150.0 / (c["decode_ms"]["base"] * 1e3))
    assert c["predicted"]["in_context_delta"] == pytest.approx(-100.0 / (c["decode_ms"]["base"] * 1e3))
    md = ss.report_markdown(s, {"GPU": "FakeGPU"})
    assert "| A → B | 8 | 4 |" in md and "-1.50%" in md and "32/32" in md


# ----------------------------------------------------------------------------- driver pieces

def test_arms_sizes_kv_and_server_args():
    assert arms_for("all", False, False) == {"A": "none", "B": "all"}
    assert arms_for("silu_and_mul,fused_add_rmsnorm", False, True)["B"] == ["silu_and_mul", "fused_add_rmsnorm"]
    assert arms_for("none", True, False) == {"A": "none", "A2": "none"}
    with pytest.raises(AstraError, match="--aa"):
        arms_for("none", False, False)
    assert arms_from_meta("A: ops none, A2: ops none, B: ops silu_and_mul,fused_add_rmsnorm") == {
        "A": "none", "A2": "none", "B": ["silu_and_mul", "fused_add_rmsnorm"]}
    assert parse_sizes("1, 8,32", "--batch-size") == [1, 8, 32]
    for bad in ("", "0", "1,a", "-4"):
        with pytest.raises(AstraError, match="--batch-size"):
            parse_sizes(bad, "--batch-size")
    kv = kv_tokens_needed([1, 64], 256, 32, 10)
    assert kv % 1024 == 0 and kv >= 64 * (256 + 32)
    a = worker_server_args(64, [64, 1, 8], kv, 0.9, 30000, False, ["--tp=1"])
    assert a[a.index("--cuda-graph-bs") + 1:a.index("--cuda-graph-bs") + 4] == ["1", "8", "64"]
    assert "--disable-piecewise-cuda-graph" in a and a[-1] == "--tp=1"
    assert "--disable-piecewise-cuda-graph" not in worker_server_args(64, [1], kv, 0.9, 1, True, [])


def test_generated_tokenizer_dir(tmp_path):
    src = HERE.parent / "e2e" / "configs" / "qwen3-8b"
    d = model_dir_with_tokenizer(src, tmp_path / "m")
    assert json.loads((d / "config.json").read_text())["hidden_size"] == 4096
    tok = json.loads((d / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "WordLevel" and tok == tokenizer_json()
    assert json.loads((d / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert model_dir_with_tokenizer(d, tmp_path / "again") == d       # has one already
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    assert Tokenizer.from_file(str(d / "tokenizer.json")).encode("t1 t2").ids == [4, 5]


def test_weights_without_tokenizer_need_a_path(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(AstraError, match="--tokenizer-path"):
        model_dir_with_tokenizer(tmp_path, tmp_path / "x")


# ----------------------------------------------------------------------------- the whole CLI

def _step(tmp_path, *args, env=None):
    cmd = [sys.executable, "-m", "astra_sglang.cli", "e2e", "--step", "--model-path", "llama3-8b", "--batch-size",
           "1,8", "--output-len", "8", "--rounds", "3", "--profile-steps", "3", "--worker-module", FAKE,
           "--out", str(tmp_path / "out"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd="/", env={**os.environ, **(env or {})},
                          timeout=240)


def test_step_ab_end_to_end(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"op": "fused_add_rmsnorm", "date": "2099-01-01", "rows": [  # newest wins
        {"shape": "1x4096", "dtype": "bf16", "speedup": 2.0}, {"shape": "8x4096", "dtype": "bf16", "speedup": 2.0}]}))
    r = _step(tmp_path, "--ops", "fused_add_rmsnorm", env={"ASTRA_SGLANG_RESULTS": str(bench.parent)})
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    s = json.loads((out / "summary.json").read_text())
    c = {x["batch_size"]: x for x in s["comparisons"]}
    assert set(c) == {1, 8} and c[1]["rounds"] == 3
    # the stand-in's patched arm saves FAKE_SAVED_US per step; measured and both predictions agree
    from step_fake_worker import FAKE_SAVED_US  # noqa: E402

    for bs, x in c.items():
        expect = -FAKE_SAVED_US / (x["decode_ms"]["base"] * 1e3)
        assert x["decode_ms"]["lo"] <= expect <= x["decode_ms"]["hi"] or abs(x["decode_ms"]["delta"] - expect) < 2e-3
        assert x["predicted"]["delta"] == pytest.approx(expect, rel=0.05)
        assert x["predicted"]["in_context_delta"] == pytest.approx(expect, rel=0.05)
        assert x["parity"]["identical"] == x["parity"]["compared"] == 3 * bs
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sum(1 for x in runs if x["round"] == -1) == 4            # one warm-up per arm and batch size
    assert (out / "report.md").read_text().count("| A → B |") == 2
    assert (out / "step.png").is_file() and (out / "profile" / "profile.md").is_file()
    assert (out / "profile" / "shapes.json").is_file()
    # re-analysis from results.json alone
    r2 = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "e2e", "--step", "--analyze",
                         str(out / "results.json"), "--out", str(tmp_path / "re")], capture_output=True, text=True,
                        cwd="/", env={**os.environ, "ASTRA_SGLANG_RESULTS": str(bench.parent)})
    assert r2.returncode == 0, r2.stderr
    s2 = json.loads((tmp_path / "re" / "summary.json").read_text())
    assert s2["comparisons"][0]["decode_ms"] == s["comparisons"][0]["decode_ms"]


def test_step_aa_and_divergence(tmp_path):
    r = _step(tmp_path, "--aa", "--no-profile")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {(x["base"], x["other"]) for x in s["comparisons"]} == {("A", "A2")}
    assert all("predicted" not in x for x in s["comparisons"])
    r = _step(tmp_path, "--ops", "all", "--no-profile", env={"FAKE_DIVERGE": "1"})
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    p = s["comparisons"][0]["parity"]
    assert p["identical"] == p["compared"] - 3 and p["first_divergence"] == [3, 3, 3]
    assert "first divergence at token 3" in (tmp_path / "out" / "report.md").read_text()


def test_step_calibrate_runs_three_arms(tmp_path):
    r = _step(tmp_path, "--calibrate", "--ops", "all", "--no-profile")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(x["base"], x["other"]) for x in s["comparisons"]] == [("A", "A2"), ("A", "A2"), ("A", "B"), ("A", "B")]


@pytest.mark.parametrize("args,env,msg", [
    (["--ops", "none"], None, "--aa"),
    (["--batch-size", "0"], None, "--batch-size"),
    (["--output-len", "1"], None, "--output-len"),
    (["--load-format", "auto"], None, "dummy"),
    (["--ops", "all"], {"FAKE_FAIL_START": "B"}, "worker B failed to start: RuntimeError: no GPU"),
])
def test_step_bad_input_is_one_error_line(tmp_path, args, env, msg):
    r = _step(tmp_path, *args, env=env)
    assert r.returncode != 0
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert err and msg in r.stderr, r.stderr
