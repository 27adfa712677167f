"""In context, a row's noise verdict comes from the paired replay rounds (stats.paired_ci): production and candidate
are timed in the same rounds, so the median of their per-round differences has a distribution-free confidence
interval that narrows with more replays, where the old rule (|difference| < p90 - p10) never could."""
from __future__ import annotations

import math
import random

import pytest

from astra_sglang.harness.bench import combine_sites
from astra_sglang.harness.results import BenchReport, BenchRow
from astra_sglang.harness.rules import IN_CONTEXT
from astra_sglang.harness.stats import marginal, median_ci, paired_ci


def test_median_ci_is_the_binomial_order_statistics():
    assert median_ci(list(range(5))) is None            # P(B(5) = 0) = 1/32 > 2.5%: no 95% interval from 5
    assert median_ci(list(range(8))) == (0.0, 7.0)      # min and max: 99.2%
    assert median_ci(list(range(16))) == (3.0, 12.0)    # P(B(16) <= 3) = 1.06%, <= 4: 3.8%
    assert median_ci(list(range(48))) == (16.0, 31.0)
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0, 0.0, 7.0, 6.0]) == (0.0, 7.0)  # sorted first


def test_median_ci_covers_the_median_at_least_95_percent():
    rng = random.Random(7)
    for n in (8, 16, 48):
        hits = 0
        for _ in range(2000):
            lo, hi = median_ci([rng.expovariate(1.0) for _ in range(n)])   # skewed, true median ln 2
            hits += lo <= math.log(2) <= hi
        assert hits / 2000 >= 0.94, n


def test_paired_ci_pairs_by_round():
    assert paired_ci([5.0, 6, 7, 8, 9, 10], [4.0, 5, 6, 7, 8, 9]) == (1.0, 1.0)
    assert paired_ci([], []) is None


def _rounds(n, gain, jitter, seed=0):
    """Marginal samples of production and candidate over n paired rounds: per round, GEMM jitter hits both graphs'
    rounds alike (the 'alone' graph beside them cancels it), plus a per-graph jitter of its own."""
    rng = random.Random(seed)
    alone = [100.0 + rng.gauss(0, 5 * jitter) for _ in range(n)]
    prod = [a + 2.0 + rng.gauss(0, jitter) for a in alone]
    cand = [a + 2.0 - gain + rng.gauss(0, jitter) for a in alone]
    return marginal(prod, alone), marginal(cand, alone)


def test_a_small_gain_within_the_spread_resolves_with_more_replays():
    """0.5 µs saved with 0.3 µs of per-graph jitter: at 48 rounds the spread rule still calls it noise (|difference|
    < p90 - p10), the paired interval resolves it, every seed."""
    for seed in range(5):
        base, cand = _rounds(48, 0.5, 0.3, seed=seed)
        assert abs(base["median"] - cand["median"]) < max(base["spread"], cand["spread"])   # the old rule: noise
        r = BenchRow.make("16x4096", "bf16", [2.0] * 5, [1.9] * 5, 1 << 20, 4000.0)
        r.set_context(base, cand, 20.0, IN_CONTEXT)
        assert not r.noise and r.context_diff_ci_us[0] > 0 and r.speedup > 1, (seed, r.context_diff_ci_us)


def test_no_gain_stays_noise_and_a_loss_is_slower():
    for n in (8, 48):
        base, cand = _rounds(n, 0.0, 0.3, seed=5)
        r = BenchRow.make("16x4096", "bf16", [2.0] * 5, [2.0] * 5, 1 << 20, 4000.0)
        r.set_context(base, cand, 20.0, IN_CONTEXT)
        assert r.noise, n
    base, cand = _rounds(48, -0.3, 0.3, seed=5)
    r = BenchRow.make("16x4096", "bf16", [2.0] * 5, [2.0] * 5, 1 << 20, 4000.0)
    r.set_context(base, cand, 20.0, IN_CONTEXT)
    assert not r.noise and r.speedup < 1 and r.context_diff_ci_us[1] < 0
    rep = BenchReport(op="x", variant="v", device="d", l2="cold", replays=48, rows=[r])
    assert "1 slower" in rep.verdict_line()
    table = rep.table()
    assert any("paired by replay round" in line for line in table.splitlines())
    lo, hi = r.context_diff_ci_us
    assert "saved µs, 95% CI" in table and f"{lo:+.2f} .. {hi:+.2f}" in table   # the interval, beside the speedup


