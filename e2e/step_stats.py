"""Statistics of the decode-step A/B (`astra-sglang e2e --step`), plain data in and out (numpy only).

A record is one one-batch run of one worker process: {"arm", "proc" ("A-p1"), "proc_index" (1..),
"round", "batch_size", "prefill_s", "gpu_step_s": [GPU time of each decode step: CUDA events
around its graph replay], "skip_steps", "decode_wall_s", "decode_steps", "tokens": [[greedy ids
of each request]]}. Records of the 2026-11-23 driver (one process per arm, host-timed
"decode_s" per step, no "proc") still analyze, by the old per-round method.

Per run the value is the interquartile mean of the GPU step times after `skip_steps` (the median
would sit on a cluster's edge when an MoE model's steps alternate between two levels). Each
process's value is the mean over its rounds of log(run value). Δ = exp(mean of the other arm's
process means − mean of the base arm's) − 1, and the 95% CI is a two-sample t-interval on the
per-process means (df = n_base + n_other − 2): the process is the random effect, so a process that
runs persistently fast or slow widens the interval instead of shifting Δ. With one process per
arm that variance cannot be estimated; those comparisons fall back to the per-round paired
t-interval and say so.

Noise floor: the half-width of the A/A interval at the same batch size (this run's A→A2, or an
earlier --aa run's summary.json). A Δ is "resolved" only when its CI excludes zero and |Δ| exceeds
the floor; with one process per arm and no floor, a Δ whose CI excludes zero is "within one process pair"
(the process effect is not in that interval).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from astra_sglang.figures import save_figure

from .stats import first_divergence, noise_floor, resolved, t_interval, t_ppf

METRICS = {"gpu_ms": "GPU decode step (ms)", "decode_ms": "host decode step (ms)", "prefill_ms": "prefill (ms)"}
UNPATCHED = ("A", "A2")


# ----------------------------------------------------------------------------- schedule

def process_schedule(arms: Sequence[str], procs: Union[int, Sequence[int]], rounds: int,
                     warmup: int = 1) -> List[Tuple[int, str, int]]:
    """(round, arm, process index). In a round the arms' processes alternate in ABBA blocks
    (A1 B1 B2 A2 A3 B3 ...); every other round runs the whole order reversed, so over two rounds
    every process sits at the same mean position. Warm-up rounds are round -1."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    idx = list(range(1, procs + 1)) if isinstance(procs, int) else list(procs)
    if not idx or not arms:
        raise ValueError("need at least one arm and one process")
    order: List[Tuple[str, int]] = []
    for k, i in enumerate(idx):
        order += [(a, i) for a in (arms if k % 2 == 0 else list(reversed(arms)))]
    out = [(-1, a, i) for _ in range(warmup) for a, i in order]
    for r in range(rounds):
        out += [(r, a, i) for a, i in (order if r % 2 == 0 else list(reversed(order)))]
    return out


def step_schedule(arms: Sequence[str], rounds: int, warmup: int = 1) -> List[Tuple[int, str]]:
    """One process per arm: (round, arm), ABBA (three arms: ABC CBA)."""
    return [(r, a) for r, a, _ in process_schedule(arms, 1, rounds, warmup)]


def waves(procs: int, at_once: int) -> List[List[int]]:
    """Process indices started together: all at once, or in waves when the GPU holds fewer."""
    if procs < 1 or at_once < 1:
        raise ValueError("procs and procs at once must be >= 1")
    return [list(range(s + 1, min(s + at_once, procs) + 1)) for s in range(0, procs, at_once)]


# ----------------------------------------------------------------------------- one run

