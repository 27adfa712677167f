"""Tables for the agents and the terminal, and the final report (markdown, JSON, plot)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..figures import save_figure
from .executor import Timing, geomean


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.0f}%"


def timing_table(timings: Sequence[Any]) -> str:
    """Chained times always; in-context times (and the basis each speedup used) where bench has them."""
    rows = [t if isinstance(t, Timing) else Timing.from_json(t) for t in timings]
    ctx = any(t.context_base_us is not None for t in rows)
    att = any(t.attainable for t in rows)
    lines = ["| shape | dtype | production µs | candidate µs | "
             + ("in-context production / candidate µs | " if ctx else "") + "speedup | "
             + ("attainable | " if att else "") + "% of copy ceiling |",
             "|---|---|---|---|" + ("---|" if ctx else "") + "---|" + ("---|" if att else "") + "---|"]
    for t in rows:
        inctx = ""
        if ctx:
            inctx = (f"{t.context_base_us:.2f} / {t.context_cand_us:.2f} | " if t.context_base_us is not None
                     and t.context_cand_us is not None else "— | ")
        lines.append(
            f"| {'x'.join(map(str, t.shape))} | {t.dtype} | {t.baseline_us:.2f} ±{100 * t.baseline_spread:.1f}% | "
            f"{t.candidate_us:.2f} ±{100 * t.candidate_spread:.1f}% | {inctx}{t.speedup:.3f}x"
            f"{' (' + t.basis + ')' if ctx else ''}{' (noise)' if t.noise else ''} | "
            + ((f"{t.attainable:.2f}x | " if t.attainable else "— | ") if att else "") + f"{_pct(t.pct_ceiling)} |")
    if att:  # what the column means, for the agents that read this table
        lines.append("\nattainable: production's in-context time over a kernel in the same place that only waits "
                     "for its input and reads one byte; no candidate can be faster than that on the row")
    return "\n".join(lines)


def roofline_table(spec, timings: Sequence[Dict[str, Any]]) -> str:
    lines = ["| shape | dtype | bytes moved | production GB/s | kernel GB/s | kernel % of copy ceiling |",
             "|---|---|---|---|---|---|"]
    for d in timings:
        t = Timing.from_json(d)
        nbytes = spec.bytes_moved(t.shape, t.dtype)
        lines.append(
            f"| {'x'.join(map(str, t.shape))} | {t.dtype} | {nbytes / 1e6:.2f} MB | "
            f"{nbytes / t.baseline_us / 1e3:.0f} | {nbytes / t.candidate_us / 1e3:.0f} | {_pct(t.pct_ceiling)} |")
    return "\n".join(lines)


def outcome_text(rec: Dict[str, Any], limit: int = 0) -> str:
    """A round's outcome in words (from its logged status)."""
    st = rec.get("status")
    text = {
        "production": f"production kernel, {rec.get('reason', '')}",
        "no-candidate": "no candidate written",
        "compile-error": f"compile error: {(rec.get('compile') or {}).get('error', '')}",
        "wrong": f"wrong: {rec.get('reason', '')}",
        "refused": f"refused by bench: {'; '.join(rec.get('refused') or [])}",
        "correct": f"correct, {rec.get('geomean') or 0:.3f}x",
    }.get(st, str(st))
    return text[:limit] if limit else text


def rounds_table(records: Sequence[Dict[str, Any]], best_round: Optional[int] = None) -> str:
    lines = ["| round | from | change | result | geomean speedup | tokens |", "|---|---|---|---|---|---|"]
    for r in records:
        plan = r.get("plan") or {}
        change = (plan.get("change") or ("production kernel" if r["round"] == 0 else "")).replace("\n", " ")
        g = r.get("geomean")
        mark = " ← best" if best_round is not None and r["round"] == best_round else ""
        lines.append(
            f"| {r['round']} | {'' if r.get('parent') is None else r['parent']} | {change[:80]} | "
            f"{outcome_text(r, 110).replace('|', '/')} | {'' if g is None else f'{g:.3f}x'}{mark} | "
            f"{(r.get('usage') or {}).get('total_tokens', 0)} |")
    return "\n".join(lines)


