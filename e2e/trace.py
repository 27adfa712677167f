"""GPU kernel events out of a torch-profiler (Kineto) Chrome trace, and their exclusive time.

A trace is what `torch.profiler.profile(...).export_chrome_trace()` writes, or what a live SGLang
server writes under `/start_profile`'s output_dir (`*.trace.json.gz`). Only device events are
kept: kernels (cat "kernel"), memcpy and memset. For each kernel we also try to find the shapes
of the torch op that launched it (cpu_op "Input Dims", recorded with record_shapes=True): kernel
--correlation--> runtime launch event --enclosed by--> innermost cpu_op on that thread.

Programmatic dependent launch (PDL): a kernel launched with PDL may start before its producer
ends and wait inside (griddepcontrol.wait), so its profiled duration includes part of the
producer's time. `exclusive_times` therefore clips every kernel to start no earlier than the end
of everything before it on the same stream: the clipped ("exclusive") times of a stream add up to
its busy time, the overlap is charged to the producer that was still running, and the raw
duration is kept beside it.
"""
from __future__ import annotations

import bisect
import gzip
import json
import lzma
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


@dataclass
class KernelEvent:
    name: str
    ts: float            # µs, trace clock
    dur: float           # µs, as profiled
    stream: int = 0
    device: int = 0
    kind: str = "kernel"  # kernel | memcpy | memset
    correlation: int = -1
    shapes: Optional[list] = None      # "Input Dims" of the launching torch op, when recorded
    torch_op: Optional[str] = None     # that op's name
    excl: float = -1.0                 # µs after PDL/overlap clipping (exclusive_times)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelEvent":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class Trace:
    kernels: List[KernelEvent]
    source: str = ""
    meta: dict = field(default_factory=dict)


def load_json(path: Path) -> dict:
    """A JSON file as written, gzip'd (.gz) or xz'd (.xz: results/ keeps traces so, a third the size of .gz)."""
    path = Path(path)
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "rt") as f:
        return json.load(f)


def parse_chrome_trace(data: dict, source: str = "") -> Trace:
    """Device events of a Chrome trace dict, with launch shapes attached where recorded."""
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels: List[KernelEvent] = []
    runtime: Dict[int, Tuple[float, object]] = {}      # correlation -> (ts, tid)
    cpu_ops: Dict[object, List[Tuple[float, float, str, list]]] = {}   # tid -> [(ts, end, name, dims)]
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        if cat in DEVICE_CATS:
            kernels.append(KernelEvent(
                name=str(e.get("name", "")), ts=float(e.get("ts", 0.0)), dur=float(e.get("dur", 0.0)),
                stream=int(args.get("stream", e.get("tid", 0)) or 0), device=int(args.get("device", 0) or 0),
                kind=DEVICE_CATS[cat], correlation=int(args.get("correlation", -1) or -1)))
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            corr = args.get("correlation")
            if corr is not None:
                runtime[int(corr)] = (float(e.get("ts", 0.0)), e.get("tid"))
        elif cat == "cpu_op":
            dims = args.get("Input Dims")
            if dims:
                ts = float(e.get("ts", 0.0))
                cpu_ops.setdefault(e.get("tid"), []).append((ts, ts + float(e.get("dur", 0.0)),
                                                             str(e.get("name", "")), dims))
    if cpu_ops and runtime:
        _attach_shapes(kernels, runtime, cpu_ops)
    kernels.sort(key=lambda k: (k.device, k.stream, k.ts))
    return Trace(kernels, source)


def _attach_shapes(kernels, runtime, cpu_ops) -> None:
    # innermost enclosing op = the enclosing op that started last (ops nest on one thread)
    index = {tid: (sorted(ops), [o[0] for o in sorted(ops)]) for tid, ops in cpu_ops.items()}
    for k in kernels:
        hit = runtime.get(k.correlation)
        if hit is None or hit[1] not in index:
            continue
        ts, tid = hit
        ops, starts = index[tid]
        i = bisect.bisect_right(starts, ts) - 1
        while i >= 0:
            o_ts, o_end, name, dims = ops[i]
            if o_end >= ts:
                k.shapes, k.torch_op = dims, name
                break
            i -= 1


def load_trace(path: Path) -> Trace:
    return parse_chrome_trace(load_json(path), str(path))


def exclusive_times(kernels: Sequence[KernelEvent]) -> float:
    """Set each event's `excl` (see the module doc); returns the summed busy time (µs)."""
    total = 0.0
    by_stream: Dict[Tuple[int, int], List[KernelEvent]] = {}
    for k in kernels:
        by_stream.setdefault((k.device, k.stream), []).append(k)
    for evs in by_stream.values():
        evs.sort(key=lambda k: k.ts)
        horizon = float("-inf")
        for k in evs:
            start = max(k.ts, horizon)
            k.excl = max(0.0, k.end - start)
            horizon = max(horizon, k.end)
            total += k.excl
    return total


def find_traces(directory: Path) -> List[Path]:
    d = Path(directory)
    return sorted(p for p in d.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
                  and "trace" in p.name)
