"""CPU tests of the e2e driver: schedule, statistics, parity, report, the streaming client and the
whole `astra-sglang e2e` orchestration against a stand-in server (tests/e2e_fake_server.py)."""
from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from astra_sglang.e2e import stats as st
from astra_sglang.e2e.client import (Workload, generate_stream, make_prompts, parse_workload, run_workload,
                                     wait_ready)

HERE = Path(__file__).resolve().parent
FAKE = HERE / "e2e_fake_server.py"


# ----------------------------------------------------------------------------- schedule

def test_schedule_is_abba_balanced():
    s = st.ab_schedule(4)
    assert s[:2] == [(-1, "A"), (-1, "B")]
    measured = [x for x in s if x[0] >= 0]
    assert [a for _, a in measured] == list("ABBAABBA")
    # each arm once per round, and the same mean position in time
    for r in range(4):
        assert sorted(a for rr, a in measured if rr == r) == ["A", "B"]
    pos = {arm: np.mean([i for i, (_, a) in enumerate(measured) if a == arm]) for arm in "AB"}
    assert pos["A"] == pos["B"]
    assert st.ab_schedule(1, warmup=0) == [(0, "A"), (0, "B")]
    with pytest.raises(ValueError):
        st.ab_schedule(0)


# ----------------------------------------------------------------------------- statistics

@pytest.mark.parametrize("df,q975", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423),
                                      (1000, 1.9623)])
def test_t_ppf_matches_tables(df, q975):
    assert st.t_ppf(0.975, df) == pytest.approx(q975, abs=2e-4)
    assert st.t_ppf(0.025, df) == pytest.approx(-q975, abs=2e-4)
    assert st.t_cdf(st.t_ppf(0.9, df), df) == pytest.approx(0.9, abs=1e-9)


def test_t_interval_covers_mean_at_nominal_rate():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        x = rng.normal(5.0, 2.0, size=5)
        m, lo, hi = st.t_interval(x)
        hits += lo <= 5.0 <= hi
    assert 0.92 <= hits / 400 <= 0.98
    m, lo, hi = st.t_interval([3.0])
    assert m == 3.0 and math.isnan(lo) and math.isnan(hi)


def test_bootstrap_ratio_ci_resamples_rounds_not_requests():
    """The interval resamples whole paired rounds. A steady -10% in every round is resolved; rounds whose host state
    drifts (both arms' requests agree within a round, the rounds differ by +-20%) give an interval around 0 however
    many requests they hold, which resampling single requests did not (H200 2026-11-27: +-1% intervals around
    differences the next server start reversed)."""
    rng = np.random.default_rng(0)
    a = [rng.normal(100, 5, 100) for _ in range(4)]
    b = [rng.normal(90, 5, 100) for _ in range(4)]
    p, lo, hi = st.bootstrap_ratio_ci(a, b, np.median, n_boot=1000)
    assert lo < p < hi and hi < 0 and lo > -0.15
    drift = [1.0, 1.2, 0.85, 1.1]      # each round's host speed, the same for both arms' requests of that round
    sign = [1, -1, 1, -1]              # which arm happened to run in the faster state
    a = [rng.normal(100 * d, 1, 400) for d in drift]
    b = [rng.normal(100 * d * (1 + 0.1 * s), 1, 400) for d, s in zip(drift, sign)]
    p2, lo2, hi2 = st.bootstrap_ratio_ci(a, b, np.mean, n_boot=1000)
    assert lo2 < 0 < hi2 and hi2 - lo2 > 0.05
    pooled = st.bootstrap_ratio_ci([np.concatenate(a)] * 2, [np.concatenate(b)] * 2, np.mean, n_boot=200)
    assert pooled[1] == pooled[2] == pytest.approx(p2)   # nothing to resample inside a round
    one = st.bootstrap_ratio_ci(a[:1], b[:1], np.mean)
    assert math.isnan(one[1]) and math.isnan(one[2])


def _req(pid, t0, ttft, itl, n, ids=None, chunk=1):
    times, counts = [], []
    t = t0 + ttft
    k = 0
    while k < n:
        k = min(n, k + chunk)
        times.append(t)
        counts.append(k)
        t += itl * chunk
    return st.RequestResult(pid, t0, times[0], times[-1] + 0.001, times, counts,
                            ids if ids is not None else list(range(n)), prompt_len=10)