def test_without_paired_samples_the_spread_rule_stands():
    r = BenchRow.make("16x4096", "bf16", [2.0] * 5, [1.9] * 5, 1 << 20, 4000.0)
    r.set_context({"median": 2.0, "spread": 0.5}, {"median": 1.8, "spread": 0.5}, 20.0, IN_CONTEXT)
    assert r.context_diff_ci_us is None and r.noise
    r.set_context({"median": 2.0, "spread": 0.5, "samples": [2.0] * 5}, {"median": 1.8, "spread": 0.5,
                                                                        "samples": [1.8] * 5}, 20.0, IN_CONTEXT)
    assert r.context_diff_ci_us is None and r.noise   # 5 rounds: no 95% interval, the spread rule


def test_sites_average_each_round_so_the_rounds_stay_paired():
    def timed(p, c):
        return {"gemms": "cuBLAS / cuBLAS", "marg": {"production": marginal(p, [0.0] * len(p)),
                                                     "candidate": marginal(c, [0.0] * len(c))},
                "neighbours_us": 10.0, "floor": None, "failed": "", "floor_note": ""}
    both = combine_sites([timed([2.0, 2.2, 2.4], [1.0, 1.2, 1.4]), timed([4.0, 4.2, 4.4], [3.0, 3.0, 3.0])])
    assert both["marg"]["production"]["samples"] == pytest.approx([3.0, 3.2, 3.4])
    assert both["marg"]["candidate"]["samples"] == pytest.approx([2.0, 2.1, 2.2])


def test_an_interval_against_the_medians_ratio_is_noise_and_many_replays_do_not_overflow():
    """The speedup is production's median over the candidate's; the interval is the median of the paired differences.
    Where they disagree in sign the row is not called faster or slower. And 2,000 replays still give an interval."""
    r = BenchRow.make("16x4096", "bf16", [2.0] * 5, [2.0] * 5, 1 << 20, 4000.0)
    base = {"median": 2.0, "spread": 1.0, "samples": [1.0, 1.1, 1.2, 3.0, 3.1, 3.2, 3.3, 3.4]}
    cand = {"median": 2.1, "spread": 1.0, "samples": [0.9, 1.0, 1.1, 2.9, 3.0, 3.1, 3.2, 3.3]}
    r.set_context(base, cand, 20.0, IN_CONTEXT)
    assert r.context_diff_ci_us[0] > 0 and r.speedup < 1 and r.noise
    assert median_ci([float(i) for i in range(2000)]) is not None


def test_the_interval_column_shows_in_context_rows_only():
    ctx = BenchRow.make("16x4096", "bf16", [2.0] * 5, [1.9] * 5, 1 << 20, 4000.0)
    base, cand = _rounds(48, 0.5, 0.3, seed=1)
    ctx.set_context(base, cand, 20.0, IN_CONTEXT)
    pre = BenchRow.make("4096x4096", "bf16", [9.0] * 5, [8.0] * 5, 1 << 20, 4000.0)
    pre.set_context(base, cand, 20.0, "chained")
    assert pre.context_diff_ci_us   # kept in the JSON, not shown: the chained times decide that row
    table = BenchReport(op="x", variant="v", device="d", l2="cold", replays=48, rows=[ctx, pre]).table()
    lo, hi = pre.context_diff_ci_us
    line = next(x for x in table.splitlines() if x.startswith("4096x4096"))
    assert f"{lo:+.2f} .. {hi:+.2f}" not in line and "—" in line


def test_the_agents_timing_reads_benchs_interval():
    from astra_sglang.agents.executor import Timing

    t = Timing(shape=(16, 4096), dtype="bf16", baseline_us=2.0, candidate_us=1.9, baseline_spread=0.1,
               candidate_spread=0.1, context_base_us=2.0, context_cand_us=1.8, context_spread_us=0.5,
               timing_basis="in-context", context_diff_ci_us=[0.05, 0.3])
    assert not t.noise                                  # the old spread rule (0.2 < 0.5) would say noise
    t.context_diff_ci_us = [-0.1, 0.3]
    assert t.noise
