"""Statistics of the decode-step A/B (`astra-sglang e2e --step`), plain data in and out (numpy only).

A record is one one-batch run of one arm: {"arm", "round", "batch_size", "input_len",
"output_len", "prefill_s", "decode_s": [latency of each decode step], "tokens": [[greedy ids of
each request]]}. Per run the statistic is the median decode-step latency (SGLang's one-batch
number) and the prefill latency. Arms are compared pairwise per round (Δ_r = X_r / A_r − 1, the
rounds ABBA-ordered so drift hits both alike) and the mean Δ gets a t-interval over rounds.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .stats import first_divergence, t_interval

METRICS = {"decode_ms": "median decode step (ms)", "prefill_ms": "prefill (ms)"}


def step_schedule(arms: Sequence[str], rounds: int, warmup: int = 1) -> List[Tuple[int, str]]:
    """(round, arm): every arm once per round, the order reversed every other round (ABBA; for
    three arms ABC CBA), warm-up runs as round -1."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    out = [(-1, a) for _ in range(warmup) for a in arms]
    for r in range(rounds):
        out += [(r, a) for a in (arms if r % 2 == 0 else list(reversed(arms)))]
    return out


def run_stats(rec: dict) -> Dict[str, float]:
    d = np.asarray(rec.get("decode_s") or [], float)
    return {"decode_ms": float(np.median(d)) * 1e3 if d.size else float("nan"),
            "prefill_ms": float(rec["prefill_s"]) * 1e3,
            "decode_ms_mean": float(d.mean()) * 1e3 if d.size else float("nan"),
            "decode_steps": int(d.size)}


def _by(records: Sequence[dict]) -> Dict[Tuple[str, int, int], dict]:
    """(arm, batch_size, round) -> record (measured rounds only)."""
    return {(r["arm"], int(r["batch_size"]), int(r["round"])): r for r in records if int(r["round"]) >= 0}


def compare(records: Sequence[dict], base: str, other: str, batch_size: int, conf: float = 0.95) -> dict:
    idx = _by(records)
    rounds = sorted({k[2] for k in idx if k[1] == batch_size and k[0] in (base, other)})
    out = {"base": base, "other": other, "batch_size": batch_size, "rounds": 0}
    for m in METRICS:
        a, b, ratios = [], [], []
        for r in rounds:
            ra, rb = idx.get((base, batch_size, r)), idx.get((other, batch_size, r))
            if ra is None or rb is None:
                continue
            va, vb = run_stats(ra)[m], run_stats(rb)[m]
            if not (math.isfinite(va) and math.isfinite(vb)) or va <= 0:
                continue
            a.append(va)
            b.append(vb)
            ratios.append(vb / va - 1.0)
        mean, lo, hi = t_interval(ratios, conf) if ratios else (float("nan"),) * 3
        out[m] = {"base": float(np.mean(a)) if a else float("nan"), "other": float(np.mean(b)) if b else float("nan"),
                  "delta": mean, "lo": lo, "hi": hi, "ci_width": hi - lo if math.isfinite(hi) else float("nan"),
                  "per_round": ratios, "n": len(ratios)}
        out["rounds"] = max(out["rounds"], len(ratios))
    return out


def parity(records: Sequence[dict], x: str, y: str, batch_size: int) -> dict:
    """Greedy tokens of arms x and y in the same round, request by request."""
    idx = _by(records)
    n = same = 0
    div: List[int] = []
    for (arm, bs, r), rx in idx.items():
        if arm != x or bs != batch_size:
            continue
        ry = idx.get((y, bs, r))
        if ry is None:
            continue
        for tx, ty in zip(rx.get("tokens") or [], ry.get("tokens") or []):
            n += 1
            d = first_divergence(tx, ty)
            if d is None:
                same += 1
            else:
                div.append(d)
    return {"compared": n, "identical": same, "first_divergence": sorted(div)[:10]}


def self_parity(records: Sequence[dict], arm: str, batch_size: int) -> dict:
    """One arm's tokens across rounds (the noise floor: same inputs, same process)."""
    runs = sorted((r for r in records if r["arm"] == arm and int(r["batch_size"]) == batch_size
                   and int(r["round"]) >= 0), key=lambda r: r["round"])
    if len(runs) < 2:
        return {"compared": 0, "identical": 0, "first_divergence": []}
    ref = runs[0].get("tokens") or []
    n = same = 0
    div = []
    for r in runs[1:]:
        for tx, ty in zip(ref, r.get("tokens") or []):
            n += 1
            d = first_divergence(tx, ty)
            same += d is None
            if d is not None:
                div.append(d)
    return {"compared": n, "identical": same, "first_divergence": sorted(div)[:10]}


