"""e2e/graph_diff.py: every profile row that moved between arm A and a patched arm's decode graph, on synthetic
analyses and on the real Gemma-3-12B record where the strided q's copies showed nowhere else."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

from astra_sglang.e2e import graph_diff as g

ROOT = Path(__file__).resolve().parents[1]
QOUT = ROOT / "results/2026-11-30-h200/session26/b/step-gemma3-12b-qout/profile/profile.json.xz"


def _cap(arm, bs, ops, stage="decode"):
    return {"arm": arm, "batch_size": bs, "stage": stage, "n_kernels_per_step": sum(o[1] for o in ops),
            "kernel_us_per_step": sum(o[2] for o in ops),
            "ops": [{"op": n, "calls_per_step": c, "us_per_step": u} for n, c, u in ops]}


def test_rows_that_moved_largest_first_and_rows_only_one_arm_has():
    a = _cap("A", 2, [("linear", 144, 2605.0), ("torch elementwise/copy", 76, 148.0), ("attention", 137, 584.0),
                      ("rope", 48, 60.0)])
    b = _cap("B", 2, [("linear", 144, 2605.4), ("torch elementwise/copy", 28, 40.0), ("attention", 137, 576.0),
                      ("gemma_qknorm_rope", 48, 74.0)])
    (d,) = g.diff({"captures": [a, b, _cap("A", 2, [("x", 1, 1.0)], stage="prefill")]})
    assert (d["arm"], d["batch_size"], d["kernels"]) == ("B", 2, (405.0, 357.0))
    # linear moved 0.4 µs with the same calls: not listed; a row in one arm only counts as 0 in the other
    assert [r["row"] for r in d["rows"]] == ["torch elementwise/copy", "gemma_qknorm_rope", "rope", "attention"]
    assert d["rows"][1]["calls"] == (0.0, 48.0) and d["rows"][2]["us"] == (60.0, 0.0)
    md = g.report([d])
    assert "405 → 357 kernels a step (-48)" in md
    assert "| torch elementwise/copy | 76 → 28 | 148.0 → 40.0 | -108.0 |" in md


def test_calls_alone_count_and_nothing_without_a_base_capture():
    a = _cap("A", 1, [("silu_and_mul", 32, 50.0)])
    b = _cap("B", 1, [("silu_and_mul", 33, 50.2)])
    (d,) = g.diff({"captures": [a, b, _cap("B", 8, [("x", 1, 1.0)])]})   # batch 8 has no arm A: no pair
    assert [r["row"] for r in d["rows"]] == ["silu_and_mul"]
    assert "No row moved." in g.report(g.diff({"captures": [a, _cap("B", 1, [("silu_and_mul", 32, 50.5)])]}))
    assert g.report(g.diff({"captures": [a]})) == "" and g.diff({}) == []


def test_table_shows_at_most_top_rows():
    a = _cap("A", 1, [(f"op{i}", 1, 10.0 + i) for i in range(g.TOP + 3)])
    b = _cap("B", 1, [(f"op{i}", 1, 20.0 + 2 * i) for i in range(g.TOP + 3)])
    md = g.report(g.diff({"captures": [a, b]}))
    assert md.count("\n| op") == g.TOP and "3 more rows moved less." in md


def test_the_real_record_shows_the_copies_q_out_removed():
    """Gemma-3-12B, q in place (A) against q into its own buffer (B), H200: fa3's q.contiguous() copies, 48 a step
    from batch 2 on, are the largest move; at batch 1 (a contiguous view, no copy) the kernel count is unchanged."""
    with lzma.open(QOUT, "rt") as f:
        diffs = {d["batch_size"]: d for d in g.diff(json.load(f))}
    assert diffs[1]["kernels"][0] == diffs[1]["kernels"][1]
    for bs in (2, 16):
        top = diffs[bs]["rows"][0]
        assert top["row"] == "torch elementwise/copy" and top["calls"][0] - top["calls"][1] == 48
        assert diffs[bs]["kernels"][0] - diffs[bs]["kernels"][1] == 48