def test_request_metrics_with_multi_token_chunks():
    r = _req(0, 10.0, 0.05, 0.01, 8, chunk=2)   # chunks of 2 tokens every 20 ms: [2, 4, 6, 8]
    assert r.ttft == pytest.approx(0.05)
    assert r.tpot == pytest.approx(0.06 / 7)      # (last chunk - first chunk) / (n - 1), as SGLang's bench
    # tokens after the first chunk, each charged its chunk's gap / tokens in it
    assert len(r.itls()) == 6 and all(x == pytest.approx(0.01) for x in r.itls())
    single = _req(1, 0.0, 0.02, 0.01, 1)
    assert single.tpot is None and single.itls() == []
    bad = st.RequestResult(2, 0.0, None, 1.0, [], [], [], error="boom")
    assert not bad.ok


def test_run_metrics_and_throughput():
    rs = [_req(i, 0.0, 0.1, 0.01, 11) for i in range(4)]
    m = st.run_metrics(st.Run("w", "A", 0, rs))
    span = rs[0].t_end - 0.0
    assert m["output_throughput"] == pytest.approx(44 / span)
    assert m["ttft_mean"] == pytest.approx(100.0)
    assert m["tpot_mean"] == pytest.approx(10.0)
    assert m["itl_median"] == pytest.approx(10.0)
    assert m["n_ok"] == 4 and m["n_failed"] == 0