def summarize(records: Sequence[dict], pairs: Sequence[Tuple[str, str]],
              predicted: Optional[Dict[Tuple[str, int], dict]] = None, conf: float = 0.95) -> dict:
    """Every (base, other) pair at every batch size: Δ with CI, parity, and the prediction beside it.
    predicted: (other, batch_size) -> {"saved_us": ..., "source": ...} (from the profile)."""
    sizes = sorted({int(r["batch_size"]) for r in records})
    rows = []
    for base, other in pairs:
        for bs in sizes:
            c = compare(records, base, other, bs, conf)
            c["parity"] = parity(records, base, other, bs)
            c["parity_base_self"] = self_parity(records, base, bs)
            p = (predicted or {}).get((other, bs))
            if p is not None and math.isfinite(c["decode_ms"]["base"]):
                step_us = c["decode_ms"]["base"] * 1e3
                c["predicted"] = {k: v for k, v in p.items()}
                for key in ("saved_us", "in_context_saved_us"):
                    if p.get(key) is not None:
                        c["predicted"][key.replace("saved_us", "delta")] = -float(p[key]) / step_us
            rows.append(c)
    return {"conf": conf, "comparisons": rows}


def _pct(x: float) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"


def report_markdown(summary: dict, meta: Optional[dict] = None) -> str:
    out = ["# Decode-step A/B (astra-sglang e2e --step)\n"]
    for k, v in (meta or {}).items():
        if isinstance(v, (str, int, float)):
            out.append(f"- {k}: {v}")
    out.append("")
    conf = int(round(100 * summary["conf"]))
    out.append(f"Δ = other/base − 1, mean over rounds of the per-round ratio, {conf}% t-interval. "
               "Predicted Δ: the profile's saved kernel time over the base's measured step "
               "(bench: shipped kernel's bench speedup on the op's exclusive time; in-graph: the "
               "patched arm's profiled kernel time against the base's).\n")
    out.append("| base → other | batch | rounds | decode step base (ms) | other (ms) | Δ decode [CI] | CI width | "
               "predicted Δ bench / in-graph | prefill base (ms) | Δ prefill [CI] | greedy tokens identical |")
    out.append("|---|---:|---:|---:|---:|---|---:|---|---:|---|---|")
    for c in summary["comparisons"]:
        d, p = c["decode_ms"], c["prefill_ms"]
        pred = c.get("predicted") or {}
        pr = f"{_pct(pred.get('delta'))} / {_pct(pred.get('in_context_delta'))}" if pred else "—"
        par = c["parity"]
        ptxt = f"{par['identical']}/{par['compared']}"
        if par["first_divergence"]:
            ptxt += f" (first divergence at token {par['first_divergence'][0]})"
        out.append(f"| {c['base']} → {c['other']} | {c['batch_size']} | {d['n']} | {d['base']:.3f} | {d['other']:.3f} | "
                   f"{_pct(d['delta'])} [{_pct(d['lo'])}, {_pct(d['hi'])}] | {100 * d['ci_width']:.2f} pp | {pr} | "
                   f"{p['base']:.2f} | {_pct(p['delta'])} [{_pct(p['lo'])}, {_pct(p['hi'])}] | {ptxt} |")
    return "\n".join(out) + "\n"


def plot(summary: dict, path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    comps = summary["comparisons"]
    if not comps:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{c['other']} bs{c['batch_size']}" for c in comps]
    y = [100 * c["decode_ms"]["delta"] for c in comps]
    err = [[100 * (c["decode_ms"]["delta"] - c["decode_ms"]["lo"]) for c in comps],
           [100 * (c["decode_ms"]["hi"] - c["decode_ms"]["delta"]) for c in comps]]
    xs = np.arange(len(comps))
    ax.errorbar(xs, y, yerr=np.nan_to_num(np.array(err)), fmt="o", capsize=4, label="measured Δ (95% CI)")
    pred = [100 * (c.get("predicted") or {}).get("delta", float("nan")) for c in comps]
    ax.plot(xs, pred, "x", color="C3", markersize=9, label="predicted Δ (profile, bench speedups)")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel("decode step latency Δ (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