def iqm(x: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle half."""
    a = np.sort(np.asarray(x, float))
    if a.size == 0:
        return float("nan")
    q = a.size // 4
    return float(a[q:a.size - q].mean())


def run_stats(rec: dict) -> Dict[str, float]:
    g = np.asarray(rec.get("gpu_step_s") or [], float)
    skip = int(rec.get("skip_steps", 0) or 0)
    if g.size > skip:
        g = g[skip:]
    out = {"gpu_ms": iqm(g) * 1e3 if g.size else float("nan"),
           "gpu_median_ms": float(np.median(g)) * 1e3 if g.size else float("nan"),
           "prefill_ms": float(rec["prefill_s"]) * 1e3}
    d = np.asarray(rec.get("decode_s") or [], float)
    if d.size:                                    # 2026-11-23 records: synchronized host timing per step
        out["decode_ms"] = float(np.median(d)) * 1e3
    elif rec.get("decode_wall_s") and rec.get("decode_steps"):
        out["decode_ms"] = float(rec["decode_wall_s"]) / int(rec["decode_steps"]) * 1e3
    else:
        out["decode_ms"] = float("nan")
    out["decode_steps"] = int(g.size or d.size)
    return out


def primary_metric(records: Sequence[dict]) -> str:
    return "gpu_ms" if any(r.get("gpu_step_s") for r in records) else "decode_ms"


def _proc(rec: dict) -> str:
    return rec.get("proc") or rec["arm"]


def _pidx(rec: dict) -> int:
    return int(rec.get("proc_index") or 1)


# ----------------------------------------------------------------------------- comparisons

def _values(records: Sequence[dict], arm: str, batch_size: int, metric: str) -> Dict[str, Dict[int, float]]:
    """proc -> {round: log(value)} of one arm's measured runs."""
    out: Dict[str, Dict[int, float]] = {}
    for r in records:
        if r["arm"] != arm or int(r["batch_size"]) != batch_size or int(r["round"]) < 0:
            continue
        v = run_stats(r)[metric]
        if math.isfinite(v) and v > 0:
            out.setdefault(_proc(r), {})[int(r["round"])] = math.log(v)
    return out


def _nan_result() -> dict:
    nan = float("nan")
    return {"base": nan, "other": nan, "delta": nan, "lo": nan, "hi": nan, "half": nan, "ci_width": nan,
            "n": 0, "procs": [0, 0], "method": "none", "sd_between": nan, "sd_within": nan, "sd_process": nan}


def compare_metric(records: Sequence[dict], base: str, other: str, batch_size: int, metric: str,
                   conf: float = 0.95) -> dict:
    va, vb = _values(records, base, batch_size, metric), _values(records, other, batch_size, metric)
    res = _nan_result()
    if not va or not vb:
        return res
    ma = np.array([np.mean(list(v.values())) for v in va.values()])
    mb = np.array([np.mean(list(v.values())) for v in vb.values()])
    # within-process spread of the run values around the process mean (round to round)
    dev = [x - np.mean(list(v.values())) for vals in (va, vb) for v in vals.values() for x in v.values()]
    dof_w = sum(len(v) - 1 for vals in (va, vb) for v in vals.values())
    res["sd_within"] = float(math.sqrt(sum(d * d for d in dev) / dof_w)) if dof_w > 0 else float("nan")
    res["base"], res["other"] = float(np.exp(ma.mean())), float(np.exp(mb.mean()))
    res["procs"] = [int(ma.size), int(mb.size)]
    res["n"] = int(max(len(v) for vals in (va, vb) for v in vals.values()))
    d = float(mb.mean() - ma.mean())
    df = ma.size + mb.size - 2
    if df >= 1 and (ma.size >= 2 or mb.size >= 2):
        # process = random effect: the spread of process means (which carries the round-to-round
        # noise averaged over rounds, plus any persistent per-process offset) sets the interval
        ss_ = float(((ma - ma.mean()) ** 2).sum() + ((mb - mb.mean()) ** 2).sum())
        s = math.sqrt(ss_ / df)
        half = t_ppf(0.5 + conf / 2.0, df) * s * math.sqrt(1.0 / ma.size + 1.0 / mb.size)
        # the persistent per-process part alone (sizing runs: more rounds cannot shrink it, more processes can)
        sp2 = s * s - (res["sd_within"] ** 2 / res["n"] if math.isfinite(res["sd_within"]) else 0.0)
        res.update(method="procs", sd_between=s, sd_process=math.sqrt(max(sp2, 0.0)), lo_log=d - half, hi_log=d + half)
    else:
        # one process per arm: rounds paired, the process effect cannot enter the interval
        ra, rb = next(iter(va.values())), next(iter(vb.values()))
        diffs = [rb[k] - ra[k] for k in sorted(set(ra) & set(rb))]
        m, lo, hi = t_interval(diffs, conf) if diffs else (float("nan"),) * 3
        d = m
        res.update(method="rounds", lo_log=lo, hi_log=hi, per_round=[math.expm1(x) for x in diffs])
    res["delta"] = math.expm1(d)
    res["lo"], res["hi"] = math.expm1(res["lo_log"]), math.expm1(res["hi_log"])
    res["ci_width"] = res["hi"] - res["lo"]
    res["half"] = res["ci_width"] / 2.0
    res["per_proc"] = {p: math.expm1(float(np.mean(list(v.values())))) for vals in (va, vb) for p, v in vals.items()}
    return res


def compare(records: Sequence[dict], base: str, other: str, batch_size: int, conf: float = 0.95) -> dict:
    out = {"base": base, "other": other, "batch_size": batch_size}
    for m in METRICS:
        out[m] = compare_metric(records, base, other, batch_size, m, conf)
    out["primary"] = primary_metric([r for r in records if int(r["batch_size"]) == batch_size])
    out["rounds"] = out[out["primary"]]["n"]
    return out


def parity(records: Sequence[dict], x: str, y: str, batch_size: int) -> dict:
    """Greedy tokens of arm x's process i against arm y's process i, same round, request by request."""
    idx = {(r["arm"], _pidx(r), int(r["round"])): r for r in records
           if int(r["batch_size"]) == batch_size and int(r["round"]) >= 0}
    n = same = 0
    div: List[int] = []
    for (arm, i, rnd), rx in sorted(idx.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if arm != x:
            continue
        ry = idx.get((y, i, rnd))
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
    """Every run of one arm (all its processes, all rounds) against its first: the noise floor of parity."""
    runs = sorted((r for r in records if r["arm"] == arm and int(r["batch_size"]) == batch_size
                   and int(r["round"]) >= 0), key=lambda r: (int(r["round"]), _pidx(r)))
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


# ----------------------------------------------------------------------------- noise floor, verdict

def aa_floor(c: dict) -> Optional[dict]:
    """The floor an A/A comparison sets: its CI half-width; when its CI excludes zero (the
    instrument is biased at that batch size) the interval's far edge instead."""
    d = c[c["primary"]]
    if not math.isfinite(d.get("half", float("nan"))):
        return None
    floor, biased = noise_floor(d["lo"], d["hi"])
    return {"floor": floor, "aa_biased": biased, "aa_delta": d["delta"], "aa_half": d["half"]}


def floors_from_summary(summary: dict, source: str) -> Dict[int, dict]:
    """batch size -> floor, from the A/A rows of an earlier summary.json."""
    out = {}
    for c in summary.get("comparisons", []):
        if c.get("aa") or (c["base"] in UNPATCHED and c["other"] in UNPATCHED):
            f = aa_floor(c)
            if f is not None:
                out[int(c["batch_size"])] = {**f, "source": source}
    return out


def verdict(c: dict) -> str:
    d = c[c["primary"]]
    if not math.isfinite(d.get("half", float("nan"))):
        return "no interval"
    if c.get("aa"):
        return "A/A offset (CI excludes 0)" if d["lo"] > 0 or d["hi"] < 0 else "A/A"
    floor = (c.get("floor") or {}).get("floor")
    if resolved(d["delta"], d["lo"], d["hi"], floor):
        way = "faster" if d["delta"] < 0 else "slower"
        if d.get("method") == "rounds" and floor is None:
            # one process per arm, no A/A floor: the interval is over rounds inside two processes, and two identical
            # processes differ persistently (arms running the same kernels read -0.84% / +0.47% at batch 1 / 16,
            # Gemma-3-12B, H200, results/2026-11-29-h200/session22/ section 2)
            return "within one process pair: " + way
        return "resolved: " + way
    return "not resolved"


def summarize(records: Sequence[dict], pairs: Sequence[Tuple[str, str]],
              predicted: Optional[Dict[Tuple[str, int], dict]] = None, conf: float = 0.95,
              unpatched: Sequence[str] = UNPATCHED, floors: Optional[Dict[int, dict]] = None) -> dict:
    """Every (base, other) pair at every batch size: Δ with CI, the noise floor and the verdict,
    parity, the prediction beside it. predicted: (other, batch_size) -> {"saved_us", ...}.
    floors: batch size -> floor from an earlier A/A run (this run's own A/A rows take precedence)."""
    sizes = sorted({int(r["batch_size"]) for r in records})
    rows = []
    for base, other in pairs:
        for bs in sizes:
            c = compare(records, base, other, bs, conf)
            c["aa"] = base in unpatched and other in unpatched
            c["parity"] = parity(records, base, other, bs)
            c["parity_base_self"] = self_parity(records, base, bs)
            p = (predicted or {}).get((other, bs))
            step = c[c["primary"]]["base"]
            if p is not None and math.isfinite(step):
                c["predicted"] = dict(p)
                for key in ("saved_us", "in_context_saved_us", "consumer_saved_us"):
                    if p.get(key) is not None:
                        c["predicted"][key.replace("saved_us", "delta")] = -float(p[key]) / (step * 1e3)
            rows.append(c)
    own = {c["batch_size"]: aa_floor(c) for c in rows if c["aa"]}
    for c in rows:
        f = own.get(c["batch_size"])
        if f is not None:
            c["floor"] = {**f, "source": "A/A in this run"}
        elif floors and c["batch_size"] in floors:
            c["floor"] = floors[c["batch_size"]]
        else:
            c["floor"] = None
        c["verdict"] = verdict(c)
    return {"conf": conf, "primary": primary_metric(records), "comparisons": rows}


# ----------------------------------------------------------------------------- report

def _pct(x: Optional[float]) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"


def _pp(x: Optional[float]) -> str:
    return "—" if x is None or not math.isfinite(x) else f"±{100 * x:.2f}%"


def method_text(summary: dict) -> str:
    conf = int(round(100 * summary["conf"]))
    rows = summary["comparisons"]
    how = {c[c["primary"]]["method"] for c in rows}
    txt = ("Δ = other/base − 1 of the **GPU decode step**: CUDA events around each decode step's graph "
           "replay (a spin kernel queued before each start event keeps host launch latency out), "
           "interquartile mean over a run's steps (the first ones dropped), warm-up rounds dropped. "
           if summary.get("primary") == "gpu_ms" else
           "Δ = other/base − 1 of the host-timed decode step (median per run; records without GPU step times). ")
    if "procs" in how:
        txt += (f"Each process's geometric mean over rounds; Δ from the arms' means of process means; {conf}% CI: "
                "two-sample t on the per-process means (process as a random effect, df = n_base + n_other − 2). ")
    if "rounds" in how:
        txt += (f"Rows with one process per arm: {conf}% t-interval over per-round paired ratios; the process "
                "effect is NOT in that interval (two identical processes can differ persistently): without an A/A "
                "floor such a Δ is \"within one process pair\", not resolved. ")
    txt += ("Noise floor: the A/A CI half-width at that batch size (its far edge when the A/A CI excludes 0); "
            "a Δ is resolved only when its CI excludes 0 and |Δ| exceeds the floor. Profiling, if any, ran "
            "only after every timed round.")
    return txt


def report_markdown(summary: dict, meta: Optional[dict] = None) -> str:
    out = ["# Decode-step A/B (astra-sglang e2e --step)\n"]
    for k, v in (meta or {}).items():
        if isinstance(v, (str, int, float)):
            out.append(f"- {k}: {v}")
    out.append("")
    out.append(method_text(summary) + "\n")
    prim = summary.get("primary", "gpu_ms")
    out.append(f"| base → other | batch | procs × rounds | {METRICS[prim]} base | other | Δ [CI] | ± | noise floor | "
               "verdict | predicted Δ bench / in-graph / with consumers | Δ host step | Δ prefill | "
               "greedy tokens identical |")
    out.append("|---|---:|---:|---:|---:|---|---:|---|---|---|---|---|---|")
    for c in summary["comparisons"]:
        d = c[prim]
        pred = c.get("predicted") or {}
        pr = (f"{_pct(pred.get('delta'))} / {_pct(pred.get('in_context_delta'))} / "
              f"{_pct(pred.get('consumer_delta'))}") if pred else "—"
        par = c["parity"]
        ptxt = f"{par['identical']}/{par['compared']}"
        if par["first_divergence"]:
            ptxt += f" (first divergence at token {par['first_divergence'][0]})"
        fl = c.get("floor")
        ftxt = (_pp(fl["floor"]) + (" (A/A offset)" if fl.get("aa_biased") else "")
                + ("" if fl["source"] == "A/A in this run" else f" ({fl['source']})")) if fl else \
            f"{_pp(d['half'])} (own CI; no A/A)"
        procs = f"{d['procs'][0]}+{d['procs'][1]} × {d['n']}" if d["method"] == "procs" else f"1+1 × {d['n']}"
        host = c["decode_ms"] if prim != "decode_ms" else None
        p = c["prefill_ms"]
        # one eager, host-bound prefill per round: with one process per arm its Δ is the two processes' difference
        ptext = (f"({_pct(p['delta'])})¹" if p.get("method") == "rounds" else f"{_pct(p['delta'])} {_pp(p['half'])}")
        out.append(f"| {c['base']} → {c['other']} | {c['batch_size']} | {procs} | {d['base']:.4f} | {d['other']:.4f} | "
                   f"{_pct(d['delta'])} [{_pct(d['lo'])}, {_pct(d['hi'])}] | {_pp(d['half'])} | {ftxt} | "
                   f"{c['verdict']} | {pr} | "
                   f"{_pct(host['delta']) + ' ' + _pp(host['half']) if host else '—'} | "
                   f"{ptext} | {ptxt} |")
    out.append("")
    if any(c["prefill_ms"].get("method") == "rounds" for c in summary["comparisons"]):
        out.append("¹ Δ prefill with one process per arm is not a measure of the patch: the prefill is one eager, "
                   "host-bound call per round, so the two processes' placement decides it (the same patch, declined "
                   "on prefill, read +24.7% and −20.1% in two such runs). `--procs 2` or more puts the process "
                   "effect in its interval.\n")
    out.append("Spread of log(step time) (relative): between processes = sd of the process means within an arm; "
               "within = round to round inside one process; process effect = the persistent part, "
               "√(between² − within²/rounds). Expected A/A half-width with P processes per arm and R rounds "
               "≈ t(2P−2) · √(process² + within²/R) · √(2/P).\n")
    out.append("| base → other | batch | method | sd between processes | sd within a process | process effect |")
    out.append("|---|---:|---|---:|---:|---:|")
    for c in summary["comparisons"]:
        d = c[prim]
        out.append(f"| {c['base']} → {c['other']} | {c['batch_size']} | {d['method']} | "
                   f"{_pp(d['sd_between']).lstrip('±')} | {_pp(d['sd_within']).lstrip('±')} | "
                   f"{_pp(d.get('sd_process')).lstrip('±')} |")
    return "\n".join(out) + "\n"


def short_table(summaries: Sequence[Tuple[str, dict]]) -> str:
    """A few lines for a console: (label, summary) -> Δ, CI, floor, verdict per comparison."""
    lines = [f"{'run':<14} {'arms':<8} {'bs':>4} {'base ms':>9} {'Δ':>8} {'95% CI':>19} {'±':>7} {'floor':>7}  verdict"]
    for label, s in summaries:
        prim = s.get("primary", "gpu_ms")
        for c in s["comparisons"]:
            d = c[prim]
            fl = (c.get("floor") or {}).get("floor")
            lines.append(f"{label:<14} {c['base'] + '→' + c['other']:<8} {c['batch_size']:>4} {d['base']:>9.4f} "
                         f"{_pct(d['delta']):>8} {'[' + _pct(d['lo']) + ', ' + _pct(d['hi']) + ']':>19} "
                         f"{_pp(d['half']):>7} {_pp(fl):>7}  {c.get('verdict', '')}")
    return "\n".join(lines)


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
    prim = summary.get("primary", "gpu_ms")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{c['other']} bs{c['batch_size']}" for c in comps]
    y = [100 * c[prim]["delta"] for c in comps]
    err = [[100 * (c[prim]["delta"] - c[prim]["lo"]) for c in comps],
           [100 * (c[prim]["hi"] - c[prim]["delta"]) for c in comps]]
    xs = np.arange(len(comps))
    ax.errorbar(xs, y, yerr=np.nan_to_num(np.array(err)), fmt="o", capsize=4, label="measured Δ (95% CI)")
    fl = [100 * ((c.get("floor") or {}).get("floor") or float("nan")) for c in comps]
    ax.plot(xs, fl, "_", color="gray", markersize=14, label="noise floor (A/A half-width)")
    ax.plot(xs, [-f for f in fl], "_", color="gray", markersize=14)
    pred = [100 * (c.get("predicted") or {}).get("delta", float("nan")) for c in comps]
    ax.plot(xs, pred, "x", color="C3", markersize=9, label="predicted Δ (profile, bench speedups)")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel("GPU decode step Δ (%)" if prim == "gpu_ms" else "decode step latency Δ (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    """python -m astra_sglang.e2e.step_stats LABEL=DIR/summary.json ...: the short table."""
    import json
    import sys
    from pathlib import Path

    items = []
    for a in (argv if argv is not None else sys.argv[1:]):
        label, _, path = a.rpartition("=")
        p = Path(path)
        if p.is_dir():
            p = p / "summary.json"
        if not p.is_file():
            print(f"{label or path}: no summary.json", file=sys.stderr)
            continue
        items.append((label or p.parent.name, json.loads(p.read_text())))
    if items:
        print(short_table(items))
    return 0 if items else 1


if __name__ == "__main__":
    raise SystemExit(main())