def test_itl_p10_moves_with_a_per_step_cost_not_with_stalls():
    """A cost every decode step pays moves the fastest steps (ITL p10); a stall on a few steps (a prefill between
    them) moves p99 and not p10. The DeepSeek-shaped server's +0.45 ms a step showed as the first (2026-11-27)."""
    def run(arm, step_s, stall_every=0):
        rs = []
        for i in range(8):
            r = _req(i, 0.0, 0.02, step_s, 64)
            if stall_every:  # every stall_every-th gap 10 ms longer: later chunks shift
                r.chunk_times = [t + 0.01 * (k // stall_every) for k, t in enumerate(r.chunk_times)]
            rs.append(r)
        return st.Run("c8", arm, 0, rs)

    base = st.run_metrics(run("A", 0.0015))
    slower = st.run_metrics(run("B", 0.0019))
    stalled = st.run_metrics(run("B", 0.0015, stall_every=32))
    assert base["itl_p10"] == pytest.approx(1.5) and slower["itl_p10"] == pytest.approx(1.9)
    assert stalled["itl_p10"] == pytest.approx(1.5) and stalled["itl_p99"] > 10
    c = st.compare_arms([run("A", 0.0015), run("B", 0.0019)], "c8", n_boot=200)
    assert c["itl_p10"].boot_point == pytest.approx(0.0019 / 0.0015 - 1)
    assert "| ITL p10 (ms) |" in st.report_markdown(st.summarize([run("A", 0.0015), run("B", 0.0019)]))


def _runs(speedup=0.9, noise=0.01, rounds=5, seed=0, diverge_at=None):
    rng = np.random.default_rng(seed)
    runs = []
    for rnd, arm in st.ab_schedule(rounds):
        f = speedup if arm == "B" else 1.0
        rs = []
        for i in range(16):
            ids = [i * 100 + k for k in range(32)]
            if arm == "B" and diverge_at is not None and i % 2 == 0:
                ids = ids[:diverge_at] + [0] * (32 - diverge_at)
            rs.append(_req(i, i * 0.001, 0.05 * f * (1 + noise * rng.standard_normal()),
                           0.01 * f * (1 + noise * rng.standard_normal()), 32, ids))
        runs.append(st.Run("decode", arm, rnd, rs))
    return runs


def test_compare_arms_detects_a_real_change_and_not_noise():
    c = st.compare_arms(_runs(0.9), "decode", n_boot=500)
    assert c["tpot_mean"].rel_change == pytest.approx(-0.1, abs=0.01)
    assert c["tpot_mean"].rel_hi < 0 and c["tpot_mean"].better is True
    assert c["output_throughput"].rel_change > 0.05 and c["output_throughput"].better is True
    assert c["tpot_median"].boot_hi < 0
    assert c["tpot_mean"].n_rounds == 5  # the warm-up round is not counted
    null = st.compare_arms(_runs(1.0, noise=0.05, seed=3), "decode", n_boot=500)
    assert null["tpot_mean"].better is None
    assert null["tpot_mean"].rel_lo < 0 < null["tpot_mean"].rel_hi


# ----------------------------------------------------------------------------- parity

def test_first_divergence():
    assert st.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert st.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert st.first_divergence([1, 2], [1, 2, 3]) == 2
    assert st.first_divergence([], []) is None


def test_parity_counts_and_noise_floor():
    p = st.workload_parity(_runs(diverge_at=7), "decode")
    ab = p["A vs B"]
    assert ab.n_compared == 5 * 16 and ab.n_identical == 5 * 8
    assert set(ab.divergence) == {7}
    assert p["A vs A"].n_identical == p["A vs A"].n_compared == 4 * 16
    assert "40/80 identical" in ab.summary() and "median 7" in ab.summary()
    same = st.workload_parity(_runs(), "decode")["A vs B"]
    assert same.identical_frac == 1.0 and same.divergence == []


# ----------------------------------------------------------------------------- report

def test_summary_report_plot_roundtrip(tmp_path):
    runs = _runs(0.9, diverge_at=3)
    data = json.loads(json.dumps({"runs": [r.to_dict() for r in runs]}))
    back = [st.Run.from_dict(d) for d in data["runs"]]
    s = st.summarize(back, n_boot=300)
    md = st.report_markdown(s, {"GPU": "test"})
    assert "### decode" in md and "TPOT mean (ms)" in md and "B better" in md
    assert "A vs B (same round): 40/80 identical" in md
    assert "| GPU | test |" in md
    png = st.plot(s, str(tmp_path / "ab.png"))
    if png:  # matplotlib installed
        assert (tmp_path / "ab.png").stat().st_size > 1000


# ----------------------------------------------------------------------------- client

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_fake(port, ops="none", **env):
    e = dict(os.environ, **{k: str(v) for k, v in env.items()})
    return subprocess.Popen([sys.executable, str(FAKE), "--ops", ops, "--port", str(port)], env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("incremental", [0, 1])
def test_client_streams_tokens_and_times(incremental):
    port = _free_port()
    p = _start_fake(port, FAKE_INCREMENTAL=incremental, FAKE_TOKEN_S=0.002)
    try:
        wait_ready("127.0.0.1", port, 20, lambda: p.poll() is None)
        prompt = [1000, 1001, 1002]
        r = generate_stream("127.0.0.1", port, prompt, 12)
        assert r.ok, r.error
        assert r.output_ids == [(3003 + 7 * i) % 50000 for i in range(12)]
        assert r.chunk_tokens == list(range(1, 13))
        # the stand-in sleeps 2 ms per token; a loaded CI host only adds to it
        assert 0.0015 <= r.tpot <= 0.02
        w = Workload("t", num_prompts=6, input_len=8, output_len=5, concurrency=3, seed=4)
        prompts = make_prompts(w, 32000)
        run = run_workload("127.0.0.1", port, w, prompts, "A", 0)
        assert [x.prompt_id for x in run.results] == list(range(6)) and all(x.ok for x in run.results)
        dead = generate_stream("127.0.0.1", _free_port(), prompt, 2, timeout=2)
        assert not dead.ok and dead.error
    finally:
        p.kill()


def test_prompts_and_workload_parsing():
    w = parse_workload("x:3:5:7:2")
    assert (w.num_prompts, w.input_len, w.output_len, w.concurrency) == (3, 5, 7, 2)
    a, b = make_prompts(w, 2000), make_prompts(w, 2000)
    assert a == b and len(a) == 3 and all(len(p) == 5 and min(p) >= 1000 and max(p) < 2000 for p in a)
    assert parse_workload("decode").output_len > parse_workload("decode").input_len
    assert parse_workload("prefill").input_len > 10 * parse_workload("prefill").output_len
    with pytest.raises(ValueError):
        parse_workload("nope")


# ----------------------------------------------------------------------------- whole CLI

def test_e2e_cli_against_stand_in_servers(tmp_path):
    """`astra-sglang e2e` end to end with a stand-in for the patch launcher (no GPU, no SGLang)."""
    from click.testing import CliRunner

    from astra_sglang.e2e.cli import e2e_cmd

    fake_py = tmp_path / "fakepython"
    fake_py.write_text(f"#!/bin/sh\n# argv: -m astra_sglang.cli patch --serve ... -- <server args>\n"
                       f"shift 2\nexec {sys.executable} {FAKE} \"$@\"\n")
    fake_py.chmod(fake_py.stat().st_mode | stat.S_IEXEC)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    out = tmp_path / "out"
    stale = out / "counters-B" / "4242.json"  # an earlier run's process in the same --out
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    port = _free_port()
    os.environ["FAKE_DIVERGE"] = "3"
    try:
        res = CliRunner().invoke(e2e_cmd, ["--model-path", str(model), "--python", str(fake_py), "--out", str(out),
                                           "--port", str(port), "--rounds", "2", "--workload", "d:6:16:12:3",
                                           "--workload", "p:4:300:2:2", "--startup-timeout", "30",
                                           "--bootstrap", "200"])
    finally:
        os.environ.pop("FAKE_DIVERGE")
    assert res.exit_code == 0, res.output + str(res.exception)
    data = json.loads((out / "results.json").read_text())
    assert [(r["workload"], r["round"], r["arm"]) for r in data["runs"]][:6] == [
        ("d", -1, "A"), ("d", -1, "B"), ("d", 0, "A"), ("d", 0, "B"), ("d", 1, "B"), ("d", 1, "A")]
    assert len(data["runs"]) == 12
    md = (out / "report.md").read_text()
    assert "### d" in md and "### p" in md
    # the stand-in's patched arm diverges at token 3: every d prompt, never for p (2 tokens)
    assert "A vs B (same round): 0/12 identical; first divergence at token min 3" in md
    assert "A vs B (same round): 8/8 identical" in md
    assert "launch_server args" in md and "--skip-tokenizer-init" in md
    # the stand-in Python's FA3 probe fails (it runs the stand-in server): auto falls back to triton, and the report
    # says so (tests/test_e2e_attention.py probes real package directories)
    assert "--attention-backend triton" in md and "| attention backend | triton (auto:" in md
    assert "astra-sglang patch --serve --ops none" in md
    assert "| host load (1-min average, after each round) | " in md and f"on {os.cpu_count()} CPUs" in md
    assert not stale.exists()  # its counters are not summed into this run's
    # re-analysis from results.json alone
    res2 = CliRunner().invoke(e2e_cmd, ["--analyze", str(out / "results.json"), "--out", str(tmp_path / "re"),
                                        "--bootstrap", "200"])
    assert res2.exit_code == 0, res2.output
    assert (tmp_path / "re" / "report.md").read_text().count("###") == 2


def test_host_load_text_flags_a_busy_host():
    """A batch-1 served A/B is host-bound: the report keeps the host's load over the rounds and says when it passed
    half the CPUs (session 30's batch-1 MoE A/B ran beside a step A/B: +7.45% n.s.; alone, +39.16%)."""
    from astra_sglang.e2e.cli import host_load_text

    assert host_load_text([], 32) == "not sampled"
    assert host_load_text([2.0, 5.5, 3.1], 32) == "2.0 to 5.5 on 32 CPUs"
    assert "busy" in host_load_text([4.0, 17.0], 32) and "busy" not in host_load_text([16.0], 32)


# ----------------------------------------------------------------------------- served decode-step profile

def _fake_server_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("e2e_fake_server", FAKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_decode_profile_splits_a_served_step_into_replay_other_and_idle():
    """Per CUDA-graph replay: span (its kernels), period (to the next replay), other kernels between, GPU idle."""
    from astra_sglang.e2e.server_profile import compare_markdown, decode_profile

    fake = _fake_server_module()
    a, b = decode_profile(fake.profile_trace(False)), decode_profile(fake.profile_trace(True))
    assert (a.replays, a.span_us, a.period_us, a.other_us, a.idle_us) == (5, 60.0, 100.0, 4.0, 36.0)
    assert (b.span_us, b.period_us, b.other_us, b.idle_us) == (56.0, 150.0, 4.0, 90.0)
    assert a.kernels_us == {"gemm": 50.0, "flashinfer_rmsnorm": 10.0} and b.kernels_us["astra_rmsnorm_kernel"] == 6.0
    assert "argmax" not in a.kernels_us   # outside the graph: counted in "other", not as a replay kernel
    md = compare_markdown(a, b, "c8")
    assert "| period | 100.0 | 150.0 | +50.0 |" in md and "| GPU idle | 36.0 | 90.0 | +54.0 |" in md
    rows = [l for l in md.splitlines() if l.startswith("| `")]
    assert rows[0].startswith("| `flashinfer_rmsnorm` | 10.00 | 0.00 | -10.00 |")   # largest difference first
    assert "Host-bound" not in md                      # A: idle 36 µs of a 100 µs step, replay 60
    assert "**Host-bound.** In arm A the GPU waited for the host 90 µs of each 150 µs step" in compare_markdown(b, a, "c8")
    assert decode_profile({"traceEvents": fake.profile_trace(False, replays=1)["traceEvents"]}) is None
    assert "nothing to compare" in compare_markdown(a, None, "c8")


def _stand_in_launcher(tmp_path):
    """A `python` that runs the stand-in server for `-m astra_sglang.cli patch --serve ...`, and a model dir."""
    fake_py = tmp_path / "fakepython"
    fake_py.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} {FAKE} \"$@\"\n")
    fake_py.chmod(fake_py.stat().st_mode | stat.S_IEXEC)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    return fake_py, model


def test_e2e_server_profile_round_compares_the_arms(tmp_path):
    """--server-profile W: after W's measured rounds one more round per arm under the server's profiler; the report
    gains the comparison, and the profiled rounds are not among the measured ones."""
    from click.testing import CliRunner

    from astra_sglang.e2e.cli import e2e_cmd

    fake_py, model = _stand_in_launcher(tmp_path)
    out = tmp_path / "out"
    args = ["--model-path", str(model), "--python", str(fake_py), "--out", str(out), "--port", str(_free_port()),
            "--rounds", "1", "--workload", "d:4:16:8:2", "--startup-timeout", "30", "--bootstrap", "100"]
    bad = CliRunner().invoke(e2e_cmd, args + ["--server-profile", "nope"])
    assert bad.exit_code != 0 and "--server-profile nope: no such workload (d)" in str(bad.exception)
    res = CliRunner().invoke(e2e_cmd, args + ["--server-profile", "d"])
    assert res.exit_code == 0, res.output + str(res.exception)
    data = json.loads((out / "results.json").read_text())
    assert all(r["round"] >= -1 for r in data["runs"]) and len(data["runs"]) == 4
    md = (out / "report.md").read_text()
    assert "Served decode steps, profiled (d" in md and "| period | 100.0 | 150.0 | +50.0 |" in md
    prof = json.loads((out / "server-profile.json").read_text())
    assert prof["B"]["idle_us"] == 90.0 and (out / "server-profile" / "A" / "fake-TP-0.trace.json.gz").is_file()


def test_e2e_each_op_runs_one_ab_per_op_against_one_baseline(tmp_path):
    """--each-op: arm A starts once, arm B once per op; each op's report in OUT/<op>/, one summary table and plot.
    An op whose server dies is reported in the table and makes the command fail, after the others ran."""
    from click.testing import CliRunner

    from astra_sglang.e2e.cli import e2e_cmd

    fake_py, model = _stand_in_launcher(tmp_path)
    out = tmp_path / "out"
    os.environ["FAKE_FAIL_OPS"] = "rmsnorm"
    try:
        res = CliRunner().invoke(e2e_cmd, ["--model-path", str(model), "--python", str(fake_py), "--out", str(out),
                                           "--port", str(_free_port()), "--rounds", "2", "--workload", "d:4:16:8:2",
                                           "--startup-timeout", "20", "--bootstrap", "100", "--each-op",
                                           "--ops", "silu_and_mul,rmsnorm,fused_add_rmsnorm"])
    finally:
        os.environ.pop("FAKE_FAIL_OPS")
    assert res.exit_code != 0 and "--each-op: rmsnorm did not run to the end" in str(res.exception)
    md = (out / "each-op.md").read_text()
    assert "| silu_and_mul | d |" in md and "| fused_add_rmsnorm | d |" in md and "8/8 identical" in md
    assert "| rmsnorm | — |" in md and "failed: arm B" in md
    assert (out / "silu_and_mul" / "report.md").is_file() and (out / "each-op.png").is_file()
    assert "--ops silu_and_mul " in (out / "silu_and_mul" / "report.md").read_text()
    assert (out / "server-A.log").read_text().count("fake server on") == 1   # one baseline for every op
    bad = CliRunner().invoke(e2e_cmd, ["--step", "--each-op", "--model-path", str(model), "--out", str(tmp_path / "s")])
    assert bad.exit_code != 0 and "--each-op is for a server A/B" in str(bad.exception)


def test_e2e_server_aa_runs_two_unpatched_servers_that_do_not_spin_when_idle(tmp_path):
    """--aa on a server A/B: arm B is a second unpatched server (the null A/B). Both arms' flags carry
    --sleep-on-idle: SGLang's idle scheduler otherwise spins a core beside the arm being measured."""
    from click.testing import CliRunner

    from astra_sglang.e2e.cli import e2e_cmd

    fake_py, model = _stand_in_launcher(tmp_path)
    out = tmp_path / "out"
    args = ["--model-path", str(model), "--python", str(fake_py), "--out", str(out), "--port", str(_free_port()),
            "--rounds", "1", "--workload", "d:4:16:8:2", "--startup-timeout", "30", "--bootstrap", "100"]
    os.environ["FAKE_DIVERGE"] = "1"   # the stand-in diverges only when patched: an A/A must stay identical
    try:
        res = CliRunner().invoke(e2e_cmd, args + ["--aa"])
    finally:
        os.environ.pop("FAKE_DIVERGE")
    assert res.exit_code == 0, res.output + str(res.exception)
    md = (out / "report.md").read_text()
    assert "A/A control: a second unpatched server" in md and "4/4 identical" in md
    assert "--sleep-on-idle" in md
    assert all("ops=none" in (out / f"server-{arm}.log").read_text() for arm in "AB")
    bad = CliRunner().invoke(e2e_cmd, args + ["--ops", "none"])
    assert bad.exit_code != 0 and "or --aa for that on purpose" in str(bad.exception)
    # that A/A is the floor of a later A/B, live or re-analysed; an A/B's summary is refused as a floor
    ab_out = tmp_path / "ab"
    res = CliRunner().invoke(e2e_cmd, [*args[:5], str(ab_out), *args[6:], "--ops", "rmsnorm", "--aa-floor", str(out)])
    assert res.exit_code == 0, res.output + str(res.exception)
    assert "## Against an earlier A/A" in (ab_out / "report.md").read_text()
    re_out = tmp_path / "re"
    res = CliRunner().invoke(e2e_cmd, ["--analyze", str(ab_out / "results.json"), "--out", str(re_out),
                                       "--bootstrap", "100", "--aa-floor", str(out / "summary.json")])
    assert res.exit_code == 0 and "| workload | metric | A/B Δ (rounds) |" in (re_out / "report.md").read_text()
    # as results/ keeps it: summary.json.xz, named or found in its folder
    import lzma
    kept = tmp_path / "kept"
    kept.mkdir()
    with lzma.open(kept / "summary.json.xz", "wt") as f:
        f.write((out / "summary.json").read_text())
    for floor in (kept, kept / "summary.json.xz"):
        res = CliRunner().invoke(e2e_cmd, ["--analyze", str(ab_out / "results.json"), "--out", str(re_out),
                                           "--bootstrap", "100", "--aa-floor", str(floor)])
        assert res.exit_code == 0 and "## Against an earlier A/A" in (re_out / "report.md").read_text()
    with lzma.open(kept / "results.json.xz", "wt") as f:   # the A/B's own results, kept the same way
        f.write((ab_out / "results.json").read_text())
    res = CliRunner().invoke(e2e_cmd, ["--analyze", str(kept / "results.json.xz"), "--out", str(re_out),
                                       "--bootstrap", "100"])
    assert res.exit_code == 0 and "A vs B (same round): 4/4 identical" in (re_out / "report.md").read_text()
    bad = CliRunner().invoke(e2e_cmd, args + ["--ops", "rmsnorm", "--aa-floor", str(ab_out)])
    assert bad.exit_code != 0 and "not the summary of a server A/A" in str(bad.exception)
    bad = CliRunner().invoke(e2e_cmd, ["--analyze", str(ab_out / "results.json"), "--out", str(re_out),
                                       "--aa-floor", str(ab_out / "summary.json")])
    assert bad.exit_code != 0 and "not the summary of a server A/A" in str(bad.exception)
    bad = CliRunner().invoke(e2e_cmd, ["--analyze", str(out / "summary.json"), "--out", str(re_out)])
    assert bad.exit_code != 0 and "not the results.json of a server A/B" in str(bad.exception)
    bad = CliRunner().invoke(e2e_cmd, args + ["--aa", "--candidate", f"rmsnorm={model / 'config.json'}"])
    assert bad.exit_code != 0 and "an A/A patches nothing" in str(bad.exception)
    bad = CliRunner().invoke(e2e_cmd, args + ["--aa", "--each-op"])
    assert bad.exit_code != 0 and "--each-op with --aa" in str(bad.exception)


def test_calibrated_schedule_rotates_three_arms():
    order = st.calibrated_schedule(3)
    assert order[:3] == [(-1, "A"), (-1, "B"), (-1, "A2")]
    rounds = [[a for r, a in order if r == k] for k in range(3)]
    assert rounds == [["A", "B", "A2"], ["B", "A2", "A"], ["A2", "A", "B"]]   # each arm once in each position
    runs = [st.Run("w", a, r, []) for r, a in order]
    aa = st.aa_runs(runs)
    assert sorted({r.arm for r in aa}) == ["A", "B"] and len(aa) == 8   # A2 read as B; B itself left out


def test_e2e_server_calibrate_reports_the_aa_control_under_the_ab(tmp_path):
    """--calibrate on a server A/B: a third server A2, unpatched, runs in the same rounds; report.md gains the A/A
    (A against A2) under the A/B, and the A/B itself never sees A2's runs."""
    from click.testing import CliRunner

    from astra_sglang.e2e.cli import e2e_cmd

    fake_py, model = _stand_in_launcher(tmp_path)
    out = tmp_path / "out"
    args = ["--model-path", str(model), "--python", str(fake_py), "--out", str(out), "--port", str(_free_port()),
            "--rounds", "2", "--workload", "d:4:16:8:2", "--startup-timeout", "30", "--bootstrap", "100",
            "--ops", "rmsnorm"]
    os.environ["FAKE_DIVERGE"] = "2"
    try:
        res = CliRunner().invoke(e2e_cmd, args + ["--calibrate"])
    finally:
        os.environ.pop("FAKE_DIVERGE")
    assert res.exit_code == 0, res.output + str(res.exception)
    data = json.loads((out / "results.json").read_text())
    assert sorted({r["arm"] for r in data["runs"]}) == ["A", "A2", "B"] and len(data["runs"]) == 9
    md = (out / "report.md").read_text()
    ab, aa = md.split("## A/A control")
    assert "A vs B (same round): 0/8 identical" in ab          # the patched stand-in diverges
    assert "A vs B (same round): 8/8 identical" in aa and "B = A2, unpatched" in aa
    assert "| workload | metric | A/B Δ (rounds) | A/A Δ | floor | verdict |" in aa
    assert "arm A2 | astra-sglang patch --serve --ops none" in ab
    assert (out / "summary-aa.json").is_file() and "ops=none" in (out / "server-A2.log").read_text()
    bad = CliRunner().invoke(e2e_cmd, args + ["--calibrate", "--aa"])
    assert bad.exit_code != 0 and "--calibrate already runs an A/A" in str(bad.exception)


def test_sleep_on_idle_is_a_server_flag_of_every_pinned_sglang(sglang_pkg):
    """Both arms of a server A/B pass --sleep-on-idle: each SGLang the adapters bind must define it, a ServerArgs
    field `sleep_on_idle` whose flag is its name with dashes (0.5.17: server_args.py; 0.5.23: arg_groups/)."""
    from astra_sglang.e2e.cli import server_args

    srt = sglang_pkg / "sglang" / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
    src = "\n".join(f.read_text() for f in files if f.is_file())
    assert re.search(r"^\s+sleep_on_idle\s*:\s*A\[bool", src, re.M), "ServerArgs has no sleep_on_idle"
    assert 'replace("_", "-")' in src
    assert "--sleep-on-idle" in server_args("m", "dummy", 1, 8, 0.5, 8, [])


def test_floor_markdown_judges_the_ab_against_its_aa():
    """As the step A/B does: resolved only where the A/B's interval excludes 0 and |Δ| exceeds the A/A's floor (its
    half-width, or its far edge when the A/A itself excludes 0: a steady offset between two servers)."""
    def summ(rel, lo, hi):
        return {"workloads": {"c8": {"comparisons": {"output_throughput": {"rel_change": rel, "rel_lo": lo,
                                                                             "rel_hi": hi}}}}}
    ab = summ(0.10, 0.06, 0.14)
    assert "| 4.00% | resolved: B better |" in st.floor_markdown(ab, summ(0.0, -0.04, 0.04))
    # the A/A shows a +12% offset: a +10% A/B is inside it
    md = st.floor_markdown(ab, summ(0.12, 0.08, 0.16))
    assert "(offset) | 16.00% | not resolved |" in md
    assert "not resolved" in st.floor_markdown(summ(-0.02, -0.05, 0.01), summ(0.0, -0.01, 0.01))
    assert "resolved: B worse" in st.floor_markdown(summ(-0.2, -0.25, -0.15), summ(0.0, -0.01, 0.01))


def test_report_says_how_many_rounds_a_wide_interval_needs():
    """±6% over 4 rounds: about 36 rounds for ±2% (the interval narrows as 1/sqrt(rounds)); a tight one says nothing."""
    wide = {"n_rounds": 4, "rel_lo": -0.06, "rel_hi": 0.06, "rel_change": 0.0}
    assert "±6.0% over 4 rounds" in st.rounds_for(wide) and "About 36 rounds" in st.rounds_for(wide)
    assert st.rounds_for({"n_rounds": 4, "rel_lo": -0.01, "rel_hi": 0.015, "rel_change": 0.0}) == ""
    assert st.rounds_for({"n_rounds": 1, "rel_lo": float("nan"), "rel_hi": float("nan")}) == ""


def test_report_flags_an_arm_whose_rounds_vary_much_more_than_the_others():
    """The MoE model at batch 1 (H200, 2026-11-27): arm B 506-668 tok/s over 12 rounds, arm A 468-548. The report
    says so; arms that vary alike (or too little to matter) get no sentence."""
    b = [530, 647, 660, 584, 598, 514, 565, 570, 668, 625, 629, 654]
    a = [536, 489, 529, 516, 514, 537, 548, 545, 544, 545, 497, 544]
    runs = [{"arm": "A", "round": i, "output_throughput": v} for i, v in enumerate(a)] + \
           [{"arm": "B", "round": i, "output_throughput": v} for i, v in enumerate(b)] + \
           [{"arm": "B", "round": -1, "output_throughput": 10.0}]          # the warm-up round is not measured
    msg = st.arm_spread(runs)
    assert msg.startswith("Arm B's rounds vary 2.2×") and "CV 8.6% against 3.8%" in msg
    same = [{**r, "output_throughput": r["output_throughput"] * (1.0 if r["arm"] == "A" else 1.1)}
            for r in runs if r["arm"] == "A"] + [{**r, "arm": "B"} for r in runs if r["arm"] == "A"]
    assert st.arm_spread(same) == ""
    tiny = [{"arm": arm, "round": i, "output_throughput": 100 + (i % 2) * (2 if arm == "B" else 0.5)}
            for arm in "AB" for i in range(6)]
    assert st.arm_spread(tiny) == ""                                          # B's CV is ~1%: below 3%
    assert st.arm_spread(runs[:2]) == ""                                      # too few rounds
