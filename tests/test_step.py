"""CPU tests of the decode-step A/B (`astra-sglang e2e --step`): schedule, statistics, parity, the
generated tokenizer, and the whole driver against a stand-in worker (tests/step_fake_worker.py)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from astra_sglang.e2e import step_stats as ss
from astra_sglang.e2e.step import (arms_for, arms_from_meta, env_of_arm, kv_tokens_needed, parse_arm_env, parse_sizes,
                                   worker_server_args)
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


def _names(sched, rnd):
    return " ".join(f"{a}{i}" for r, a, i in sched if r == rnd)


@pytest.mark.parametrize("arms,procs", [(["A", "B"], 2), (["A", "B"], 3), (["A", "A2", "B"], 2), (["A", "A2"], 4)])
def test_process_schedule_abba_over_processes_and_rounds(arms, procs):
    s = ss.process_schedule(arms, procs, 4, warmup=2)
    if (arms, procs) == (["A", "B"], 2):
        assert _names(s, 0) == "A1 B1 B2 A2" and _names(s, 1) == "A2 B2 B1 A1"
    warm = [x for x in s if x[0] == -1]
    assert len(warm) == 2 * len(arms) * procs and s[:len(warm)] == warm        # warm-up first, every process
    for r in range(4):
        assert sorted((a, i) for rr, a, i in s if rr == r) == sorted((a, i) for a in arms for i in range(1, procs + 1))
    meas = [(a, i) for r, a, i in s if r >= 0]
    per_round = len(arms) * procs
    pos = {k: np.mean([j % per_round for j, x in enumerate(meas) if x == k]) for k in set(meas)}
    assert max(pos.values()) - min(pos.values()) < 1e-9          # every process at the same mean position
    assert ss.process_schedule(["A", "B"], [3, 4], 1, warmup=0) == [(0, "A", 3), (0, "B", 3), (0, "B", 4), (0, "A", 4)]


def test_waves():
    assert ss.waves(3, 3) == [[1, 2, 3]]
    assert ss.waves(3, 1) == [[1], [2], [3]]
    assert ss.waves(5, 2) == [[1, 2], [3, 4], [5]]
    with pytest.raises(ValueError):
        ss.waves(0, 1)


def _rec(arm, rnd, bs, step_ms, prefill_ms=20.0, tokens=None, proc=None, steps=None):
    """A record of the new driver when proc is given (GPU step times), else a 2026-11-23 one."""
    r = {"arm": arm, "round": rnd, "batch_size": bs, "prefill_s": prefill_ms / 1e3,
         "tokens": tokens if tokens is not None else [[1, 2, 3]] * bs}
    if proc is None:
        r["decode_s"] = [step_ms / 1e3] * 5 + [9.0]         # one outlier step: the median ignores it
    else:
        g = steps if steps is not None else [step_ms / 1e3] * 8
        r.update(proc=f"{arm}-p{proc}", proc_index=proc, skip_steps=2, gpu_step_s=[1.0, 1.0] + list(g),
                 decode_wall_s=sum(g) * 1.1, decode_steps=len(g) + 2)
    return r


def test_run_stats_gpu_iqm_skips_first_steps_and_host_fallbacks():
    # two dropped steps (1 s each), then steps alternating between two levels with one outlier
    r = _rec("A", 0, 1, 0, proc=1, steps=[0.010, 0.0102] * 4 + [0.5])
    st = ss.run_stats(r)
    assert st["decode_steps"] == 9
    assert st["gpu_ms"] == pytest.approx(10.1, abs=0.06)          # the IQM sits between the two levels
    assert st["decode_ms"] == pytest.approx(r["decode_wall_s"] / 11 * 1e3)
    old = ss.run_stats(_rec("A", 0, 1, 10.0))
    assert old["decode_ms"] == pytest.approx(10.0) and math.isnan(old["gpu_ms"])
    assert ss.iqm([1, 2, 3, 100]) == pytest.approx(2.5) and math.isnan(ss.iqm([]))


def test_legacy_records_use_paired_rounds_on_host_time():
    recs = [_rec("A", -1, 1, 50.0)]          # warm-up: ignored
    for r, (a, b) in enumerate([(10.0, 9.8), (11.0, 10.78), (10.5, 10.29)]):
        recs += [_rec("A", r, 1, a), _rec("B", r, 1, b)]
    c = ss.compare(recs, "A", "B", 1)
    assert c["primary"] == "decode_ms" and c["rounds"] == 3
    d = c["decode_ms"]
    assert d["method"] == "rounds" and d["n"] == 3
    assert d["delta"] == pytest.approx(-0.02)
    assert d["ci_width"] == pytest.approx(0.0, abs=1e-9)   # same ratio every round
    assert d["base"] == pytest.approx((10.0 * 11.0 * 10.5) ** (1 / 3))
    assert c["prefill_ms"]["delta"] == pytest.approx(0.0)


def _sim(rng, procs, rounds, effect=0.0, proc_sd=0.003, round_sd=0.001, bs=1, arms=("A", "B")):
    recs = []
    for arm in arms:
        for p in range(1, procs + 1):
            off = rng.normal(0, proc_sd)
            for r in range(rounds):
                v = 5.0 * math.exp(off + rng.normal(0, round_sd)) * (1 + (effect if arm == arms[-1] and arm != "A2" else 0))
                recs.append(_rec(arm, r, bs, v, proc=p))
    return recs


def test_process_random_effect_ci_covers_at_nominal_rate():
    """Persistent per-process offsets (sd 0.3%) over round noise (0.1%): the interval from per-process
    means covers a null effect at ~95%; the per-round paired interval of one process per arm does not."""
    rng = np.random.default_rng(7)
    hits = hits_old = 0
    for _ in range(300):
        d = ss.compare(_sim(rng, 3, 6), "A", "B", 1)["gpu_ms"]
        assert d["method"] == "procs" and d["procs"] == [3, 3] and d["n"] == 6
        hits += d["lo"] <= 0 <= d["hi"]
        d1 = ss.compare(_sim(rng, 1, 6), "A", "B", 1)["gpu_ms"]
        assert d1["method"] == "rounds"
        hits_old += d1["lo"] <= 0 <= d1["hi"]
    assert 0.91 <= hits / 300 <= 0.99
    assert hits_old / 300 < 0.6            # why one process per arm could not resolve anything


def test_process_ci_finds_a_real_effect_and_variance_components():
    rng = np.random.default_rng(1)
    d = ss.compare(_sim(rng, 3, 8, effect=-0.02, proc_sd=0.001, round_sd=0.0005), "A", "B", 1)["gpu_ms"]
    assert d["lo"] < -0.02 < d["hi"] and d["hi"] < 0
    assert d["half"] < 0.005
    assert 0.0003 < d["sd_between"] < 0.003 and 0.0002 < d["sd_within"] < 0.001
    assert d["sd_process"] <= d["sd_between"]
    assert set(d["per_proc"]) == {"A-p1", "A-p2", "A-p3", "B-p1", "B-p2", "B-p3"}


def test_variance_components_recover_the_simulated_ones():
    d = ss.compare(_sim(np.random.default_rng(3), 30, 8, proc_sd=0.003, round_sd=0.001), "A", "B", 1)["gpu_ms"]
    assert d["sd_within"] == pytest.approx(0.001, rel=0.15)
    assert d["sd_process"] == pytest.approx(0.003, rel=0.3)


def test_parity_same_round_same_process_index_and_self():
    recs = [_rec("A", 0, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]], proc=1),
            _rec("B", 0, 2, 10, tokens=[[1, 2, 3], [4, 9, 6]], proc=1),
            _rec("A", 0, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]], proc=2),
            _rec("B", 0, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]], proc=2)]
    assert ss.parity(recs, "A", "B", 2) == {"compared": 4, "identical": 3, "first_divergence": [1]}
    assert ss.self_parity(recs, "A", 2) == {"compared": 2, "identical": 2, "first_divergence": []}
    old = [_rec("A", 0, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]]), _rec("B", 0, 2, 10, tokens=[[1, 2, 3], [4, 9, 6]]),
           _rec("A", 1, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]]), _rec("B", 1, 2, 10, tokens=[[1, 2, 3], [4, 5, 6]])]
    assert ss.parity(old, "A", "B", 2) == {"compared": 4, "identical": 3, "first_divergence": [1]}


def test_noise_floor_and_verdicts():
    rng = np.random.default_rng(5)
    base = _sim(rng, 3, 6, proc_sd=0.002, arms=("A", "A2"))
    small = [dict(r, arm="B", proc=r["proc"].replace("A2", "B")) for r in base if r["arm"] == "A2"]
    for r in small:                                        # B = A2 made 0.1% faster: inside the A/A floor
        r["gpu_step_s"] = [x * 0.999 for x in r["gpu_step_s"]]
    big = [dict(r, arm="B", proc=r["proc"].replace("A2", "B")) for r in base if r["arm"] == "A2"]
    for r in big:                                          # 5% faster: resolved
        r["gpu_step_s"] = [x * 0.95 for x in r["gpu_step_s"]]
    s = ss.summarize([r for r in base] + big, [("A", "A2"), ("A", "B")])
    aa, ab = s["comparisons"]
    assert aa["aa"] and not ab["aa"] and aa["verdict"] in ("A/A", "A/A offset (CI excludes 0)")
    assert ab["floor"]["source"] == "A/A in this run"
    assert ab["floor"]["floor"] == pytest.approx(aa["gpu_ms"]["half"]) or ab["floor"]["aa_biased"]
    assert ab["verdict"] == "resolved: faster"
    # a Δ whose CI excludes 0 but is smaller than the A/A floor: not resolved
    c = {"primary": "gpu_ms", "aa": False, "gpu_ms": {"delta": -0.003, "lo": -0.004, "hi": -0.002, "half": 0.001},
         "floor": {"floor": 0.005}}
    assert ss.verdict(c) == "not resolved"
    c["floor"] = None
    assert ss.verdict(c) == "resolved: faster"
    c["gpu_ms"].update(lo=-0.006, hi=0.001)
    assert ss.verdict(c) == "not resolved"
    # one process per arm, no A/A floor: the process effect is not in the interval, so not "resolved"
    c["gpu_ms"].update(lo=-0.004, hi=-0.002, method="rounds")
    assert ss.verdict(c) == "within one process pair: faster"
    c["floor"] = {"floor": 0.001}
    assert ss.verdict(c) == "resolved: faster"
    # an A/A whose CI excludes 0: the floor is its far edge
    off = {"primary": "gpu_ms", "base": "A", "other": "A2", "batch_size": 1, "aa": True,
           "gpu_ms": {"delta": 0.01, "lo": 0.004, "hi": 0.016, "half": 0.006}}
    f = ss.floors_from_summary({"comparisons": [off]}, "A/A run x")
    assert f[1]["floor"] == pytest.approx(0.016) and f[1]["aa_biased"] and f[1]["source"] == "A/A run x"
    # floors from an earlier A/A run apply where this run has none
    s2 = ss.summarize(small + [r for r in base if r["arm"] == "A"], [("A", "B")],
                      floors={1: {"floor": 0.5, "source": "A/A run y"}})
    assert s2["comparisons"][0]["floor"]["source"] == "A/A run y" and s2["comparisons"][0]["verdict"] == "not resolved"


def test_summary_report_prediction_and_short_table():
    rng = np.random.default_rng(2)
    recs = _sim(rng, 2, 4, effect=-0.02, proc_sd=0.0005, round_sd=0.0005, bs=8)
    s = ss.summarize(recs, [("A", "B")], {("B", 8): {"saved_us": 150.0, "in_context_saved_us": 100.0}})
    c = s["comparisons"][0]
    assert s["primary"] == "gpu_ms" and c["floor"] is None
    assert c["predicted"]["delta"] == pytest.approx(-150.0 / (c["gpu_ms"]["base"] * 1e3))
    assert c["predicted"]["in_context_delta"] == pytest.approx(-100.0 / (c["gpu_ms"]["base"] * 1e3))
    md = ss.report_markdown(s, {"GPU": "FakeGPU"})
    assert "| A → B | 8 | 2+2 × 4 |" in md and "(own CI; no A/A)" in md and "resolved: faster" in md
    assert "random effect" in md and "GPU decode step" in md and "| process effect |" in md
    assert "64/64" in md                 # 2 process pairs x 4 rounds x 8 requests
    t = ss.short_table([("llama aa", s)])
    assert "A→B" in t and "resolved: faster" in t and t.count("\n") == 1
    assert "¹ Δ prefill" not in md  # 2 processes per arm: prefill's interval carries the process effect
    one = ss.summarize(_sim(np.random.default_rng(3), 1, 4, effect=-0.02, bs=8), [("A", "B")])
    md1 = ss.report_markdown(one)
    assert one["comparisons"][0]["prefill_ms"]["method"] == "rounds"
    assert ")¹ |" in md1 and "¹ Δ prefill with one process per arm is not a measure of the patch" in md1


# ----------------------------------------------------------------------------- driver pieces

def test_arms_sizes_kv_and_server_args():
    assert arms_for("all", False, False) == {"A": "none", "B": "all"}
    assert arms_for("silu_and_mul,fused_add_rmsnorm", False, True)["B"] == ["silu_and_mul", "fused_add_rmsnorm"]
    assert arms_for("none", True, False) == {"A": "none", "A2": "none"}
    # a patched base: B's Δ is what its ops add on top (a fused op against the two it replaces)
    assert arms_for("moe_router,moe_align,moe_route_align", False, False, "moe_router,moe_align") == \
        {"A": ["moe_router", "moe_align"], "B": ["moe_router", "moe_align", "moe_route_align"]}
    assert arms_for("all", False, True, "silu_and_mul")["A2"] == ["silu_and_mul"]
    with pytest.raises(AstraError, match="same"):
        arms_for("silu_and_mul,rmsnorm", False, False, "rmsnorm,silu_and_mul")
    # 'all,OP' with OP on by default is 'all' (a step A/B of moe_experts once it was in 'all' compared all with all)
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.config import default_ops

    on = default_ops(patchable_ops())
    assert "moe_experts" in on
    with pytest.raises(AstraError, match="same"):
        arms_for("all,moe_experts", False, False, "all")
    assert arms_for("all", False, False, "all,-moe_experts") == {"A": ["all", "-moe_experts"], "B": "all"}
    with pytest.raises(AstraError, match="--aa"):
        arms_for("none", False, False)
    # --arm-env: the same ops, a switch in one arm's environment (A2 takes A's)
    env = parse_arm_env(["B:ASTRA_GPAN_ACROSS_LAYERS=1", "A:X=a=b", "A:Y="])
    assert env == {"B": {"ASTRA_GPAN_ACROSS_LAYERS": "1"}, "A": {"X": "a=b", "Y": ""}}
    assert env_of_arm(env, "A2") == {"X": "a=b", "Y": ""} and env_of_arm(None, "B") == {}
    assert arms_for("all", False, True, "all", env) == {"A": "all", "A2": "all", "B": "all"}
    with pytest.raises(AstraError, match="same"):  # environments that do not differ
        arms_for("all", False, False, "all", {"A": {"K": "1"}, "B": {"K": "1"}})
    with pytest.raises(AstraError, match="--ops none"):
        arms_for("none", False, False, "none", env)
    # a candidate (arm B's alone) makes the same ops two arms
    assert arms_for("all", False, False, "all", None, True) == {"A": "all", "B": "all"}
    for bad in ("C:K=1", "B:K", "K=1", "B:=1"):
        with pytest.raises(AstraError, match="--arm-env"):
            parse_arm_env([bad])
    assert arms_from_meta("A: ops none, A2: ops none, B: ops silu_and_mul,fused_add_rmsnorm") == {
        "A": "none", "A2": "none", "B": ["silu_and_mul", "fused_add_rmsnorm"]}
    # a --base-ops with an op taken out (session 19's step read it as "all")
    assert arms_from_meta("A: ops all,-moe_align, B: ops all") == {"A": ["all", "-moe_align"], "B": "all"}
    assert parse_sizes("1, 8,32", "--batch-size") == [1, 8, 32]
    for bad in ("", "0", "1,a", "-4"):
        with pytest.raises(AstraError, match="--batch-size"):
            parse_sizes(bad, "--batch-size")
    kv = kv_tokens_needed([1, 64], 256, 32, 10)
    assert kv % 1024 == 0 and kv >= 64 * (256 + 32)
    a = worker_server_args(64, [64, 1, 8], kv, 0.9, 30000, False, ["--tp=1"])
    assert a[a.index("--cuda-graph-bs-decode") + 1:a.index("--cuda-graph-bs-decode") + 4] == ["1", "8", "64"]
    assert "--disable-prefill-cuda-graph" in a and a[-1] == "--tp=1"
    assert "--disable-prefill-cuda-graph" not in worker_server_args(64, [1], kv, 0.9, 1, True, [])


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


def test_step_ab_of_a_switch_in_one_arm_s_environment(tmp_path):
    """--arm-env: both arms patch the same ops, only B's workers get the variable (the stand-in saves
    $FAKE_EXTRA_SAVED_US per step where it is set); the Δ is the switch's, and the report names the environment."""
    r = _step(tmp_path, "--base-ops", "fused_add_rmsnorm", "--ops", "fused_add_rmsnorm", "--procs", "2",
              "--no-profile", "--arm-env", "B:FAKE_EXTRA_SAVED_US=300")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    for x in json.loads((out / "summary.json").read_text())["comparisons"]:
        g = x["gpu_ms"]
        assert g["lo"] <= -300.0 / (g["base"] * 1e3) <= g["hi"] and g["hi"] < 0
    assert "- arm environment: B: FAKE_EXTRA_SAVED_US=300" in (out / "report.md").read_text()
    bad = _step(tmp_path, "--ops", "fused_add_rmsnorm", "--arm-env", "B:FAKE_EXTRA_SAVED_US")
    assert bad.returncode != 0 and "error: --arm-env" in bad.stderr and "Traceback" not in bad.stderr


