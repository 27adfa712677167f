"""What a patched op does to the kernel after it, in SGLang's real decode graph: arm A vs arm B.

A kernel that is faster alone can still lose in serving if the kernel after it runs slower. This was
measured on 2× H200 with Llama-3-70B layers at TP 2, batch 1: astra's fused_add_rmsnorm saved 0.6 µs
per call, and the cuBLAS GEMM after it took 5.4 µs longer. Bench's in-context timing, with its own
small consumer GEMM, did not show this.

For every covered op, this module pairs each of its kernels with the next kernel on the same stream,
in arm A's and arm B's decode traces (a cuBLAS split-K GEMM and its reduce kernel count as one call). It then
compares, per pair:
  - the op's exposed time: from its start, or from the end of the kernel before it where that is later,
    to its end;
  - the next kernel's exposed time, likewise;
  - the span from the op's exposed start to the next kernel's end (the op plus its consumer, gap
    included): the op's effect on what follows.
Δ µs/step is the change of that span, times the calls per step. Exposed, not the kernels' durations: a
kernel launched with PDL starts while the one before it still runs and waits in griddepcontrol.wait, so
its duration includes the time of the kernel before it. Counted as the op's, that wait made the op
look slower whenever its producer got slower or launched it earlier (Llama-3-8B, batch 4, H200,
2026-11-28: fused_add_rmsnorm 5.8 → 19.6 µs and +903 µs/step of spans in a step that was 17 µs
slower).

    python -m astra_sglang.e2e.neighbours PROFILE_DIR [--base A]   # a step or profile capture dir
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .attribution import SPLITK_REDUCE, Match, classify
from .trace import KernelEvent, load_trace

Pair = Tuple[float, float, float]      # (op µs, next µs, span µs)
Classifier = Callable[[KernelEvent], Match]   # the op a kernel event belongs to


def pairs(kernels: Sequence[KernelEvent], hidden_act: str = "silu", gemma: bool = False,
          of: Optional[Classifier] = None) -> Dict[Tuple[str, str], List[Pair]]:
    """(covered op, next kernel's op) -> one (op dur, next dur, span) per occurrence, stream by stream; each kernel
    classified by `of` (profile.kernel_matcher: the profile's own attribution, its projection GEMMs and Gemma-3's
    torch q/k path, known by its place in the layer), else by its name as for the model (attribution.classify: its
    activation, Gemma's norms)."""
    match = _event_classifier(hidden_act, gemma, of)
    out: Dict[Tuple[str, str], List[Pair]] = defaultdict(list)
    for calls in _stream_calls(kernels):
        for (p, p_start, p_end, _), (n, n_start, n_end, _) in zip(calls, calls[1:]):
            m = match(p)
            if m.covered:
                out[(m.op, match(n).op)].append((max(0.0, p_end - p_start), max(0.0, n_end - n_start),
                                                      n_end - p_start))
    return out


def _event_classifier(hidden_act: str, gemma: bool, of: Optional[Classifier]) -> Classifier:
    return of or (lambda k: classify(k.name, hidden_act, gemma=gemma))


def _stream_calls(kernels: Sequence[KernelEvent]) -> List[List[Tuple[KernelEvent, float, float, bool]]]:
    """Each stream's kernels as calls (_calls), in time order."""
    by_stream: Dict[int, List[KernelEvent]] = defaultdict(list)
    for k in kernels:
        if k.kind == "kernel":
            by_stream[k.stream].append(k)
    return [_calls(sorted(ks, key=lambda k: k.ts)) for ks in by_stream.values()]


def _calls(ks: Sequence[KernelEvent]) -> List[Tuple[KernelEvent, float, float, bool]]:
    """One stream's kernels, in order, as calls: (the call's first kernel, its exposed start, its end, whether it was a
    split-K GEMM).

    A kernel's exposed start is its start, or the end of every kernel before it on the stream where that is
    later. A PDL-launched kernel starts early and waits in griddepcontrol.wait; that wait is the kernel before it
    still running, and counting it again made a faster producer look like a slower op.

    cuBLAS's split-K GEMM is two kernels, the GEMM then `cublasLt::splitKreduce_kernel`. Every split-K GEMM shares
    the reduce kernel's name, so the profile cannot call it a projection. It is one call here, named by its GEMM
    kernel, so a cuBLAS projection pairs as `linear` whether cuBLAS split it or not. Otherwise astra's linear in arm
    B pairs with the norm after it, and the same calls in arm A (GEMM, reduce, norm) had no pair at all."""
    calls: List[Tuple[KernelEvent, float, float, bool]] = []
    frontier = float("-inf")
    for k in ks:
        start = max(k.ts, frontier)
        frontier = max(frontier, k.ts + k.dur)
        if calls and SPLITK_REDUCE.search(k.name) and not SPLITK_REDUCE.search(calls[-1][0].name):
            first, first_start, _, _ = calls[-1]
            calls[-1] = (first, first_start, k.ts + k.dur, True)
        else:
            calls.append((k, start, k.ts + k.dur, False))
    return calls


def producer_pairs(kernels: Sequence[KernelEvent], hidden_act: str = "silu", gemma: bool = False,
                   of: Optional[Classifier] = None) -> Dict[Tuple[str, str], List[float]]:
    """(the call before, covered op) -> the op's exposed µs per occurrence, stream by stream; a split-K GEMM before
    it is "OP (split-K)". Its last kernel, cuBLAS's reduce, releases a PDL-launched op early; one nvjet kernel does
    not: behind them a PDL and a plain launch of fused_add_rmsnorm differed by 0.6 µs and by nothing (Llama-3-8B,
    batch 64, H200, 2026-11-28, results/2026-11-28-h200/session17)."""
    match = _event_classifier(hidden_act, gemma, of)
    out: Dict[Tuple[str, str], List[float]] = defaultdict(list)
    for calls in _stream_calls(kernels):
        for (q, _, _, split), (p, p_start, p_end, _) in zip(calls, calls[1:]):
            m = match(p)
            if m.covered:
                out[(match(q).op + (" (split-K)" if split else ""), m.op)].append(max(0.0, p_end - p_start))
    return out


def producer_effects(a: Sequence[KernelEvent], b: Sequence[KernelEvent], steps: int, hidden_act: str = "silu",
                     gemma: bool = False, of: Optional[Classifier] = None) -> List[dict]:
    """One row per (call before, op) seen in either arm: the op's exposed µs behind it, A and B (None in an arm
    without it), largest |Δ per step| first. Where a launch change helps behind one producer and hurts behind
    another, the rows say which."""
    pa, pb = producer_pairs(a, hidden_act, gemma, of), producer_pairs(b, hidden_act, gemma, of)
    rows = []
    for key in sorted(set(pa) | set(pb)):
        na, nb = len(pa[key]) / max(steps, 1), len(pb[key]) / max(steps, 1)
        us = (_mean(pa[key]), _mean(pb[key]))
        rows.append({"before": key[0], "op": key[1], "calls_per_step": na, "calls_per_step_b": nb, "op_us": us,
                     "op_delta_step_us": _per_step(us[1], nb) - _per_step(us[0], na)})
    return sorted(rows, key=lambda r: -abs(r["op_delta_step_us"]))


def _mean(xs: Sequence[float]) -> Optional[float]:
    return statistics.fmean(xs) if xs else None


def _per_step(us: Optional[float], calls: float) -> float:
    """µs a step of a call kind (0 in an arm that never runs it)."""
    return 0.0 if us is None else us * calls


def consumer_effects(a: Sequence[KernelEvent], b: Sequence[KernelEvent], steps: int, hidden_act: str = "silu",
                     gemma: bool = False, of: Optional[Classifier] = None) -> List[dict]:
    """One row per (op, next op) seen in either arm, largest |Δ span per step| first. A pair one arm lacks (a fused
    op in B where A ran its members) has None for that arm's µs and counts 0 there, so the rows' Δs sum to the
    whole change: Gemma-2-9B's gemma_post_attention_norms, in B only, had been left out while its members' rows in A
    claimed their whole span as saved (a with-consumers prediction of -52.8% for a -4.3% step, H200, 2026-11-29)."""
    pa, pb = pairs(a, hidden_act, gemma, of), pairs(b, hidden_act, gemma, of)
    rows = []
    for key in sorted(set(pa) | set(pb)):
        xa, xb = pa[key], pb[key]
        mean = lambda xs, i: _mean([x[i] for x in xs])  # noqa: E731
        na, nb = len(xa) / max(steps, 1), len(xb) / max(steps, 1)
        row = {"op": key[0], "next": key[1], "calls_per_step": na, "calls_per_step_b": nb,
               "op_us": (mean(xa, 0), mean(xb, 0)), "next_us": (mean(xa, 1), mean(xb, 1)),
               "span_us": (mean(xa, 2), mean(xb, 2))}
        # per step, each arm's own count: an op that takes more calls in B (a raised bound) adds them here, and
        # the kernels it took them from leave the rows of the op they belonged to
        for name in ("op", "next", "span"):
            row[f"{name}_delta_step_us"] = _per_step(row[f"{name}_us"][1], nb) - _per_step(row[f"{name}_us"][0], na)
        rows.append(row)
    return sorted(rows, key=lambda r: -abs(r["span_delta_step_us"]))


def saved_with_consumers(rows: Sequence[dict]) -> float:
    """µs a step the patched ops save with the kernels after them: minus the change of every op's own time and of
    each next kernel that is not itself a covered op (a covered next kernel is its own row's op). Summing the
    op → next spans instead counts a covered next kernel twice: Gemma-2-9B at batch 16 (H200, 2026-11-29) read
    603 µs saved that way, 282 µs this way, for a step 287 µs faster."""
    covered = {r["op"] for r in rows}
    return -sum(r["op_delta_step_us"] + (0.0 if r["next"] in covered else r["next_delta_step_us"]) for r in rows)


def _calls_cell(r: dict) -> str:
    """Calls a step: one number, or A → B where the arms differ."""
    na, nb = r["calls_per_step"], r.get("calls_per_step_b", r["calls_per_step"])
    return f"{na:.0f}" if round(na) == round(nb) else f"{na:.0f} → {nb:.0f}"


def _us_cell(pair: Tuple[Optional[float], Optional[float]]) -> str:
    """µs A → B, "—" for an arm without the call."""
    return " → ".join("—" if x is None else f"{x:.2f}" for x in pair)


def table(rows: Sequence[dict]) -> str:
    lines = ["| op → next kernel | calls/step | op µs A → B | next µs A → B | span µs A → B | "
             "Δ op µs/step | Δ next µs/step | Δ span µs/step |", "|---|---:|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['op']} → {r['next']} | {_calls_cell(r)} | {_us_cell(r['op_us'])} | "
                     f"{_us_cell(r['next_us'])} | {_us_cell(r['span_us'])} | {r['op_delta_step_us']:+.1f} | "
                     f"{r['next_delta_step_us']:+.1f} | {r['span_delta_step_us']:+.1f} |")
    return "\n".join(lines) + "\n"


def producer_table(rows: Sequence[dict]) -> str:
    lines = ["| call before → op | calls/step | op µs A → B | Δ op µs/step |", "|---|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['before']} → {r['op']} | {_calls_cell(r)} | {_us_cell(r['op_us'])} | "
                     f"{r['op_delta_step_us']:+.1f} |")
    return "\n".join(lines) + "\n"


def decode_captures(pdir: Path) -> Dict[Tuple[str, int], dict]:
    """(arm, batch) -> its decode capture in PDIR/profile-meta.json."""
    from .profile import META

    meta = json.loads((pdir / META).read_text())
    return {(c.get("arm", "A"), int(c.get("batch_size", 0))): c for c in meta.get("captures", [])
            if c.get("stage") == "decode"}


def _shape_kernels(pdir: Path, cap: dict) -> List[KernelEvent]:
    """The kernels of a capture's eager shapes trace (its launching ops' shapes recorded), if it has one."""
    t = cap.get("shapes_trace")
    return load_trace(pdir / t).kernels if t and (pdir / t).is_file() else []


def compare_dir(pdir: Path, base: str = "A") -> List[dict]:
    """Every (arm, batch) with a decode trace beside the base arm's: its consumer-effect rows. Kernels are
    classified as the profile classifies them (profile.op_classifier over both arms' eager shapes traces)."""
    from .profile import META, attributors, linear_bounds

    pdir = Path(pdir)
    caps = decode_captures(pdir)
    meta = json.loads((pdir / META).read_text())
    cfg = meta.get("config") or {}
    bounds = linear_bounds(meta)   # as the profile attributes the arms' GEMMs
    out = []
    for (arm, bs), c in sorted(caps.items()):
        b0 = caps.get((base, bs))
        if arm == base or b0 is None or arm.startswith(base + "-"):
            continue
        if not ((pdir / b0["trace"]).is_file() and (pdir / c["trace"]).is_file()):
            continue
        eager = (_shape_kernels(pdir, b0), _shape_kernels(pdir, c))
        ka, kb = load_trace(pdir / b0["trace"]).kernels, load_trace(pdir / c["trace"]).kernels
        _, of = attributors(cfg, (ka, kb), eager, bounds)   # as the profile attributes each kernel
        steps = int(c.get("steps", 1))
        out.append({"base": base, "arm": arm, "batch_size": bs, "rows": consumer_effects(ka, kb, steps, of=of),
                    "producers": producer_effects(ka, kb, steps, of=of)})
    return out


def report(results: Sequence[dict]) -> str:
    if not results:
        return ""
    md = ["", "### The kernel after each covered op, in the decode graph (arm A vs the patched arm)", "",
          "Δ span: the op's exposed start to the next kernel's end, per step. A kernel faster alone that slows "
          "its consumer shows here (e2e/neighbours.py). Times are exposed: a PDL-launched kernel starts while "
          "the one before it still runs, and its time here starts where that one ends, so its wait in "
          "griddepcontrol.wait is not counted twice. — marks an arm without the pair (a fused op runs in one arm, "
          "its members in the other): it counts 0 there, so the Δ columns sum to the whole change.", ""]
    for r in results:
        md += [f"**{r['base']} → {r['arm']}, batch {r['batch_size']}**", "", table(r["rows"])]
    if any(r.get("producers") for r in results):
        md += ["", "### The call before each covered op (arm A vs the patched arm)", "",
               "The op's exposed time by the call before it; a split-K GEMM (cuBLAS's GEMM and its reduce kernel) is "
               "marked. The reduce kernel releases a PDL-launched op early, one nvjet kernel does not: a launch "
               "change can help behind one and cost behind the other.", ""]
        for r in results:
            if r.get("producers"):
                md += [f"**{r['base']} → {r['arm']}, batch {r['batch_size']}**", "", producer_table(r["producers"])]
    return "\n".join(md)


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(prog="python -m astra_sglang.e2e.neighbours", description=__doc__.split("\n")[0])
    ap.add_argument("profile_dir", type=Path)
    ap.add_argument("--base", default="A")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    a = ap.parse_args(list(argv) or None)
    from .profile import META

    if not (a.profile_dir / META).is_file():
        print(f"error: {a.profile_dir}: no {META} (not a profile capture dir)", file=sys.stderr)
        return 2
    res = compare_dir(a.profile_dir, a.base)
    if not res:
        print(f"error: {a.profile_dir}: no decode capture of another arm beside arm {a.base}'s", file=sys.stderr)
        return 2
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
