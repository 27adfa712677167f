"""Markdown summary of a checkbench GPU run directory (check JSONs, bench JSONs, ncu, sanitizer).

    python3 results/2026-11-21-h200/checkbench/summarize.py RUN_DIR > SUMMARY.md
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from astra_sglang.harness.results import BenchReport

REPO = Path(__file__).resolve().parents[2]


def _expect(name: str) -> str:
    f = REPO / "tests" / "bad_candidates" / f"{name}.cu"
    if not f.exists():
        return ""
    m = re.search(r"^// expect: (.+)$", f.read_text(), re.M)
    return m.group(1).strip() if m else ""


def main(run: Path) -> None:
    out = []
    env = run / "env.txt"
    if env.exists():
        out += ["## Environment", "", "```", env.read_text().strip(), "```", ""]
    out += ["## check", "", "| what | verdict | reason / cases | expected | seconds |", "|---|---|---|---|---|"]
    for f in sorted(run.glob("check*/*.json")):
        d = json.loads(f.read_text())
        if "ok" not in d or "details" not in d:
            if "summary" in d:  # a sanitize_run record
                out.append(f"| {f.stem} | {'PASS' if d['ok'] else 'REJECTED'} | compute-sanitizer: {d['summary']}: "
                           f"{d.get('reason', '')[:160]} | | |")
            continue
        name = f.stem if f.parent.name == "check" else f"{f.stem} ({f.parent.name})"
        exp = _expect(f.stem.replace("candidate-", "")) if f.stem.startswith("candidate-") else "pass"
        verdict = "PASS" if d["ok"] else "REJECTED"
        if d["ok"]:
            n = len({(x["shape"], x["dtype"]) for x in d["details"]})
            skipped = sum(1 for x in d.get("notes", []) if ": skipped (" in x)
            why = f"{n} shape×dtype cases, {len(d['details'])} comparisons" + (f", {skipped} skipped" if skipped else "")
        else:
            why = d["reason"].replace("|", "\\|")
        good = (exp == "pass") == d["ok"] and (d["ok"] or not exp or re.search(exp, d["reason"]) is not None)
        out.append(f"| {name} | {verdict} {'✓' if good else '✗ UNEXPECTED'} | {why[:220]} | `{exp}` | {d.get('seconds', 0):.1f} |")
    out.append("")
    for f in sorted(run.glob("bench_*.json")):
        rep = BenchReport.from_json(f)
        out += [f"## bench {f.stem[6:]}", "", f"candidate: `{rep.candidate}` sha256 {rep.candidate_sha256[:12]}" if rep.candidate
                else "production only", "", "```", rep.table(), "```", ""]
    for f in sorted(run.glob("*.ncu.json")):
        d = json.loads(f.read_text())
        out += [f"## ncu ({f.name})", ""]
        for who, res in d.get("impls", {}).items():
            for k in res.get("kernels", []):
                st = ", ".join(f"{s['reason']} {s['warps_per_issue']:.2f}" for s in k.get("top_stalls", [])[:3])
                out.append(f"- {who}: `{k['kernel'][:70]}` {k['duration_us']} µs, DRAM {k['dram_throughput_pct']}%, "
                           f"occupancy {k['achieved_occupancy_pct']}%, {k['registers_per_thread']} regs, "
                           f"spills {k['local_spills']}; stalls: {st}")
        out.append("")
    for name in ("ncu.err", "sanitize_bad.txt"):
        f = run / name
        if f.exists() and f.read_text().strip():
            out += [f"## {name}", "", "```", f.read_text().strip()[-1500:], "```", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