def test_step_ab_end_to_end(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"op": "fused_add_rmsnorm", "date": "2099-01-01", "rows": [  # newest wins
        {"shape": "1x4096", "dtype": "bf16", "speedup": 2.0}, {"shape": "8x4096", "dtype": "bf16", "speedup": 2.0}]}))
    log = tmp_path / "cmds.log"
    stale = tmp_path / "out" / "counters-B" / "1.cnt"  # a process of an earlier run into the same --out
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    r = _step(tmp_path, "--ops", "fused_add_rmsnorm", "--procs", "2",
              env={"ASTRA_SGLANG_RESULTS": str(bench.parent), "FAKE_CMD_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert not stale.exists()  # its counters would have been summed into this run's
    s = json.loads((out / "summary.json").read_text())
    c = {x["batch_size"]: x for x in s["comparisons"]}
    assert set(c) == {1, 8} and c[1]["rounds"] == 3 and s["primary"] == "gpu_ms"
    # the stand-in's patched arm saves FAKE_SAVED_US per step; measured and both predictions agree
    from step_fake_worker import FAKE_SAVED_US  # noqa: E402

    for bs, x in c.items():
        g = x["gpu_ms"]
        assert g["method"] == "procs" and g["procs"] == [2, 2]
        expect = -FAKE_SAVED_US / (g["base"] * 1e3)
        assert g["lo"] <= expect <= g["hi"]
        assert x["predicted"]["delta"] == pytest.approx(expect, rel=0.05)
        assert x["predicted"]["in_context_delta"] == pytest.approx(expect, rel=0.05)
        # the norm's span to its GEMM: the stand-in's A norm starts 1 µs early (PDL) and waits; that wait is the
        # kernel before it running, not the norm's, so the span saves the 25 µs a call the step saves
        assert x["predicted"]["consumer_delta"] == pytest.approx(expect, rel=0.01)
        assert x["parity"]["identical"] == x["parity"]["compared"] == 2 * 3 * bs
        assert x["floor"] is None and x["verdict"] in ("resolved: faster", "not resolved")
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sum(1 for x in runs if x["round"] == -1) == 8            # one warm-up per process and batch size
    assert {x["proc"] for x in runs} == {"A-p1", "A-p2", "B-p1", "B-p2"}
    # the order over processes: A1 B1 B2 A2, reversed next round; every timed run before any profile
    cmds = [ln.split() for ln in log.read_text().splitlines() if not ln.endswith("quit")]
    order = [n for n, cmd in cmds if cmd == "run"][::2]            # one entry per (process, round): 2 batch sizes
    assert order[:8] == ["A-p1", "B-p1", "B-p2", "A-p2", "A-p1", "B-p1", "B-p2", "A-p2"]     # warm-up, round 0
    assert order[8:12] == ["A-p2", "B-p2", "B-p1", "A-p1"]                                   # round 1
    first_profile = next(i for i, (n, cmd) in enumerate(cmds) if cmd == "profile")
    assert all(cmd == "profile" for _, cmd in cmds[first_profile:])
    assert {n for n, cmd in cmds if cmd == "profile"} == {"A-p1", "B-p1"}
    md = (out / "report.md").read_text()
    assert md.count("| A → B |") == 4 and "random effect" in md      # 2 in the Δ table, 2 in the spread table
    assert "attention backend" in md   # the backend the workers ran (auto: triton where sgl_kernel has no FA3)
    assert (out / "step.png").is_file() and (out / "profile" / "profile.md").is_file()
    assert (out / "profile" / "shapes.json").is_file()
    assert (out / "worker-B-p2.log").is_file()
    # re-analysis from results.json alone
    r2 = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "e2e", "--step", "--analyze",
                         str(out / "results.json"), "--out", str(tmp_path / "re")], capture_output=True, text=True,
                        cwd="/", env={**os.environ, "ASTRA_SGLANG_RESULTS": str(bench.parent)})
    assert r2.returncode == 0, r2.stderr
    s2 = json.loads((tmp_path / "re" / "summary.json").read_text())
    assert s2["comparisons"][0]["gpu_ms"] == s["comparisons"][0]["gpu_ms"]
    # the re-analysed report ends with the neighbours tables, as the run's own does
    md2 = (tmp_path / "re" / "report.md").read_text()
    assert "### The kernel after each covered op" in md and "### The kernel after each covered op" in md2
    # as results/ keeps a record: results.json.xz, read as it is; a JSON that is not a step A/B's is refused
    import lzma
    kept = tmp_path / "kept"
    kept.mkdir()
    with lzma.open(kept / "results.json.xz", "wt") as f:
        f.write((out / "results.json").read_text())
    (kept / "other.json").write_text('{"x": 1}')
    for src, ok in ((kept / "results.json.xz", True), (kept / "other.json", False)):
        r = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "e2e", "--step", "--analyze", str(src), "--out",
                            str(tmp_path / "re-xz")], capture_output=True, text=True, cwd="/")
        assert (r.returncode == 0) == ok, r.stderr
        assert ok or "error: " in r.stderr and "not the results.json of a decode-step A/B" in r.stderr
    assert json.loads((tmp_path / "re-xz" / "summary.json").read_text())["comparisons"][0]["gpu_ms"] == \
        s["comparisons"][0]["gpu_ms"]
    # a run cut off while profiling (step_session.sh then rebuilds its report into the run's own dir): the meta
    # lists the captures made so far, and the re-analysis writes their profile report
    pdir = out / "profile"
    meta = json.loads((pdir / "profile-meta.json").read_text())
    meta["captures"] = meta["captures"][:1]
    (pdir / "profile-meta.json").write_text(json.dumps(meta))
    for f in ("profile.json", "profile.md"):
        (pdir / f).unlink()
    r3 = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "e2e", "--step", "--analyze",
                         str(out / "results.json"), "--out", str(out)], capture_output=True, text=True,
                        cwd="/", env={**os.environ, "ASTRA_SGLANG_RESULTS": str(bench.parent)})
    assert r3.returncode == 0, r3.stderr
    assert len(json.loads((pdir / "profile.json").read_text())["captures"]) == 1 and (pdir / "profile.md").is_file()


