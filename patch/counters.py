"""Per-op call counters that other processes can read, without HTTP.

Every patched process maps one small file, <dir>/<pid>.cnt, and bumps int64 slots in
it (a memory write, no syscall), plus <pid>.json with what was patched and why an op
was disabled. A reader (the CLI, e2e, a test) opens every file in the directory.

Per op:
  calls         launches of the astra kernel made from Python (eager, and while a CUDA
                graph was being captured)
  captured      of those, launches recorded into a CUDA graph: each is replayed by the
                graph without Python seeing it, so replays are not counted
  fallbacks     calls routed to SGLang's original (unsupported dtype, strides, device,
                arguments, or the op disabled)
  checks_passed, checks_failed   self-checks against the original
  disabled      1 once the op was turned off (self-check mismatch, kernel error)
  served        calls answered from the op's own earlier launch, with no kernel (moe_route_align's
                alignment, written when it routed the same ids)

Shape telemetry: beside it, <pid>.shp holds a histogram per op of the shapes (op dims in the
spec's order, and dtype) the astra kernel was launched on: `record_shape` finds the shape's slot
(a dict lookup; a new shape takes the next free slot) and bumps its count and, during CUDA-graph
capture, its captured count. Graph replays are not seen, so a captured shape counts once per
capture. `shape_totals` sums every process; `shapes_corpus` turns that into the corpus file that
check / bench / optimize take as `--shapes FILE` (astra_sglang.spec.load_shapes_file).
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from astra_sglang.files import write_whole

FIELDS = ("calls", "captured", "fallbacks", "checks_passed", "checks_failed", "disabled", "served")
_MAGIC = b"ASTRCNT1"
_HEADER = struct.Struct("<8sqqq")  # magic, pid, n_ops, n_fields
_NAME = 48
_SHP_MAGIC = b"ASTRSHP1"
_SHP_HEADER = struct.Struct("<8sqq")  # magic, pid, n_slots
_MAX_DIMS = 6
_SHP_SLOT = struct.Struct(f"<{_NAME}s8sq{_MAX_DIMS}qqq")  # op, dtype, ndims, dims, count, captured
SHAPE_SLOTS = 512


def fresh_counter_dir(cdir: Path) -> Path:
    """An arm's counter directory, emptied first: a rerun into the same --out would otherwise sum the earlier run's
    processes into this run's counters (that run's report, overwritten in the same --out, already had them)."""
    import shutil

    if cdir.exists():
        shutil.rmtree(cdir)
    cdir.mkdir(parents=True)
    return cdir


def default_dir() -> Path:
    return Path(tempfile.gettempdir()) / "astra-sglang-counters" / "default"


class CounterFile:
    """This process's counters: one mmap'd file, one int64 per (op, field)."""

    def __init__(self, directory: Path, ops: Iterable[str]):
        self.dir = Path(directory)
        self.ops: List[str] = list(ops)
        self._index = {op: i for i, op in enumerate(self.ops)}
        self._lock = threading.Lock()
        self.status: Dict[str, Dict[str, object]] = {op: {} for op in self.ops}
        self.closed = False
        self._open()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    # ------------------------------------------------------------------ file
    def _open(self) -> None:
        self.pid = os.getpid()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{self.pid}.cnt"
        size = _HEADER.size + len(self.ops) * (_NAME + 8 * len(FIELDS))
        with open(self.path, "wb") as f:
            f.write(b"\0" * size)
        self._fh = open(self.path, "r+b")
        self._mm = mmap.mmap(self._fh.fileno(), size)
        _HEADER.pack_into(self._mm, 0, _MAGIC, self.pid, len(self.ops), len(FIELDS))
        self._slots = []
        off = _HEADER.size
        for op in self.ops:
            self._mm[off:off + _NAME] = op.encode()[:_NAME].ljust(_NAME, b"\0")
            off += _NAME
            self._slots.append((ctypes.c_int64 * len(FIELDS)).from_buffer(self._mm, off))
            off += 8 * len(FIELDS)
        self._write_meta()
        self._open_shapes()

    def _open_shapes(self) -> None:
        self.shp_path = self.dir / f"{self.pid}.shp"
        size = _SHP_HEADER.size + SHAPE_SLOTS * _SHP_SLOT.size
        with open(self.shp_path, "wb") as f:
            f.write(b"\0" * size)
        self._shp_fh = open(self.shp_path, "r+b")
        self._shp = mmap.mmap(self._shp_fh.fileno(), size)
        _SHP_HEADER.pack_into(self._shp, 0, _SHP_MAGIC, self.pid, SHAPE_SLOTS)
        self._shape_slot: Dict[tuple, tuple] = {}
        self.shapes_dropped = 0

    def record_shape(self, op: str, dims, dtype: str, captured: bool = False) -> None:
        """One launch of `op` on `dims` (the spec's dim order) and `dtype`."""
        key = (op, dims if type(dims) is tuple else tuple(dims), dtype)   # hot path: ints from a shape already
        slot = self._shape_slot.get(key)
        if slot is None:
            key = (op, tuple(int(d) for d in dims), str(dtype))
            with self._lock:
                slot = self._shape_slot.get(key)
                if slot is None:
                    i = len(self._shape_slot)
                    if i >= SHAPE_SLOTS or len(key[1]) > _MAX_DIMS:
                        self.shapes_dropped += 1
                        return
                    off = _SHP_HEADER.size + i * _SHP_SLOT.size
                    d = list(key[1]) + [0] * (_MAX_DIMS - len(key[1]))
                    _SHP_SLOT.pack_into(self._shp, off, op.encode()[:_NAME], key[2].encode()[:8], len(key[1]), *d, 0, 0)
                    cnt_off = off + _SHP_SLOT.size - 16
                    slot = ((ctypes.c_int64 * 2).from_buffer(self._shp, cnt_off),)
                    self._shape_slot[key] = slot
        slot[0][0] += 1
        if captured:
            slot[0][1] += 1

    def close(self) -> None:
        """No longer in use (reverted): a later fork does not open a file for it."""
        self.closed = True

    def _after_fork(self) -> None:
        if self.closed:
            return
        # A forked child shares the parent's MAP_SHARED mapping: give it its own file,
        # starting from zero (its calls are its own), keeping the parent's op status.
        self._lock = threading.Lock()
        self._open()

    def note_rank(self) -> None:
        """Rewrite the meta file once this process's rank is known (SGLang titles its scheduler
        processes after the patch has activated); called from rare paths such as a self-check."""
        if self.rank is None and process_rank() is not None:
            with self._lock:
                self._write_meta()

    def _write_meta(self) -> None:
        self.rank = process_rank()
        meta = {
            "pid": self.pid,
            "rank": self.rank,
            "ppid": os.getppid(),
            "argv": sys.argv[:8],
            "started": time.time(),
            "ops": self.ops,
            "fields": list(FIELDS),
            "status": self.status,
        }
        write_whole(self.dir / f"{self.pid}.json", json.dumps(meta, indent=1, default=str))

    # ------------------------------------------------------------------ updates
    def bump(self, op: str, fld: str, n: int = 1) -> None:
        self._slots[self._index[op]][FIELDS.index(fld)] += n

    def set_status(self, op: str, **info: object) -> None:
        with self._lock:
            self.status.setdefault(op, {}).update(info)
            if info.get("state") == "disabled":
                self._slots[self._index[op]][FIELDS.index("disabled")] = 1
            self._write_meta()

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        return {op: dict(zip(FIELDS, list(self._slots[i]))) for i, op in enumerate(self.ops)}


@dataclass
class ProcessCounters:
    pid: int
    alive: bool
    counts: Dict[str, Dict[str, int]]
    status: Dict[str, Dict[str, object]] = field(default_factory=dict)
    argv: List[str] = field(default_factory=list)
    rank: Optional[str] = None


def _title(pid: str = "self") -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def rank_from_title(title: str) -> Optional[str]:
    """"sglang::scheduler_TP1_EP1" -> "TP1 EP1"; None for a title that names no rank."""
    m = re.search(r"((?:[TPDE]P\d+[ _]?)+)", title.rsplit("::", 1)[-1]) if "sglang::" in title else None
    return m.group(1).replace("_", " ").strip() if m else None


def process_rank() -> Optional[str]:
    """This process's tensor-parallel rank as SGLang names it ("TP1", "TP0 EP0"), or None.

    SGLang titles each scheduler process `sglang::scheduler_TP<r>...` (setproctitle rewrites
    /proc/self/cmdline); torch.distributed's rank is the fallback once it is initialized."""
    rank = rank_from_title(_title())
    if rank:
        return rank
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return f"rank{dist.get_rank()}"
    except Exception:
        pass
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def read_file(path: Path) -> Dict[str, Dict[str, int]]:
    data = Path(path).read_bytes()
    magic, _pid, n_ops, n_fields = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC:
        raise ValueError(f"{path} is not an astra-sglang counter file")
    names = FIELDS[:n_fields] if n_fields <= len(FIELDS) else FIELDS + tuple(f"f{i}" for i in range(len(FIELDS), n_fields))
    out: Dict[str, Dict[str, int]] = {}
    off = _HEADER.size
    for _ in range(n_ops):
        op = data[off:off + _NAME].rstrip(b"\0").decode()
        off += _NAME
        vals = struct.unpack_from(f"<{n_fields}q", data, off)
        off += 8 * n_fields
        out[op] = dict(zip(names, vals))
    return out


def read_counters(directory: Optional[Path] = None) -> List[ProcessCounters]:
    """Every process's counters under `directory` (default: $ASTRA_SGLANG_COUNTER_DIR)."""
    from .config import ENV_COUNTER_DIR

    d = Path(directory or os.environ.get(ENV_COUNTER_DIR) or default_dir())
    procs: List[ProcessCounters] = []
    if not d.is_dir():
        return procs
    for cnt in sorted(d.glob("*.cnt")):
        try:
            counts = read_file(cnt)
        except (OSError, ValueError, struct.error):
            continue
        pid = int(cnt.stem)
        meta_p = cnt.with_suffix(".json")
        meta = {}
        if meta_p.exists():
            try:
                meta = json.loads(meta_p.read_text())
            except (OSError, ValueError):
                meta = {}
        alive = _alive(pid)
        # the patch may activate before SGLang titles the process: a live one's title names its rank now
        rank = meta.get("rank") or (rank_from_title(_title(str(pid))) if alive else None)
        procs.append(ProcessCounters(pid, alive, counts, meta.get("status", {}), meta.get("argv", []), rank))
    return procs


def read_shapes_file(path: Path) -> List[dict]:
    """The shape slots of one <pid>.shp: [{"op", "dims", "dtype", "count", "captured"}]."""
    data = Path(path).read_bytes()
    magic, _pid, n = _SHP_HEADER.unpack_from(data, 0)
    if magic != _SHP_MAGIC:
        raise ValueError(f"{path} is not an astra-sglang shape file")
    out = []
    for i in range(n):
        off = _SHP_HEADER.size + i * _SHP_SLOT.size
        if off + _SHP_SLOT.size > len(data):
            break
        op, dt, nd, *rest = _SHP_SLOT.unpack_from(data, off)
        if not op.strip(b"\0"):
            break
        dims, count, captured = rest[:_MAX_DIMS][:nd], rest[_MAX_DIMS], rest[_MAX_DIMS + 1]
        out.append({"op": op.rstrip(b"\0").decode(), "dims": list(dims), "dtype": dt.rstrip(b"\0").decode(),
                    "count": count, "captured": captured})
    return out


def shape_totals(directory: Optional[Path] = None) -> Dict[str, List[dict]]:
    """Per op, every shape any process under `directory` launched, counts summed, most used first."""
    from .config import ENV_COUNTER_DIR

    d = Path(directory or os.environ.get(ENV_COUNTER_DIR) or default_dir())
    acc: Dict[str, Dict[tuple, dict]] = {}
    for f in sorted(d.glob("*.shp")) if d.is_dir() else []:
        try:
            slots = read_shapes_file(f)
        except (OSError, ValueError, struct.error):
            continue
        for s in slots:
            e = acc.setdefault(s["op"], {}).setdefault((tuple(s["dims"]), s["dtype"]),
                                                        {"dims": s["dims"], "dtype": s["dtype"], "count": 0, "captured": 0})
            e["count"] += s["count"]
            e["captured"] += s["captured"]
    return {op: sorted(v.values(), key=lambda e: -e["count"]) for op, v in sorted(acc.items())}


def shapes_corpus(directory: Optional[Path] = None, source: str = "patch counters") -> dict:
    """The live shapes as a `--shapes FILE` corpus (format: astra_sglang.spec.load_shapes_file)."""
    ops = {}
    for op, rows in shape_totals(directory).items():
        ops[op] = [{"dims": r["dims"], "dtype": r["dtype"], "count": r["count"],
                    "tags": ["live"] + (["captured"] if r["captured"] else []), "source": source} for r in rows]
    return {"format": "astra-shapes/1", "source": source, "ops": ops}


def add_counts(acc: Dict[str, Dict[str, int]], counts: Dict[str, Dict[str, int]]) -> Dict[str, Dict[str, int]]:
    """Add one process's per-op counts into `acc` (op -> field -> value); returns acc."""
    for op, c in counts.items():
        a = acc.setdefault(op, {f: 0 for f in FIELDS})
        for k, v in c.items():
            # "disabled" is a flag: disabled in any process counts once
            a[k] = max(a.get(k, 0), v) if k == "disabled" else a.get(k, 0) + v
    return acc


def by_rank(directory: Optional[Path] = None, active_only: bool = False) -> Dict[str, dict]:
    """rank ("TP1"; "pid N" for a process that names none) -> {"pids", "ops": op -> counts summed over
    its processes, "status": op -> the last non-empty status}. active_only: skip processes that ran
    nothing (a server's tokenizer and detokenizer import the patch too)."""
    out: Dict[str, dict] = {}
    for p in read_counters(directory):
        if active_only and not any(any(c.values()) for c in p.counts.values()):
            continue
        r = out.setdefault(p.rank or f"pid {p.pid}", {"pids": [], "ops": {}, "status": {}})
        r["pids"].append(p.pid)
        add_counts(r["ops"], p.counts)
        r["status"].update({op: st for op, st in p.status.items() if st})
    return out


def totals(directory: Optional[Path] = None) -> Dict[str, Dict[str, int]]:
    """Counters summed over every process in `directory`, per op."""
    out: Dict[str, Dict[str, int]] = {}
    for p in read_counters(directory):
        add_counts(out, p.counts)
    return out


def format_table(procs: List[ProcessCounters]) -> str:
    rows = [("pid", "rank", "op", *FIELDS, "state")]
    for p in procs:
        for op, c in p.counts.items():
            st = p.status.get(op, {})
            state = str(st.get("state", ""))
            if st.get("reason"):
                state += f" ({st['reason']})"
            rows.append((f"{p.pid}{'' if p.alive else '†'}", p.rank or "-", op, *(str(c.get(f, 0)) for f in FIELDS),
                         state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]
    return "\n".join(lines)
