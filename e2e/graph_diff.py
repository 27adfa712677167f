"""What moved in the decode graph between arm A and each patched arm, by the profile's rows (an op, a torch kernel
family, attention, the GEMMs, ...): kernels and µs a step.

The in-graph prediction counts the covered ops' own kernels, and the neighbours tables the kernel right after each.
A patch can also add or remove kernels elsewhere: gemma_qknorm_rope's strided q made SGLang's fa3 backend copy it
once a layer (48 kernels, 108 µs of a 6.65 ms Gemma-3-12B step at batch 2, H200, 2026-11-30), which showed in no
prediction, only in the "torch elementwise/copy" row's calls. So every row that moved is listed here."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

# a row moved when its calls a step changed, or its time by at least this much (GEMM and attention rows differ by
# ~1% between two processes of the same arm: their small moves are that, not the patch)
MIN_US = 1.0
TOP = 10   # rows a table shows, largest move first


def diff(analysis: dict, base: str = "A") -> List[dict]:
    """[{base, arm, batch_size, kernels: (base, arm), us: (base, arm), rows: [{row, calls: (..), us: (..)}]}] for
    every decode capture of a non-base arm with a base capture at its batch size (profile.analyze_dir's output)."""
    dec: Dict[Tuple[str, int], dict] = {(c["arm"], c["batch_size"]): c for c in analysis.get("captures", ())
                                        if c.get("stage") == "decode"}
    out = []
    for (arm, bs), c in sorted(dec.items()):
        b0 = dec.get((base, bs))
        if arm == base or b0 is None:
            continue
        ra, rb = ({r["op"]: r for r in x.get("ops", ())} for x in (b0, c))
        rows = []
        for name in set(ra) | set(rb):
            calls = tuple(float(r.get(name, {}).get("calls_per_step", 0.0)) for r in (ra, rb))
            us = tuple(float(r.get(name, {}).get("us_per_step", 0.0)) for r in (ra, rb))
            if abs(calls[1] - calls[0]) >= 0.5 or abs(us[1] - us[0]) >= MIN_US:
                rows.append({"row": name, "calls": calls, "us": us})
        rows.sort(key=lambda r: (-abs(r["us"][1] - r["us"][0]), r["row"]))
        out.append({"base": base, "arm": arm, "batch_size": bs,
                    "kernels": (float(b0["n_kernels_per_step"]), float(c["n_kernels_per_step"])),
                    "us": (float(b0["kernel_us_per_step"]), float(c["kernel_us_per_step"])), "rows": rows})
    return out


def _n(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def report(diffs: Sequence[dict]) -> str:
    """The markdown section of the step report ('' without a pair of decode captures)."""
    if not diffs:
        return ""
    md = ("\n### What moved in the decode graph (arm A vs the patched arm, by profile row)\n\n"
          f"Each row of the profile whose kernels a step changed, or whose time moved by {MIN_US:g} µs a step or more, "
          f"largest move first ({TOP} at most). A row that is no covered op (a torch copy, a cast) shows what a "
          "patch made SGLang add or drop around it; GEMM and attention rows move ~1% between processes anyway.\n")
    for d in diffs:
        (ka, kb), (ua, ub) = d["kernels"], d["us"]
        md += (f"\n**{d['base']} → {d['arm']}, batch {d['batch_size']}**: {_n(ka)} → {_n(kb)} kernels a step "
               f"({kb - ka:+.0f}), {ua:.1f} → {ub:.1f} µs of kernels ({ub - ua:+.1f})\n\n")
        if not d["rows"]:
            md += "No row moved.\n"
            continue
        md += "| row | kernels/step | µs/step | Δ µs/step |\n|---|---|---|---:|\n"
        for r in d["rows"][:TOP]:
            (ca, cb), (xa, xb) = r["calls"], r["us"]
            md += f"| {r['row']} | {_n(ca)} → {_n(cb)} | {xa:.1f} → {xb:.1f} | {xb - xa:+.1f} |\n"
        if len(d["rows"]) > TOP:
            md += f"\n{len(d['rows']) - TOP} more rows moved less.\n"
    return md