def test_profile_arms_keeps_the_captures_made_before_a_cut_off(tmp_path):
    """The meta is rewritten (whole) after every capture: a deadline that ends the run mid-profile leaves the
    captures already made analyzable."""
    import types

    from astra_sglang.e2e.step import profile_arms

    class Worker:
        calls = 0

        def call(self, cmd, timeout):
            Worker.calls += 1
            if Worker.calls == 2:
                raise RuntimeError("aborted")
            return {"captures": [{"arm": "A", "batch_size": cmd["batch_size"], "trace": "A.json"}], "seconds": 0.1}

    session = types.SimpleNamespace(arm_of={"A-p1": "A"}, workers={"A-p1": Worker()})
    with pytest.raises(RuntimeError):
        profile_arms(session, ["A-p1"], [1, 8], 256, 3, tmp_path / "p", {}, {"model": "m"}, 10)
    meta = json.loads((tmp_path / "p" / "profile-meta.json").read_text())
    assert [c["batch_size"] for c in meta["captures"]] == [1] and meta["model"] == "m"
    assert not list((tmp_path / "p").glob("*.tmp"))   # written whole, then renamed


def test_step_aa_then_ab_with_its_floor_in_waves(tmp_path):
    aa_dir = tmp_path / "aa"
    r = _step(tmp_path, "--aa", "--no-profile", "--procs", "3", "--rounds", "4", "--out", str(aa_dir))
    assert r.returncode == 0, r.stderr
    s = json.loads((aa_dir / "summary.json").read_text())
    assert {(x["base"], x["other"]) for x in s["comparisons"]} == {("A", "A2")}
    for x in s["comparisons"]:
        assert x["aa"] and "predicted" not in x and x["gpu_ms"]["procs"] == [3, 3]
        assert x["floor"]["source"] == "A/A in this run" and x["verdict"].startswith("A/A")
        assert x["gpu_ms"]["half"] < 0.01          # stand-in: 0.1% process sd
    assert "A/A" in (aa_dir / "report.md").read_text()
    # A/B in waves of one process per arm, the A/A run's half-widths as the floor
    log = tmp_path / "cmds.log"
    r = _step(tmp_path, "--ops", "all", "--no-profile", "--procs", "2", "--procs-at-once", "1",
              "--aa-floor", str(aa_dir), env={"FAKE_CMD_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    s2 = json.loads((tmp_path / "out" / "summary.json").read_text())
    for x in s2["comparisons"]:
        aa = next(y for y in s["comparisons"] if y["batch_size"] == x["batch_size"])
        assert x["floor"]["source"] == "A/A run aa"
        assert x["floor"]["floor"] == pytest.approx(ss.aa_floor(aa)["floor"])
        assert x["gpu_ms"]["procs"] == [2, 2]
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert sorted({(x["proc"], x["wave"]) for x in runs}) == [("A-p1", 0), ("A-p2", 1), ("B-p1", 0), ("B-p2", 1)]
    assert sorted({x["round"] for x in runs if x["wave"] == 1}) == [-1, 3, 4, 5]
    names = [ln.split()[0] for ln in log.read_text().splitlines()]
    assert names.index("A-p2") > max(i for i, n in enumerate(names) if n == "A-p1")       # wave 1 after wave 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "(A/A run aa)" in md
    # results/ keeps the A/A's summary as summary.json.xz: its folder still names the floor
    import lzma
    with lzma.open(aa_dir / "summary.json.xz", "wt") as f:
        f.write((aa_dir / "summary.json").read_text())
    (aa_dir / "summary.json").unlink()
    r = _step(tmp_path, "--ops", "all", "--no-profile", "--procs", "1", "--aa-floor", str(aa_dir))
    assert r.returncode == 0, r.stderr
    assert "(A/A run aa)" in (tmp_path / "out" / "report.md").read_text()
    r = _step(tmp_path, "--ops", "all", "--aa-floor", str(tmp_path / "out" / "model"))
    assert r.returncode != 0 and "no summary.json" in r.stderr


def test_step_divergence(tmp_path):
    r = _step(tmp_path, "--ops", "all", "--no-profile", "--procs", "1", env={"FAKE_DIVERGE": "1"})
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    p = s["comparisons"][0]["parity"]
    assert p["identical"] == p["compared"] - 3 and p["first_divergence"] == [3, 3, 3]
    assert s["comparisons"][0]["gpu_ms"]["method"] == "rounds"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "first divergence at token 3" in md and "NOT in that interval" in md


def test_step_calibrate_runs_three_arms(tmp_path):
    r = _step(tmp_path, "--calibrate", "--ops", "all", "--no-profile")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(x["base"], x["other"]) for x in s["comparisons"]] == [("A", "A2"), ("A", "A2"), ("A", "B"), ("A", "B")]
    assert all(x["floor"]["source"] == "A/A in this run" for x in s["comparisons"])


@pytest.mark.parametrize("args,env,msg", [
    (["--ops", "none"], None, "--aa"),
    (["--batch-size", "0"], None, "--batch-size"),
    (["--output-len", "1"], None, "--output-len"),
    (["--load-format", "auto"], None, "dummy"),
    (["--ops", "all"], {"FAKE_FAIL_START": "B-p1"}, "worker B-p1 failed to start: RuntimeError: no GPU"),
    (["--procs", "0"], None, "--procs"),
    (["--skip-steps", "7"], None, "--skip-steps"),
    (["--aa-floor", "/"], None, "no summary.json"),
    (["--ops", "all", "--base-ops", "all"], None, "--base-ops equals --ops"),
    (["--ops", "silu_and_mul", "--base-ops", "bogus"], None, "unknown op(s) bogus"),
    (["--ops", "bogus"], None, "unknown op(s) bogus"),
])
def test_step_bad_input_is_one_error_line(tmp_path, args, env, msg):
    r = _step(tmp_path, *args, env=env)
    assert r.returncode != 0
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert err and msg in r.stderr, r.stderr


def test_step_candidate_reaches_the_patched_arms_only(tmp_path):
    cand = tmp_path / "pdl1.cu"
    cand.write_text("// a candidate\n")
    log = tmp_path / "specs.jsonl"
    r = _step(tmp_path, "--ops", "fused_add_rmsnorm", "--procs", "1", "--no-profile", "--candidate",
              f"fused_add_rmsnorm={cand}", env={"FAKE_SPEC_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    specs = {s["name"]: s for s in map(json.loads, log.read_text().splitlines())}
    assert specs["B-p1"]["candidates"] == {"fused_add_rmsnorm": str(cand.resolve())}
    assert specs["A-p1"]["candidates"] == {}
    assert "fused_add_rmsnorm=" in (tmp_path / "out" / "report.md").read_text()


def test_step_candidate_against_the_shipped_kernel_in_a_patched_arm_a(tmp_path):
    # --base-ops equal to --ops: arm A serves the shipped kernel, arm B the candidate (the Δ is the candidate's)
    cand = tmp_path / "long_rows.cu"
    cand.write_text("// a candidate\n")
    log = tmp_path / "specs.jsonl"
    r = _step(tmp_path, "--ops", "fused_add_rmsnorm", "--base-ops", "fused_add_rmsnorm", "--procs", "1",
              "--no-profile", "--candidate", f"fused_add_rmsnorm={cand}", env={"FAKE_SPEC_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    specs = {s["name"]: s for s in map(json.loads, log.read_text().splitlines())}
    assert specs["A-p1"]["ops"] == specs["B-p1"]["ops"]
    assert specs["A-p1"]["candidates"] == {}
    assert specs["B-p1"]["candidates"] == {"fused_add_rmsnorm": str(cand.resolve())}


@pytest.mark.parametrize("item,msg", [("nope=x.cu", "unknown op"), ("fused_add_rmsnorm=/no/such.cu", "no such file"),
                                      ("silu_and_mul={cand}", "which --ops fused_add_rmsnorm does not patch")])
def test_step_candidate_errors(tmp_path, item, msg):
    cand = tmp_path / "c.cu"
    cand.write_text("//\n")
    r = _step(tmp_path, "--ops", "fused_add_rmsnorm", "--candidate", item.format(cand=cand))
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("error:") and msg in r.stderr
    assert not (tmp_path / "out").exists()


def test_step_with_a_patched_base_runs_it_in_arm_a_and_predicts_nothing(tmp_path):
    r = _step(tmp_path, "--ops", "silu_and_mul,fused_add_rmsnorm", "--base-ops", "fused_add_rmsnorm", "--no-profile")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["meta"]["arms"] == "A: ops fused_add_rmsnorm, B: ops silu_and_mul,fused_add_rmsnorm"
    assert all(not x.get("predicted") for x in s["comparisons"])


def test_publish_runtime_follows_each_version_s_one_batch():
    """0.5.23's one_batch publishes the rank's runtime context (load_model reads the device from it) and runs its
    process-global config initializers in one call; 0.5.17's has no context and only the per-config initializers."""
    import types

    from astra_sglang.e2e.step_worker import publish_runtime

    calls = []
    new = types.SimpleNamespace(
        SpawnRanks=lambda **k: ("ranks", k), spawn_world_rank=lambda sa, tp_rank, pp_rank: 10 + tp_rank,
        publish=lambda sa, role, ranks: calls.append(("publish", role, ranks)),
        _init_process_global_configs=lambda: calls.append(("globals",)),
        initialize_moe_config=lambda sa: calls.append(("moe",)))
    publish_runtime(new, "args", 1)
    assert calls == [("publish", "scheduler", ("ranks", {"world_rank": 11, "gpu_id": 1})), ("globals",)]
    calls.clear()
    old = types.SimpleNamespace(**{n: (lambda sa, n=n: calls.append((n, sa))) for n in (
        "initialize_moe_config", "initialize_fp8_gemm_config", "initialize_fp4_gemm_config")})
    publish_runtime(old, "args", 0)
    assert calls == [("initialize_moe_config", "args"), ("initialize_fp8_gemm_config", "args"),
                     ("initialize_fp4_gemm_config", "args")]


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_one_batch_s_runtime_steps_in_each_version(which, request):
    """What publish_runtime and the worker rely on, in each version's one_batch module: 0.5.23 imports publish,
    SpawnRanks and spawn_world_rank, defines _init_process_global_configs, its load_model reads get_device(), and its
    ServerArgs has resolve_once; 0.5.17 has none of these. Both accept the per-phase graph flags e2e passes."""
    from sglang_source import _sglang_root

    root = _sglang_root(which, request)
    path = root / "benchmark/one_batch.py"
    src = path.read_text() if path.exists() else (root / "bench_one_batch.py").read_text()
    args = (root / "srt/server_args.py").read_text()
    steps = ("publish(", "SpawnRanks", "spawn_world_rank", "def _init_process_global_configs", "get_device()")
    if which == "0.5.23":
        assert all(s in src for s in steps), [s for s in steps if s not in src]
        assert "def resolve_once(" in args
        fields = (root / "srt/arg_groups/fields/exec_.py").read_text()
    else:
        assert not any(s in src for s in steps[:4])
        assert "def resolve_once(" not in args
        fields = args
    for f in ("cuda_graph_max_bs_decode:", "cuda_graph_bs_decode:", "disable_prefill_cuda_graph:"):
        assert f in fields, f