def write_report(run_dir: Path, head: Dict[str, Any], records: List[Dict[str, Any]],
                 final: Dict[str, Any]) -> Dict[str, str]:
    """report.md, report.json and (with matplotlib) report.png in run_dir."""
    run_dir = Path(run_dir)
    best = final.get("best_round")
    timings = final.get("timings") or []
    md = [f"# astra-sglang optimize: {head['op']}", ""]
    u = head.get("usage") or {}
    shown = dict(head, usage=(f"{u.get('requests', 0)} model requests, {u.get('input_tokens', 0)} input + "
                              f"{u.get('output_tokens', 0)} output tokens"
                              + (f", ${u['cost_usd']:.4f}" if u.get("cost_usd") is not None else "")))
    for k in ("date", "device", "mode", "model", "rounds_done", "stop", "usage", "command"):
        if shown.get(k) is not None:
            md.append(f"- **{k.replace('_', ' ')}**: {shown[k]}")
    md += ["", "## Rounds", "", rounds_table(records, best), "", "## Best kernel", ""]
    md.append(final.get("verdict", ""))
    if timings:
        md += ["", f"Re-verified: {final.get('reverify', '')}", "",
               f"Per-shape timing ({final.get('timing_note', 'production and best kernel interleaved')}):", "",
               timing_table(timings), "",
               f"Geometric-mean speedup: **{geomean([Timing.from_json(t).speedup for t in timings]):.3f}x**"]
    for r in final.get("rejected", []):
        md.append(f"- round {r['round']} was rejected at re-verification: {r['reason']}")
    paths = {"markdown": str(run_dir / "report.md"), "json": str(run_dir / "report.json")}
    (run_dir / "report.md").write_text("\n".join(md) + "\n")
    (run_dir / "report.json").write_text(json.dumps({"head": head, "rounds": records, "final": final}, indent=1,
                                                    default=str))
    png = _plot(run_dir / "report.png", records, timings, best)
    if png:
        paths["plot"] = png
    return paths


def _plot(path: Path, records: List[Dict[str, Any]], timings: List[Dict[str, Any]], best: Optional[int]) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2 if timings else 1, figsize=(13 if timings else 6.5, 4.2), squeeze=False)
    ax = axes[0][0]
    xs, ys, colors = [], [], []
    for r in records:
        xs.append(r["round"])
        ok = r.get("status") in ("production", "correct")
        ys.append(r["geomean"] if ok else 0.0)
        colors.append("tab:green" if r["round"] == best else "tab:blue" if ok else
                      "tab:red" if r.get("status") in ("wrong", "refused") else "tab:gray")
    ax.bar(xs, ys, color=colors)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    for x, y, r in zip(xs, ys, records):
        if y == 0.0:
            ax.text(x, 0.02, str(r.get("status")), rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("round")
    ax.set_ylabel("geomean speedup over production")
    ax.set_title("rounds (green: best, red: wrong, gray: no compiled candidate)")
    if timings:
        ax2 = axes[0][1]
        ts = [Timing.from_json(t) for t in timings]
        labels = [f"{'x'.join(map(str, t.shape))}\n{t.dtype}" for t in ts]
        sp = [t.speedup for t in ts]
        err = [t.speedup * (t.baseline_spread + t.candidate_spread) for t in ts]
        ax2.bar(range(len(ts)), sp, yerr=err,
                color=["tab:olive" if t.noise else "tab:green" if t.speedup > 1 else "tab:red" for t in ts])
        ax2.axhline(1.0, color="k", lw=0.8, ls="--")
        ax2.set_xticks(range(len(ts)))
        ax2.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
        ax2.set_ylabel("speedup (best / production)")
        ax2.set_title("best kernel per shape (red: slower, olive: within spread; dots: % of copy ceiling)")
        pct = [t.pct_ceiling for t in ts]
        if any(p is not None for p in pct):
            ax3 = ax2.twinx()
            ax3.plot(range(len(ts)), [p if p is not None else float("nan") for p in pct], "k.", label="% of copy ceiling")
            ax3.set_ylabel("% of copy ceiling")
            ax3.set_ylim(0, 110)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return str(path)
