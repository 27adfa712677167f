"""Timing statistics, run planning, report rendering (table, JSON, plot), ceiling cache, ncu and
compute-sanitizer parsing — everything in bench that needs no GPU."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from astra_sglang.harness.timer import (
    HELPERS_CU,
    L2_FACTOR,
    ceiling_key,
    load_cached_ceiling,
    plan_calls,
    plan_sets,
    store_ceiling,
)
from astra_sglang.harness.sanitize import parse_sanitizer_log
from astra_sglang.harness.ncu import not_permitted, parse_csv, parse_resource_usage, summarize_kernel
from astra_sglang.harness.results import BenchReport, BenchRow
from astra_sglang.harness.stats import geomean, is_noise, median, pct_of_ceiling, percentile, spread
from astra_sglang.static_checks import errors, scan_source


# ------------------------------------------------------------------ statistics


def test_percentiles_median_spread():
    xs = [10.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 11.0]
    assert median(xs) == 6.0
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 11.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert spread([5.0] * 10) == 0.0
    assert spread(xs) == pytest.approx((percentile(xs, 90) - percentile(xs, 10)) / 6.0)
    with pytest.raises(ValueError):
        median([])


def test_one_outlier_barely_moves_median_or_spread():
    xs = [2.0] * 29 + [50.0]
    assert median(xs) == 2.0 and spread(xs) == 0.0


def test_geomean_and_noise():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([1.1, 1.2, 1.3]) == pytest.approx((1.1 * 1.2 * 1.3) ** (1 / 3))
    assert geomean([]) is None and geomean([None, 0.0]) is None
    assert is_noise(10.0, 0.02, 10.1, 0.01)  # 1% < 2% spread
    assert not is_noise(10.0, 0.02, 9.0, 0.01)  # 10% faster is real
    assert is_noise(10.0, 0.0, 10.0, 0.0) is False  # identical with no spread: not "noise", just equal


def test_pct_of_ceiling():
    assert pct_of_ceiling(3_000_000, 1.0, 3000.0) == pytest.approx(100.0)  # 3 MB in 1 µs = 3 TB/s
    assert pct_of_ceiling(1, 0.0, 3000.0) is None


# ------------------------------------------------------------------ planning


def test_plan_sets_exceeds_four_l2():
    l2 = 50 << 20
    n, note = plan_sets(393_216, l2)  # silu 16x4096 fp16: 384 KiB per set
    assert n * 393_216 > L2_FACTOR * l2 and note == ""
    n, _ = plan_sets(4096 * 14336 * 3 * 2, l2)  # bigger than 4x L2 alone: still rotate 2
    assert n == 2
    n, note = plan_sets(10 << 30, l2, mem_cap=16 << 30)
    assert n == 1 and "only 1 input sets fit" in note
    assert plan_sets(393_216, l2, "warm") == (1, "")


def test_plan_sets_caps_tiny_sets():
    from astra_sglang.harness.timer import MAX_CALLS, MAX_SETS

    l2 = 60 << 20
    n, note = plan_sets(1100, l2)  # moe_align batch 1: 228k sets uncapped (minutes of Python per stage)
    assert n == MAX_CALLS and "capped" in note   # 16384 of them would still sit in L2: a graph's worth rotate
    n, note = plan_sets(8192, l2)   # 16384 sets of 8 KB reach 2x L2: the cap itself
    assert n == MAX_SETS and "capped" in note
    n, note = plan_sets(1100, l2, mem_cap=1 << 20)  # the memory cap, when tighter, still wins and says so
    assert n == (1 << 20) // 1100 and "fit in" in note
    assert plan_sets(4 * l2 // MAX_SETS, l2)[1] == ""  # at the cap exactly: unchanged


def test_plan_calls_uses_every_set_equally_and_targets_replay_length():
    n = plan_calls(2.0, 512)
    assert n % 512 == 0 and n >= 1000
    n = plan_calls(100.0, 2)
    assert n % 2 == 0 and 20 <= n <= 22
    assert plan_calls(0.01, 7, max_calls=100) == 98
    assert plan_calls(1.0, 5000, max_calls=4096) == 5000  # at least one full pass over the sets


def test_ceiling_cache_round_trip(tmp_path):
    p = tmp_path / "ceiling.json"
    k = ceiling_key("NVIDIA H100 80GB HBM3", "GPU-abc", "13.0")
    assert load_cached_ceiling(p, k) is None
    store_ceiling(p, k, {"gbps": 3010.5, "bytes": 1 << 30})
    assert load_cached_ceiling(p, k) is None  # cached before the read ceiling existed: measured again
    store_ceiling(p, k, {"gbps": 3010.5, "read_gbps": 3390.0, "bytes": 1 << 30})
    store_ceiling(p, "other", {"gbps": 1.0, "read_gbps": 1.0})
    assert load_cached_ceiling(p, k)["gbps"] == 3010.5 and load_cached_ceiling(p, k)["read_gbps"] == 3390.0
    p.write_text("{broken")
    assert load_cached_ceiling(p, k) is None


def test_helper_kernels_obey_the_candidate_rules():
    assert errors(scan_source(HELPERS_CU)) == []


@pytest.mark.nvcc
def test_helper_kernels_build_for_hopper_and_export_every_launcher(tmp_path, monkeypatch):
    """The helpers compile with the real nvcc for sm_90a (the touch kernel's griddepcontrol and PDL launch
    included), and the library exports each launcher the timer binds."""
    import ctypes
    import shutil

    if not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("needs nvcc")
    from astra_sglang.harness.timer import build_helpers

    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    try:
        lib = ctypes.CDLL(str(build_helpers("sm_90a")), mode=ctypes.RTLD_LOCAL)
    except OSError as e:  # no CUDA runtime to load on this machine: the build itself is what was tested
        if "libcudart" not in str(e):
            raise
        return
    for name in ("astra_copy", "astra_read", "astra_empty", "astra_touch"):
        assert hasattr(lib, name), name


# ------------------------------------------------------------------ report


def _report():
    rows = [
        BenchRow.make("16x4096", "fp16", [1.65, 1.66, 1.64, 1.65], [1.20, 1.21, 1.19, 1.20], 16 * 4096 * 6, 3000.0,
                      calls_per_replay=1536, input_sets=512, replays=4, tags=["paper"]),
        BenchRow.make("4096x14336", "bf16", [85.0, 85.2, 84.9, 85.1], [85.1, 85.0, 85.2, 84.9], 4096 * 14336 * 6,
                      3000.0, calls_per_replay=22, input_sets=2, replays=4),
    ]
    return BenchReport(op="silu_and_mul", variant="jit", candidate="cand.cu", device="NVIDIA H100 80GB HBM3",
                       date="2026-11-21T00:00:00+00:00", l2="cold", replays=4, ceiling_gbps=3000.0,
                       ceiling_source="measured", launch_floor_us=0.85, rows=rows,
                       recheck={"ok": True, "reason": "", "cases": 2})


def test_rows_speedup_noise_and_ceiling():
    rep = _report()
    a, b = rep.rows
    assert a.speedup == pytest.approx(1.65 / 1.20) and not a.noise
    assert b.noise and b.speedup == pytest.approx(1.0, abs=0.01)
    assert b.pct_of_ceiling == pytest.approx(100 * 4096 * 14336 * 6 / (b.cand_us * 1e-6) / 3e12)
    assert rep.geomean == pytest.approx(math.sqrt(a.speedup * b.speedup))
    assert rep.max_spread == pytest.approx(max(r.max_spread for r in rep.rows))


def test_table_renders_every_row_and_the_summary():
    t = _report().table()
    assert "16x4096" in t and "4096x14336" in t and "noise" in t
    assert "geomean speedup" in t and "copy ceiling 3000 GB/s" in t and "0.85 µs" in t
    assert "re-check after timing: passed" in t
    prod_only = BenchReport(op="x", rows=[BenchRow.make("1x1", "fp16", [1.0, 1.1], None, 10, 3000.0)])
    t2 = prod_only.table()
    assert "cand" not in t2.splitlines()[0] and "geomean" not in t2


def test_table_says_when_in_context_timing_did_not_run():
    """moe_align's first decode corpus ran no in-context timing (torch cannot GEMM int32): every row fell back to its
    chained time with only a per-row note. The footer now says so."""
    rep = _report()
    assert "IN CONTEXT NOT MEASURED" not in rep.table()
    rep.notes = [f"{r.shape} {r.dtype}: in-context timing not measured (\"normal_kernel_cuda\" not implemented for "
                 f"'Int')" for r in rep.rows[:1]] + ["16x4096 fp16: something else"]
    foot = rep.table().splitlines()
    line = next(x for x in foot if x.startswith("IN CONTEXT NOT MEASURED"))
    assert "on 1 of 2 rows" in line and "normal_kernel_cuda" in line


def test_the_footer_says_what_serving_sees_where_the_adapter_keeps_rows():
    """linear's corpus holds 8-token and wide-output rows its adapter leaves to cuBLAS: the whole corpus read 1.096x
    and the 88 rows the patch takes 1.217x (H200, 2026-11-28). The footer gives the second where rows are marked."""
    rep = _report()
    assert not rep.served_line()                     # unmarked (an op without an adapter, an older JSON)
    rep.rows[0].kept, rep.rows[1].kept = "", ""
    assert not rep.served_line()                     # every row taken: the geomean above is serving's already
    rep.rows[1].kept = "8 tokens > 4: SGLang's cuBLAS GEMM"
    line = next(x for x in rep.table().splitlines() if x.startswith("served:"))
    assert "over the 1 of 2 rows" in line and f"{rep.rows[0].speedup:.3f}x" in line
    assert rep.served_geomean == pytest.approx(rep.rows[0].speedup)
    assert rep.to_dict()["served_geomean"] == pytest.approx(rep.rows[0].speedup)
    rep.rows[0].kept = "in_features 1002 is not a multiple of 8"
    assert "none of the 2 rows" in rep.served_line()


def test_the_footer_splits_off_the_floor_every_kernel_pays():
    """fused_add_rmsnorm, 2026-11-28: 1.239x in context, but 1.362x over the floor; 16 of 28 rows carry a 1.5-1.9 us
    floor (the cost of any kernel between the GEMMs), where the same saving reads 1.160x."""
    rep = _report()
    for r, (base, cand, floor) in zip(rep.rows, ((3.38, 2.93, 1.49), (1.95, 1.43, 0.32))):
        r.context_base_us, r.context_cand_us, r.context_floor_us = base, cand, floor
        r.context_speedup, r.context_floor_spread_us = base / cand, 0.01
    a, b = rep.rows
    assert a.over_floor == pytest.approx((3.38 - 1.49) / (2.93 - 1.49))
    assert b.over_floor == pytest.approx((1.95 - 0.32) / (1.43 - 0.32))
    line = next(x for x in rep.table().splitlines() if x.startswith("over the floor"))
    assert "over 2 rows" in line and "1 rows have a floor >= 1 us" in line and f"{3.38 / 2.93:.3f}x" in line
    assert rep.to_dict()["rows"][0]["over_floor"] == pytest.approx(a.over_floor)
    b.context_cand_us = 0.35                                     # within 0.05 us of the floor: no ratio
    assert b.over_floor is None


def test_bench_marks_the_rows_the_adapter_keeps():
    from astra_sglang.harness.bench import mark_served

    rows = [BenchRow.make(s, "bf16", [10.0, 10.1], [9.0, 9.1], 1, 3000.0)
            for s in ("1x4096x4096", "8x4096x4096", "1x28672x4096", "1x1")]
    rep = BenchReport(op="linear", rows=rows)
    mark_served(rep)
    assert rows[0].kept == "" and "tokens" in rows[1].kept and "28672" in rows[2].kept
    assert rows[3].kept is None or isinstance(rows[3].kept, str)   # a shape of the wrong rank: never an exception
    other = BenchReport(op="merge_state", rows=[BenchRow.make("1x32x128", "bf16", [1.0], [0.9], 1, 3000.0)])
    mark_served(other)                                            # an adapter without a shape rule: every row taken
    assert other.rows[0].kept == ""


def test_json_round_trip(tmp_path):
    rep = _report()
    p = rep.to_json(tmp_path / "r.json")
    d = json.loads(p.read_text())
    assert d["geomean"] == pytest.approx(rep.geomean) and d["rows"][0]["pct_of_ceiling"] is not None
    back = BenchReport.from_json(p)
    assert back.rows[1].shape == "4096x14336" and back.geomean == pytest.approx(rep.geomean)
    assert back.rows[0].prod_samples_us == rep.rows[0].prod_samples_us


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    p = _report().plot(tmp_path / "r.png")
    assert p and p.exists() and p.read_bytes()[:4] == b"\x89PNG"
    prod_only = BenchReport(op="x", rows=[BenchRow.make("1x1", "fp16", [1.0, 1.1], None, 10, 3000.0)])
    assert prod_only.plot(tmp_path / "p.png").exists()


# ------------------------------------------------------------------ ncu / sanitizer parsing

NCU_LONG = '''==PROF== Connected to process 1234 (/usr/bin/python3.12)
==PROF== Profiling "act_and_mul_kernel": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.53"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","12.34"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","9.8"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","18"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum","byte","0"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum","byte","1,024"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","ratio","5.5"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","ratio","0.7"
"0","1234","python3.12","127.0.0.1","void sglang::act_and_mul_kernel<__half, 0, true, false>(sglang::ActivationParams)","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","ratio","0"
"1","1234","python3.12","127.0.0.1","other_kernel","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,500"
==PROF== Disconnected from process 1234
'''


def test_ncu_long_csv_parse_and_summary():
    ks = parse_csv(NCU_LONG)
    assert [k["id"] for k in ks] == ["0", "1"]
    s = summarize_kernel(ks[0])
    assert s["duration_us"] == pytest.approx(2.53)
    assert s["dram_throughput_pct"] == pytest.approx(12.34)
    assert s["achieved_occupancy_pct"] == pytest.approx(9.8)
    assert s["registers_per_thread"] == 18
    assert s["local_store_bytes"] == 1024 and s["local_spills"] is True
    assert [x["reason"] for x in s["top_stalls"]] == ["long_scoreboard", "wait"]
    assert summarize_kernel(ks[1])["duration_us"] == pytest.approx(1.5)


def test_ncu_wide_raw_csv_parse():
    text = ('"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread"\n'
            '"","","msecond","register/thread"\n'
            '"0","k","0.0042","32"\n')
    ks = parse_csv(text)
    s = summarize_kernel(ks[0])
    assert s["duration_us"] == pytest.approx(4.2) and s["registers_per_thread"] == 32


def test_ncu_permission_message():
    assert not_permitted("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                         "Performance Counters") is not None
    assert not_permitted("==PROF== Disconnected") is None


def test_cuobjdump_resource_usage_parse():
    text = (" Function _Z6kernelPf:\n  REG:18 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:368 TEXTURE:0 SURFACE:0 SAMPLER:0\n"
            " Function _Z5spillPf:\n  REG:255 STACK:64 SHARED:1024 LOCAL:32 CONSTANT[0]:368\n")
    r = parse_resource_usage(text)
    assert r == [{"function": "_Z6kernelPf", "registers": 18, "stack": 0, "shared": 0, "local": 0},
                 {"function": "_Z5spillPf", "registers": 255, "stack": 64, "shared": 1024, "local": 32}]


def test_sanitizer_log_parse():
    log = ("========= COMPUTE-SANITIZER\n"
           "========= Invalid __global__ write of size 2 bytes\n"
           "=========     at void silu_mul_kernel<__half>(...)+0x1d0\n"
           "========= ERROR SUMMARY: 3 errors\n")
    n, first = parse_sanitizer_log(log)
    assert n == 3 and first.startswith("Invalid __global__ write of size 2 bytes")
    assert parse_sanitizer_log("========= ERROR SUMMARY: 0 errors\n") == (0, "")
    n, first = parse_sanitizer_log("========= Race reported between Write access at k+0x10\n"
                                   "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    assert n == 1 and first.startswith("Race reported")


def test_bench_report_json_is_replaced_whole(tmp_path):
    """bench rewrites its JSON after every row (a run killed from outside keeps the rows so far): each write
    replaces the file whole, through a temporary beside it, and leaves no temporary behind."""
    from astra_sglang.harness.results import BenchReport, BenchRow

    out = tmp_path / "b.json"
    rep = BenchReport(op="moe_gate", ok=False, reason="partial: 1 of 2 rows timed so far")
    rep.rows.append(BenchRow(shape="1x2048x128", dtype="bf16", prod_us=4.5, prod_spread=0.1))
    rep.to_json(out)
    first = json.loads(out.read_text())
    assert first["ok"] is False and first["reason"].startswith("partial") and len(first["rows"]) == 1
    rep.rows.append(BenchRow(shape="8x2048x128", dtype="bf16", prod_us=4.9, prod_spread=0.1))
    rep.ok, rep.reason = True, ""
    rep.to_json(out)
    assert json.loads(out.read_text())["ok"] is True and len(json.loads(out.read_text())["rows"]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]


def test_partial_report_keeps_the_rechecks_so_far_and_says_a_failed_one():
    """A bench cut by its deadline wrote its rows but not its re-checks (moe_grouped_router, 2026-11-27): the
    worker now reports each re-check after timing, and the partial JSON carries them."""
    from astra_sglang.harness.bench import fold_event
    from astra_sglang.harness.results import BenchReport, BenchRow

    rep, said = BenchReport(op="moe_grouped_router"), []
    row = BenchRow(shape="1x256x9x8x4x1", dtype="bf16", prod_us=14.7, prod_spread=0.01).__dict__
    assert fold_event(rep, {"event": "row", "row": row}, 3, said.append)
    assert rep.reason.startswith("partial: 1 of 3 rows") and not rep.ok and rep.recheck == {}
    ok = {"ok": True, "reason": "", "cases": 1, "failures": []}
    assert fold_event(rep, {"event": "recheck", "recheck": ok, "failures": []}, 3, said.append)
    assert rep.recheck == ok and said == []
    bad = {"ok": False, "reason": "r1: out differs", "cases": 2, "failures": ["r1: out differs"]}
    assert fold_event(rep, {"event": "recheck", "recheck": bad, "failures": ["r1: out differs"]}, 3, said.append)
    assert rep.recheck["ok"] is False and said == ["re-check FAILED: r1: out differs"]
    assert len(rep.rows) == 1 and rep.to_dict()["recheck"]["cases"] == 2
    # stages, heartbeats and a refused row (row=None) change nothing
    for ev in ({"event": "stage", "msg": "x"}, {"event": "heartbeat"}, {"event": "row", "row": None}):
        assert not fold_event(rep, ev, 3, said.append)


def test_footer_counts_rows_faster_within_noise_and_slower():
    """Issue 14's "every row >= 1.00x" read off the footer: a row below 1.00x within its replays' noise is not a
    measured loss (2026-11-27: every norm row below 1.00x was), a row slower beyond it is named."""
    rep = _report()
    a, b = rep.rows   # a: faster, b: within noise
    assert rep.verdict_line().startswith("rows: 1 faster, 1 within noise, 0 slower; min ")
    slow = BenchRow.make("1x256", "bf16", [1.00, 1.01, 1.00], [1.40, 1.41, 1.40], 10, 3000.0)
    assert slow.speedup < 1 and not slow.noise
    rep.rows.append(slow)
    line = next(x for x in rep.table().splitlines() if x.startswith("rows: "))
    assert "1 slower (1x256 bf16 0." in line and line.endswith("(1x256 bf16)")


# ------------------------------------------------------------------ the in-context floor


def _floored(shape, base, cand, floor, floor_spread=0.05):
    r = BenchRow.make(shape, "bf16", [2.0] * 5, [1.5] * 5, 1 << 16, 4000.0)
    r.set_context({"median": base, "spread": 0.05}, {"median": cand, "spread": 0.05}, 20.0, "in-context")
    r.set_context_floor({"median": floor, "spread": floor_spread})
    return r


def test_headroom_is_production_over_the_floor_and_absent_without_a_bound():
    assert _floored("1x4096", 2.0, 1.6, 1.25).headroom == pytest.approx(1.6)
    assert _floored("1x4096", 2.0, 1.6, 0.04).headroom is None  # floor within its spread of zero: no bound
    r = _floored("1x4096", 2.0, 1.6, 1.0)
    r.context_floor_us = None
    assert r.headroom is None


def test_report_names_the_rows_no_standalone_kernel_can_bring_to_the_goal(tmp_path):
    rows = [_floored("1x4096", 1.0, 0.95, 0.9), _floored("8x4096", 2.0, 1.6, 1.0), _floored("64x4096", 3.0, 2.9, 2.6)]
    rep = BenchReport(op="silu_and_mul", rows=rows, ceiling_gbps=4000.0, replays=5)
    assert rep.headroom_geomean == pytest.approx((1.0 / 0.9 * 2.0 * 3.0 / 2.6) ** (1 / 3))
    line = rep.headroom_line()
    assert "2 rows below 1.30x" in line and "1x4096 1.11x" in line and "64x4096 1.15x" in line
    assert "8x4096" not in line
    t = rep.table()
    assert "floor µs" in t and "attainable" in t and "2.00x" in t
    assert f"attainable in context {rep.headroom_geomean:.3f}x" in t  # on the geomean line gpu_run.sh keeps
    d = json.loads(rep.to_json(tmp_path / "r.json").read_text())
    assert d["rows"][1]["headroom"] == pytest.approx(2.0)
    assert d["headroom_geomean"] == pytest.approx(rep.headroom_geomean)
    back = BenchReport.from_json(tmp_path / "r.json")
    assert back.rows[2].context_floor_us == pytest.approx(2.6)
    assert back.headroom_geomean == pytest.approx(rep.headroom_geomean)
    assert rep.plot(tmp_path / "p.png") is None or (tmp_path / "p.png").stat().st_size > 0


def test_a_report_without_a_floor_keeps_its_old_table():
    rep = _report()
    assert rep.headroom_geomean is None and rep.headroom_line() == ""
    assert "floor µs" not in rep.table() and "attainable" not in rep.table()


def test_an_op_s_own_serving_dtypes_are_its_default_and_others_are_said():
    """DeepSeek-V3's router gets fp32 logits in a bf16 model: bench, validate and gpu_run.sh default to fp32, and a
    bench of bf16 says production there may run kernels serving never does (SGLang's cast before flashinfer)."""
    import os
    import subprocess
    import sys

    from astra_sglang.harness.cases import default_dtypes, not_served
    from astra_sglang.registry import get_op

    spec = get_op("moe_grouped_router")
    assert spec.serving_dtypes == ("fp32",)
    assert default_dtypes(spec.dtypes, spec.serving_dtypes) == ["fp32"]
    assert default_dtypes(("fp32", "bf16", "fp16")) == ["fp16", "bf16"]  # an op without its own: the model's
    assert default_dtypes(("fp32", "bf16", "fp16"), (), ["bf16"]) == ["bf16"]  # gpu_run.sh's DTYPES=bf16
    assert default_dtypes(spec.dtypes, spec.serving_dtypes, ["bf16"]) == ["fp32"]  # the router's own win
    assert default_dtypes(("int32",), (), ["bf16"]) == ["int32"]  # moe_align: only its own
    assert not_served(spec, ["fp32", "bf16"]) == ["bf16"] and not_served(get_op("rmsnorm"), ["fp32"]) == []
    rep = _report()
    rep.notes = ["NOT SERVING'S DTYPE: SGLang hands moe_grouped_router fp32 in serving, not bf16: ...", "other"]
    assert "NOT SERVING'S DTYPE" in rep.table() and "other" not in rep.table()
    # gpu_run.sh's dtype choice, run as the script runs it (DTYPES is the model's)
    root = Path(__file__).resolve().parent.parent
    text = (root / "kernels" / "gpu_run.sh").read_text()
    snippet = text[text.index("dtypes_of() {"):].split("; }", 1)[0] + "; }"
    env = {**os.environ, "DTYPES": "bf16", "PYTHONPATH": str(root)}
    out = subprocess.run(["bash", "-c", snippet.replace("python3", sys.executable) +
                          "\ndtypes_of moe_grouped_router; dtypes_of rmsnorm; dtypes_of moe_align"],
                         capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.split() == ["fp32", "bf16", "int32"]  # moe_align: none of the model's dtypes: its own
    # one rule for bench, validate and the script: the same answers as default_dtypes for the model's dtypes
    assert out.stdout.split() == [",".join(default_dtypes(get_op(op).dtypes, get_op(op).serving_dtypes, ["bf16"]))
                                  for op in ("moe_grouped_router", "rmsnorm", "moe_align")]


def test_the_footer_says_which_gemms_were_the_neighbours():
    """bench --neighbours astra: the op between the GEMMs a patched server runs (astra's linear where its adapter
    takes the shape). The footer counts the rows where each of the two was astra's; cublas says F.linear."""
    rep = _report()
    for r in rep.rows:
        r.context_base_us, r.context_cand_us, r.context_speedup = 2.0, 1.5, 2.0 / 1.5
    rep.context_neighbours = "cublas"
    assert "(F.linear, cuBLAS via torch" in rep.table()
    rep.context_neighbours = "astra"
    rep.rows[0].context_gemms, rep.rows[1].context_gemms = "linear / linear", "cuBLAS / cuBLAS"
    line = next(x for x in rep.table().splitlines() if x.startswith("in context: the op between"))
    assert "--neighbours astra" in line and "producer astra's on 1 of 2 rows, consumer on 1" in line
    back = BenchReport.from_dict(rep.to_dict())
    assert back.context_neighbours == "astra" and back.rows[0].context_gemms == "linear / linear"


def test_the_floor_is_the_lower_of_a_pdl_and_a_plain_touch(tmp_path):
    """moe_combine, H200 2026-11-28: behind cuBLAS's nvjet GEMM a plain-launched kernel took 1.27 µs where the
    PDL-launched touch kernel took 1.60: the floor is the lower of the two touches, and says which it was."""
    from astra_sglang.harness.bench import lower_floor

    pdl, plain = {"median": 1.60, "spread": 0.05}, {"median": 1.02, "spread": 0.04}
    assert lower_floor([pdl, plain]) == (plain, "plain")
    assert lower_floor([plain | {"median": 0.3}, plain]) == ({"median": 0.3, "spread": 0.04}, "PDL")
    assert lower_floor([pdl]) == (pdl, "PDL")  # the plain touch's capture failed: the PDL one alone
    rows = [_floored("1x4096", 2.0, 1.6, 1.25), _floored("64x4096", 3.0, 2.9, 1.0)]
    rows[1].set_context_floor(*lower_floor([pdl, plain]))
    rep = BenchReport(op="moe_combine", rows=rows, ceiling_gbps=4000.0, replays=5)
    foot = next(x for x in rep.table().splitlines() if x.startswith("floor: "))
    assert "lower of a PDL and a plain launch" in foot and "plain launch was lower on 1 of 2 rows" in foot
    back = BenchReport.from_json(rep.to_json(tmp_path / "r.json"))
    assert [r.context_floor_launch for r in back.rows] == ["PDL", "plain"]
    assert back.rows[1].context_floor_us == pytest.approx(1.02)


def test_footer_says_when_an_extracted_launchers_own_work_was_taken_out():
    """The q_out ops' launchers copy q into q_out; at 1 token serving makes no such copy (fa3 takes a one-row view as
    it is), so bench times that copy alone and takes it out of production (spec.launcher_only)."""
    rep = _report()
    assert "launcher does work serving does not" not in rep.table()
    rep.production = "lib:/ws/dense_rope_store/build/baseline.so"
    rep.rows[0].prod_binding_us = 0.42
    t = rep.table()
    assert "launcher does work serving does not at 1 of 2 rows" in t and "(0.42-0.42 µs)" in t
    assert "its returned outputs are copied" not in t
