"""Where a served decode step's time goes, arm A against arm B, from a profile of each live server.

`astra-sglang e2e --server-profile WORKLOAD` runs one extra round of that workload per arm after its measured
rounds (so the profiler never touches a timed round), with SGLang's profiler on (`POST /start_profile`, CPU and
GPU activities, `--profile-steps` scheduler steps), and compares the two traces here.

Why: a decode step can be faster alone on the GPU (what `e2e --step` times) and not in a server. The trace tells
whether the served step is the replay, other kernels, or the GPU waiting for the host. Its first use (DeepSeek-shaped,
H200, 2026-11-27) showed a host-bound server: a 1.3 ms replay in a 4.6-5.8 ms profiled step, and the two arms'
"difference" was host speed. Each decode step is one CUDA-graph replay (`cudaGraphLaunch`); its kernels carry the launch's
correlation id. Per replay:
  span    its first kernel's start to its last kernel's end (the step `e2e --step` measures),
  period  its first kernel's start to the next replay's (what a served decode step costs the GPU clock),
  other   device time of kernels outside any replay within the period (sampling, copies, prefill),
  idle    period - span - other: the GPU waiting for the host.
Medians over the replays (a prefill between two replays lengthens one period, not the median). Then every kernel
name's time per replay in A and in B, largest difference first: a slower kernel shows there, a host-bound step in
idle.
"""
from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from astra_sglang.errors import AstraError

from .trace import find_traces, load_json, parse_chrome_trace


def start(url: str, out_dir: Path, num_steps: int, activities: Sequence[str] = ("CPU", "GPU"),
          record_shapes: bool = False, timeout: float = 30.0) -> None:
    """POST /start_profile: the server profiles its next `num_steps` scheduler steps into out_dir, then stops."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"output_dir": str(out_dir), "num_steps": int(num_steps), "activities": list(activities),
                       "record_shapes": bool(record_shapes)}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/start_profile", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
    except (urllib.error.URLError, OSError) as e:
        raise AstraError(f"{url}: POST /start_profile failed ({e})") from None


def wait_traces(out_dir: Path, count: int, timeout: float, settle_s: float = 3.0) -> List[Path]:
    """The trace files the server wrote in out_dir (one per TP rank), once `count` exist or at the timeout."""
    end = time.monotonic() + timeout
    traces: List[Path] = []
    while time.monotonic() < end:
        traces = find_traces(out_dir)
        if len(traces) >= count:
            time.sleep(settle_s)   # let the writer finish
            return find_traces(out_dir)
        time.sleep(min(2.0, max(0.0, end - time.monotonic())))
    return traces


@dataclass
class DecodeProfile:
    replays: int
    span_us: float      # medians per replay (see the module doc)
    period_us: float
    other_us: float
    idle_us: float
    kernels_us: Dict[str, float] = field(default_factory=dict)  # name -> µs per replay, replay kernels only
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _union_us(intervals: List[tuple]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def decode_profile(data: dict, source: str = "") -> Optional[DecodeProfile]:
    """The graph replays of one trace (a Chrome-trace dict), or None when it holds fewer than two."""
    events = data["traceEvents"] if isinstance(data, dict) else data
    launches = {int((e.get("args") or {}).get("correlation", -1)) for e in events
                if e.get("ph") == "X" and str(e.get("name", "")).startswith("cudaGraphLaunch")}
    launches.discard(-1)
    kernels = parse_chrome_trace(data, source).kernels
    by_replay: Dict[int, list] = {}
    outside = []
    for k in kernels:
        (by_replay.setdefault(k.correlation, []) if k.correlation in launches else outside).append(k)
    replays = sorted(by_replay.values(), key=lambda ks: min(k.ts for k in ks))
    if len(replays) < 2:
        return None
    outside.sort(key=lambda k: k.ts)
    spans, periods, others, idles = [], [], [], []
    names: Dict[str, float] = {}
    for i, ks in enumerate(replays):
        t0, t1 = min(k.ts for k in ks), max(k.end for k in ks)
        spans.append(t1 - t0)
        for k in ks:
            names[k.name] = names.get(k.name, 0.0) + k.dur
        if i + 1 < len(replays):
            nxt = min(k.ts for k in replays[i + 1])
            period = nxt - t0
            between = [(max(k.ts, t1), min(k.end, nxt)) for k in outside if k.end > t1 and k.ts < nxt]
            other = _union_us([iv for iv in between if iv[1] > iv[0]])
            periods.append(period)
            others.append(other)
            idles.append(max(0.0, period - (t1 - t0) - other))
    n = len(replays)
    return DecodeProfile(n, statistics.median(spans), statistics.median(periods), statistics.median(others),
                         statistics.median(idles), {k: v / n for k, v in names.items()}, source)


def profile_of(traces: Sequence[Path]) -> Optional[DecodeProfile]:
    """The first rank's trace with graph replays (rank 0 sorts first)."""
    for t in traces:
        p = decode_profile(load_json(t), str(t))
        if p is not None:
            return p
    return None


