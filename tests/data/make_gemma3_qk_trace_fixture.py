"""Trim real Gemma-3-12B decode traces to the small fixture in tests/data/gemma3_qk_real/.

Source: results/2026-11-30-h200/session25/b/step-gemma3-12b-qk/ (its profile/ dir; the traces themselves were not
kept there): H200, SGLang 0.5.17, Gemma-3-12B (48 layers, dummy weights), decode at batch 1, 2026-11-30, from
`astra-sglang e2e --step --model-path gemma3-12b --base-ops=all,-gemma_qknorm_rope --ops=all ...`: arm A runs every
astra op but gemma_qknorm_rope (SGLang's torch q/k norm + rope path runs), arm B every astra op.
Regenerate (needs that run's profile dir with its *.trace.json.gz):

    python tests/data/make_gemma3_qk_trace_fixture.py PROFILE_DIR [--out tests/data/gemma3_qk_real] [--check]

What is kept, per arm (batch 1 decode): the first STEPS steps of the CUDA-graph replay trace and the eager step with
shapes. Within each step, everything from layer KEEP's KV store up to layer 47's KV store is dropped, i.e. the step
keeps its own prologue (input prep, embedding, rotary cos/sin), layers 0..KEEP-1 whole, layer KEEP's first part
(norm, qkv GEMM, q/k path) joined to layer 47's second part (KV store, attention, MLP), and its epilogue (final norm,
lm_head, sampling). The KV store (store_kvcache) is cut at because every layer has exactly one, in both arms, and
its q/k path ends right before it: every kept q/k path keeps the real kernels on both sides of it. Timestamps are
the real ones (the dropped layers leave a gap). Only what e2e/trace.py reads is kept: device events with their
stream / device / correlation, the launches (cuda_runtime / cuda_driver) of kept kernels, the torch ops (cpu_op)
with "Input Dims" that enclose those launches, and the step annotations; other args are dropped. Stdlib only
(--check imports the repository's profile to compare the fixture's attribution with the whole traces').
"""
from __future__ import annotations

import argparse
import gzip
import json
import lzma
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = 2          # whole layers kept per step; layer KEEP keeps its q/k path too
STEPS = 2         # graph replays kept (the profile divides by the capture's "steps")
LAYERS = 48       # Gemma-3-12B
STORE = "store_kvcache"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
KERNEL_ARGS = ("stream", "device", "correlation")
# the captures the fixture holds: (arm, graph trace, eager trace)
CAPTURES = [(arm, f"{arm}-bs1-decode.trace.json", f"{arm}-bs1-decode-eager.trace.json") for arm in ("A", "B")]


def _load(path: Path) -> dict:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


def _find(directory: Path, name: str) -> Path:
    for p in (directory / (name + ".gz"), directory / name):
        if p.is_file():
            return p
    raise SystemExit(f"{directory}: no {name}[.gz]")


def trim(data: dict, steps: int, keep_steps: int, keep: int = KEEP) -> dict:
    """The trace's first `keep_steps` of its `steps` steps, each without layers keep..LAYERS-2's second half and the
    next layer's first half (the span from layer keep's KV store to layer LAYERS-1's)."""
    events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    # a step, as the profile counts it, is 1/steps of the trace (it divides by the capture's steps); the replays are
    # identical, so step s is the s-th period of the kernel sequence (input prep, graph, sampling). The host's
    # step[...] annotations do not cover the input prep and the sampling, so they cannot cut it.
    period, rest = divmod(len(device), steps)
    names = [k["name"] for k in device]
    if rest or any(names[s * period:(s + 1) * period] != names[:period] for s in range(steps)):
        raise SystemExit(f"{len(device)} device events are not {steps} identical steps")
    kept = []
    for s in range(keep_steps):
        ks = device[s * period:(s + 1) * period]
        stores = [i for i, k in enumerate(ks) if STORE in k["name"]]
        if len(stores) != LAYERS:
            raise SystemExit(f"step {s}: {len(stores)} KV stores, {LAYERS} expected")
        kept += ks[:stores[keep]] + ks[stores[LAYERS - 1]:]
    corr = {k["args"].get("correlation") for k in kept}
    launches = [e for e in events if e.get("cat") in LAUNCH_CATS and (e.get("args") or {}).get("correlation") in corr]
    spans = sorted({(e.get("tid"), e["ts"]) for e in launches})
    # the torch ops whose shapes e2e/trace.py can attach: those with Input Dims around a kept launch, on its thread
    ops = [e for e in events if e.get("cat") == "cpu_op" and (e.get("args") or {}).get("Input Dims")
           and any(t == e.get("tid") and e["ts"] <= ts <= e["ts"] + e["dur"] for t, ts in spans)]
    # the step annotations (host and GPU side) of the kept steps, for a reader of the trace
    ann = [e for cat in ("user_annotation", "gpu_user_annotation")
           for e in sorted((e for e in events if e.get("cat") == cat and str(e.get("name")).startswith("step[")),
                           key=lambda e: e["ts"])[:keep_steps]]

    def slim(e, args):
        out = {k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e}
        out["args"] = {k: e["args"][k] for k in args if k in (e.get("args") or {})}
        return out

    out = [slim(e, KERNEL_ARGS) for e in kept] + [slim(e, ("correlation",)) for e in launches]
    out += [slim(e, ("Input Dims",)) for e in ops] + [slim(e, ()) for e in ann]
    out.sort(key=lambda e: e["ts"])   # the trace's own (time) order
    head = {k: data[k] for k in ("schemaVersion", "record_shapes", "displayTimeUnit", "baseTimeNanoseconds",
                                 "traceName") if k in data}
    return {**head, "traceEvents": out}


