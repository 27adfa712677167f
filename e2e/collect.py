"""`e2e --collect DIR ...`: several server A/Bs (one model each) in one table and one plot, each judged against its
own A/A.

Why: the serving claim is a set of A/Bs, one model and run each (results/2026-11-27-h200 §7: four models, two
workloads). Each run's report.md has its own floor table; a reader comparing models had to open every one.
A run folder is an `e2e --out` dir: summary.json (the A/B), and summary-aa.json when it ran `--calibrate`. Without
one, `--aa-floor` gives a single A/A for every run, and a run with neither reads "no A/A". Labels are the folder
names, or LABEL=DIR.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from astra_sglang.errors import AstraError
from astra_sglang.figures import save_figure

from .stats import METRICS, _pct, ab_parity, judged, noise_floor

# the columns, each judged against the A/A of the same workload and metric
COLUMNS = ("output_throughput", "tpot_mean")


def parse_runs(items: Sequence[str]) -> List[Tuple[str, Path]]:
    """LABEL=DIR or DIR (label: the folder's name) -> [(label, dir)]; every dir must hold a summary.json."""
    out = []
    for it in items:
        label, sep, d = it.partition("=")
        path = Path(d if sep else it)
        label = label if sep else path.resolve().name
        if not (path / "summary.json").is_file():
            raise AstraError(f"--collect {it}: no summary.json in {path} (an `e2e --out` dir of a server A/B)")
        out.append((label, path))
    labels = [lab for lab, _ in out]
    dup = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dup:
        raise AstraError(f"--collect: the label {', '.join(dup)} names two runs (give LABEL=DIR)")
    return out


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise AstraError(f"--collect: cannot read {path} ({e})") from e


def _interval(c: Optional[dict]) -> Optional[Tuple[float, float, float]]:
    if not c or any(c.get(k) is None or math.isnan(c[k]) for k in ("rel_change", "rel_lo", "rel_hi")):
        return None
    return c["rel_change"], c["rel_lo"], c["rel_hi"]


def judge(metric: str, ab: Optional[Tuple[float, float, float]],
          aa: Optional[Tuple[float, float, float]]) -> Tuple[Optional[float], str]:
    """(floor, verdict) of one A/B Δ against its A/A, as the run's own report judges it."""
    if ab is None:
        return None, "—"
    if aa is None:
        return None, "no A/A: not judged"
    floor = noise_floor(aa[1], aa[2])[0]
    return floor, judged(metric, *ab, floor)


def rows(runs: Sequence[Tuple[str, Path]], shared_aa: Optional[dict] = None) -> List[dict]:
    """One row per (run, workload): the A/B and A/A intervals of each column, floors, verdicts, greedy parity."""
    out = []
    for label, d in runs:
        ab = _load(d / "summary.json")
        own = d / "summary-aa.json"
        aa = _load(own) if own.is_file() else shared_aa
        for w, wd in ab.get("workloads", {}).items():
            aw = (aa or {}).get("workloads", {}).get(w, {}).get("comparisons", {})
            row = {"run": label, "workload": w, "aa_source": "same rounds" if own.is_file() else
                   ("--aa-floor" if shared_aa is not None else "none")}
            for m in COLUMNS:
                i_ab, i_aa = _interval(wd["comparisons"].get(m)), _interval(aw.get(m))
                floor, verdict = judge(m, i_ab, i_aa)
                row[m] = {"ab": i_ab, "aa": i_aa, "floor": floor, "verdict": verdict,
                          "a": (wd["comparisons"].get(m) or {}).get("a_mean"),
                          "b": (wd["comparisons"].get(m) or {}).get("b_mean")}
            row["parity"] = ab_parity(wd)
            out.append(row)
    return out


def _iv(i: Optional[Tuple[float, float, float]]) -> str:
    return "—" if i is None else f"{_pct(i[0])} [{_pct(i[1])}, {_pct(i[2])}]"


def markdown(rs: List[dict], png: Optional[str]) -> str:
    lines = ["# e2e --collect: server A/Bs, each against its A/A\n",
             "Δ = B / A − 1 over paired rounds, with its 95% interval. The floor is the A/A's half-width, or its far "
             "edge where the A/A excludes 0; an A/B is resolved past it (as each run's report.md judges).\n"]
    head = ["run", "workload"]
    for m in COLUMNS:
        lab = METRICS[m][0]
        head += [f"{lab}, A → B", f"{lab} A/B", f"{lab} A/A", "floor", "verdict"]
    lines.append("| " + " | ".join(head + ["A/A from", "greedy tokens, A vs B"]) + " |")
    lines.append("|---|---|" + "---|---:|---:|---:|---|" * len(COLUMNS) + "---|---|")
    for r in rs:
        cells = [r["run"], r["workload"]]
        for m in COLUMNS:
            c = r[m]
            ab = _iv(c["ab"])
            ab = f"**{ab}**" if c["verdict"].startswith("resolved") else ab
            a_b = "—" if c["a"] is None else f"{c['a']:,.4g} → {c['b']:,.4g} {METRICS[m][1]}"
            cells += [a_b, ab, _iv(c["aa"]), "—" if c["floor"] is None else f"{c['floor'] * 100:.2f}%", c["verdict"]]
        lines.append("| " + " | ".join(cells + [r["aa_source"], r["parity"]]) + " |")
    if png:
        lines.append(f"\n![A/B and A/A per run]({Path(png).name})")
    return "\n".join(lines) + "\n"


def plot(rs: List[dict], path: Path, metric: str = "output_throughput") -> Optional[str]:
    """One panel per workload: each run's A/B Δ (bar, with its interval) and its A/A (grey, below it)."""
    ok = [r for r in rs if r[metric]["ab"] is not None]
    if not ok:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(dict.fromkeys(r["workload"] for r in ok))
    n = max(sum(1 for r in ok if r["workload"] == w) for w in wls)
    fig, axes = plt.subplots(1, len(wls), figsize=(5 * len(wls), 0.7 * n + 1.6), squeeze=False)
    for ax, w in zip(axes[0], wls):
        sel = [r for r in ok if r["workload"] == w]
        for y, r in enumerate(sel):
            c = r[metric]
            p, lo, hi = (100 * v for v in c["ab"])
            color = ("tab:green" if c["verdict"] == "resolved: B better" else
                     "tab:red" if c["verdict"] == "resolved: B worse" else "tab:gray")
            ax.barh(y, p, height=0.45, xerr=[[p - lo], [hi - p]], color=color, capsize=3)
            if c["aa"] is not None:
                q, qlo, qhi = (100 * v for v in c["aa"])
                ax.errorbar(q, y + 0.33, xerr=[[q - qlo], [qhi - q]], fmt="o", color="dimgray", ms=3, capsize=2)
        ax.set_yticks(range(len(sel)), [r["run"] for r in sel], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel(f"{METRICS[metric][0]}, B vs A (%); grey dot: A/A")
        ax.set_title(w, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return str(path)


def collect(items: Sequence[str], out_dir: Path, aa_floor: Optional[Path] = None) -> str:
    """Write OUT/collect.md, collect.json and collect.png; -> the markdown."""
    runs = parse_runs(items)
    shared = None
    if aa_floor is not None:
        from .cli import served_floor

        shared = served_floor(aa_floor)
    rs = rows(runs, shared)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "collect.json").write_text(json.dumps(rs, indent=1))
    try:
        png = plot(rs, out_dir / "collect.png")
    except ImportError:   # matplotlib is optional ([plot])
        png = None
    md = markdown(rs, png)
    (out_dir / "collect.md").write_text(md)
    return md
