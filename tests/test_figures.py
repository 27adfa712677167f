"""astra_sglang/figures.py: every stage's plots are written as palette PNGs (the tracked tree travels with each GPU
call), and bench's plot keeps its speedup bars readable when the in-context floor's bound is far above them."""
from __future__ import annotations

import io

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from astra_sglang.figures import compact_png, save_figure  # noqa: E402
from astra_sglang.harness import results as results_mod  # noqa: E402
from astra_sglang.harness.results import BenchReport, BenchRow  # noqa: E402


def _figure():
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar(range(40), [1 + (i % 7) / 10 for i in range(40)], color=[f"C{i % 10}" for i in range(40)])
    ax.set_title("speedups")
    return fig


def test_save_figure_writes_a_smaller_palette_png(tmp_path):
    fig = _figure()
    plain = io.BytesIO()
    fig.savefig(plain, format="png", dpi=110)
    p = save_figure(fig, tmp_path / "f.png")
    plt.close(fig)
    with Image.open(p) as im:
        assert im.format == "PNG" and im.mode == "P"
        assert im.size == Image.open(io.BytesIO(plain.getvalue())).size
    assert p.stat().st_size < len(plain.getvalue())


def test_compact_png_never_grows_a_file():
    buf = io.BytesIO()
    Image.new("P", (4, 4)).save(buf, format="PNG")
    assert len(compact_png(buf.getvalue())) <= len(buf.getvalue())


def _row(shape, speedup, headroom):
    r = BenchRow.make(shape, "bf16", [speedup * 10.0] * 4, [10.0] * 4, 1 << 20, 3000.0)
    r.context_base_us, r.context_cand_us = speedup * 10.0, 10.0
    r.context_floor_us, r.context_floor_spread_us = speedup * 10.0 / headroom, 0.01
    return r


def test_bench_plot_puts_far_attainable_marks_on_the_top_edge(tmp_path, monkeypatch):
    """linear's decode plot (2026-11-28): attainable 20-80x over a 1 µs floor flattened 1.0-1.2x bars to nothing."""
    seen = {}

    def keep(fig, path):
        seen["ylim"] = fig.axes[0].get_ylim()
        seen["labels"] = [t.get_text() for t in fig.axes[0].texts]
        return save_figure(fig, path)

    monkeypatch.setattr(results_mod, "save_figure", keep)
    rep = BenchReport(op="linear", rows=[_row("1x4096x6144", 1.2, 40.0), _row("2x4096x6144", 1.1, 1.5)])
    assert rep.rows[0].headroom == pytest.approx(40.0)
    rep.plot(tmp_path / "far.png")
    assert seen["ylim"][1] == pytest.approx(1.2 * 1.6) and seen["labels"] == ["40x"]
    near = BenchReport(op="linear", rows=[_row("1x4096x6144", 1.2, 1.5)])
    near.plot(tmp_path / "near.png")
    assert seen["ylim"][1] > 1.5 and seen["labels"] == []  # a bound near the bars stays a mark among them