def write_fixture(profile_dir: Path, out: Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((profile_dir / "profile-meta.json").read_text())
    caps = []
    for arm, graph, eager in CAPTURES:
        (c,) = [c for c in meta["captures"] if c.get("arm") == arm and c.get("stage") == "decode"
                and c.get("batch_size") == 1]
        for name, steps, keep_steps in ((graph, int(c["steps"]), STEPS), (eager, 1, 1)):   # one eager step
            data = trim(_load(_find(profile_dir, name)), steps, keep_steps)
            with lzma.open(out / (name + ".xz"), "wt", preset=9 | lzma.PRESET_EXTREME) as f:
                json.dump(data, f, separators=(",", ":"))
        # the test decompresses the traces to NAME (plain JSON, as e2e/trace.py reads it) beside this meta
        caps.append({**c, "steps": STEPS, "trace": graph, "shapes_trace": eager,
                     "extra": {"kept_layers": f"0..{KEEP - 1} whole, {KEEP}'s q/k path, {LAYERS - 1}'s tail"}})
    keep = ("date (UTC)", "arms", "GPU", "tensor parallel", "tp", "arm_env", "server args (first process)", "command")
    small = {k: meta[k] for k in keep if k in meta}
    small.update(source="results/2026-11-30-h200/session25/b/step-gemma3-12b-qk (SGLang 0.5.17, dummy weights), "
                        "trimmed by tests/data/make_gemma3_qk_trace_fixture.py",
                 config=meta["config"], captures=caps)
    (out / "profile-meta.json").write_text(json.dumps(small, indent=1) + "\n")
    return sorted(out.iterdir())


def check(profile_dir: Path, out: Path) -> None:
    """Every kept kernel is attributed in the fixture as in the whole trace (the profile's kernel_matcher; needs the
    repository's package, and a minute on the whole traces): the trimming moves no kernel to another op."""
    from astra_sglang.e2e.profile import attributors
    from astra_sglang.e2e.trace import load_json, parse_chrome_trace

    cfg = json.loads((out / "profile-meta.json").read_text())["config"]

    def attributed(graph: dict, eager: dict) -> dict:
        g, e = parse_chrome_trace(graph).kernels, parse_chrome_trace(eager).kernels
        _, of = attributors(cfg, (g, e), (e,))
        return {(k.ts, k.name): (of(k).op, k.shapes) for k in g + e}

    for _, graph, eager in CAPTURES:
        whole = attributed(_load(_find(profile_dir, graph)), _load(_find(profile_dir, eager)))
        kept = attributed(load_json(out / (graph + ".xz")), load_json(out / (eager + ".xz")))
        moved = [k for k, v in kept.items() if whole.get(k) != v]
        if moved:
            raise SystemExit(f"{graph}: {len(moved)} kernels attributed otherwise than in the whole trace: {moved[:3]}")
        print(f"{graph}: {len(kept)} kept kernels attributed as in the whole trace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile_dir", type=Path, help="the step run's profile/ dir (profile-meta.json, *.trace.json.gz)")
    ap.add_argument("--out", type=Path, default=HERE / "gemma3_qk_real")
    ap.add_argument("--check", action="store_true", help="compare the fixture's attribution with the whole traces'")
    a = ap.parse_args()
    for p in write_fixture(a.profile_dir, a.out):
        print(f"{p.stat().st_size:>7} {p}")
    if a.check:
        check(a.profile_dir, a.out)


if __name__ == "__main__":
    main()
