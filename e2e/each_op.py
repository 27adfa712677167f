"""`e2e --each-op`: one server A/B per op, each op alone in arm B, summed up in one table and one plot.

Why: to say which op helps or hurts a server. Built for a DeepSeek-shaped server that seemed 19% slower with `--ops
all` (H200, 2026-11-27). Its first run showed every arm-B server offset from the one arm A: one op -21% TPOT, another
+13%. The offset came from SGLang's idle scheduler spinning beside the measured arm. Both arms now sleep when idle
(cli.py); run `e2e --aa` on the setup first.
Each op's own run lies in OUT/<op>/ (report.md, summary.json, results.json, server-B.log; error.txt if its server
failed); arm A is one unpatched server for all of them, so every op is compared with the same baseline.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from astra_sglang.figures import save_figure

from .stats import _pct, ab_parity

# (metric, request-level?): throughput has only the per-round paired interval; the latency metrics are read at the
# request level (every request's, or every token's, value pooled), which resolves smaller effects
COLUMNS: Tuple[Tuple[str, str, bool], ...] = (
    ("output_throughput", "output throughput", False),
    ("tpot_mean", "TPOT mean (requests)", True),
    ("itl_p10", "ITL p10 (tokens)", True),
    ("ttft_mean", "TTFT mean (requests)", True),
)


def _cell(c: Optional[dict], request_level: bool) -> str:
    if not c:
        return "—"
    if request_level:
        p, lo, hi = c.get("boot_point"), c.get("boot_lo"), c.get("boot_hi")
    else:
        p, lo, hi = c.get("rel_change"), c.get("rel_lo"), c.get("rel_hi")
    if p is None or math.isnan(p):
        return "—"
    sig = lo is not None and hi is not None and not math.isnan(lo) and (lo > 0 or hi < 0)
    txt = f"{_pct(p)} [{_pct(lo)}, {_pct(hi)}]"
    return f"**{txt}**" if sig else txt


def rows(done: Dict[str, Path]) -> List[dict]:
    """One row per (op, workload) from each op's summary.json; an op whose run failed gets its error."""
    out = []
    for op, sub in done.items():
        summ = sub / "summary.json"
        if not summ.is_file():
            err = (sub / "error.txt").read_text().strip().splitlines() if (sub / "error.txt").is_file() else []
            out.append({"op": op, "workload": "—", "error": err[0] if err else "no summary.json"})
            continue
        data = json.loads(summ.read_text())
        for w, d in data.get("workloads", {}).items():
            out.append({"op": op, "workload": w, "comparisons": d.get("comparisons", {}), "parity": ab_parity(d)})
    return out


def summary_markdown(done: Dict[str, Path], out_dir: Path, meta: Optional[dict] = None) -> str:
    rs = rows(done)
    lines = ["# e2e --each-op: each op alone in arm B, against one unpatched arm A\n"]
    for k in ("date (UTC)", "GPU", "model", "launch_server args"):
        if meta and k in meta:
            lines.append(f"- {k}: {meta[k]}")
    lines.append("\nΔ = B / A − 1 with its 95% interval; **bold** where the interval excludes 0. Output throughput: "
                 "paired rounds; the others: request level (ITL p10 moves with a cost every decode step pays). Per-op "
                 "reports: `<op>/report.md`.\n")
    lines.append("| op | workload | " + " | ".join(label for _, label, _ in COLUMNS) + " | greedy tokens |")
    lines.append("|---|---|" + "---|" * len(COLUMNS) + "---|")
    for r in rs:
        if "error" in r:
            lines.append(f"| {r['op']} | — | " + " | ".join("—" for _ in COLUMNS) + f" | failed: {r['error'][:120]} |")
            continue
        cells = [_cell(r["comparisons"].get(m), req) for m, _, req in COLUMNS]
        lines.append(f"| {r['op']} | {r['workload']} | " + " | ".join(cells) + f" | {r['parity']} |")
    png = plot(rs, out_dir / "each-op.png")
    if png:
        lines.append(f"\n![output throughput per op]({Path(png).name})")
    return "\n".join(lines) + "\n"


def plot(rs: List[dict], path: Path) -> Optional[str]:
    """Output throughput Δ with its interval, one bar per op, one panel per workload."""
    ok = [r for r in rs if "error" not in r and r["comparisons"].get("output_throughput")]
    if not ok:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(dict.fromkeys(r["workload"] for r in ok))
    fig, axes = plt.subplots(1, len(wls), figsize=(5 * len(wls), 0.45 * max(3, len(ok) // len(wls)) + 1.5),
                             squeeze=False)
    for ax, w in zip(axes[0], wls):
        sel = [r for r in ok if r["workload"] == w]
        ys = list(range(len(sel)))
        c = [r["comparisons"]["output_throughput"] for r in sel]
        mid = [100 * x["rel_change"] for x in c]
        err = [[100 * (x["rel_change"] - x["rel_lo"]) if not math.isnan(x["rel_lo"]) else 0 for x in c],
               [100 * (x["rel_hi"] - x["rel_change"]) if not math.isnan(x["rel_hi"]) else 0 for x in c]]
        colors = ["tab:green" if x["rel_lo"] > 0 else "tab:red" if x["rel_hi"] < 0 else "tab:gray" for x in c]
        ax.barh(ys, mid, xerr=err, color=colors, capsize=3)
        ax.set_yticks(ys, [r["op"] for r in sel], fontsize=8)
        ax.invert_yaxis()   # ops top to bottom in run order
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel("output throughput, B vs A (%)")
        ax.set_title(w, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return str(path)