def compare_markdown(a: Optional[DecodeProfile], b: Optional[DecodeProfile], workload: str, top: int = 12) -> str:
    lines = [f"### Served decode steps, profiled ({workload}: one extra round per arm after the measured ones)\n"]
    missing = [arm for arm, p in (("A", a), ("B", b)) if p is None]
    if missing:
        lines.append(f"No decode graph replays in arm {' or '.join(missing)}'s trace: nothing to compare.\n")
        return "\n".join(lines)
    assert a is not None and b is not None
    lines.append(f"Medians over {a.replays} (A) and {b.replays} (B) CUDA-graph replays. span: the replay on the GPU "
                 "(what `e2e --step` times); period: one replay's start to the next's; other: kernels outside the "
                 "graph in between; idle: the GPU waiting for the host. The profiler slows the host too: compare A "
                 "with B here, not with the measured rounds' ITL.\n")
    lines.append("| µs per decode step | A | B | B − A |\n|---|---:|---:|---:|")
    for label, attr in (("period", "period_us"), ("span (graph replay)", "span_us"), ("other kernels", "other_us"),
                        ("GPU idle", "idle_us")):
        va, vb = getattr(a, attr), getattr(b, attr)
        lines.append(f"| {label} | {va:.1f} | {vb:.1f} | {vb - va:+.1f} |")
    if a.idle_us > a.span_us:
        lines.append(f"\n**Host-bound.** In arm A the GPU waited for the host {a.idle_us:.0f} µs of each "
                     f"{a.period_us:.0f} µs step, longer than the replay itself ({a.span_us:.0f} µs). The profiler "
                     "slows the host, so this overstates it. But where it holds, this server's A/B cannot show a GPU "
                     "step gain of a few percent: the step A/B (`e2e --step`) measures that. (deepseek-v3-2l at "
                     "concurrency 8 on an H200, 2026-11-27, was such a server.)")
    rows = sorted(set(a.kernels_us) | set(b.kernels_us),
                  key=lambda n: -abs(b.kernels_us.get(n, 0.0) - a.kernels_us.get(n, 0.0)))[:top]
    lines.append("\nKernels in the replays, largest difference first (µs per replay, profiled durations):\n")
    lines.append("| kernel | A | B | B − A |\n|---|---:|---:|---:|")
    for n in rows:
        va, vb = a.kernels_us.get(n, 0.0), b.kernels_us.get(n, 0.0)
        lines.append(f"| `{n[:90]}` | {va:.2f} | {vb:.2f} | {vb - va:+.2f} |")
    lines.append("")
    return "\n".join(lines)


def stop(url: str, timeout: float = 60.0) -> None:
    """POST /stop_profile; SGLang answers an error once num_steps already stopped it, which is fine."""
    req = urllib.request.Request(url.rstrip("/") + "/stop_profile", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
    except (urllib.error.URLError, OSError):
        pass
