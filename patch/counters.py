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
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

FIELDS = ("calls", "captured", "fallbacks", "checks_passed", "checks_failed", "disabled")
_MAGIC = b"ASTRCNT1"
_HEADER = struct.Struct("<8sqqq")  # magic, pid, n_ops, n_fields
_NAME = 48


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

    def _write_meta(self) -> None:
        meta = {
            "pid": self.pid,
            "ppid": os.getppid(),
            "argv": sys.argv[:8],
            "started": time.time(),
            "ops": self.ops,
            "fields": list(FIELDS),
            "status": self.status,
        }
        tmp = self.dir / f".{self.pid}.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, default=str))
        os.replace(tmp, self.dir / f"{self.pid}.json")

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
        procs.append(ProcessCounters(pid, _alive(pid), counts, meta.get("status", {}), meta.get("argv", [])))
    return procs


def totals(directory: Optional[Path] = None) -> Dict[str, Dict[str, int]]:
    """Counters summed over every process in `directory`, per op."""
    out: Dict[str, Dict[str, int]] = {}
    for p in read_counters(directory):
        for op, c in p.counts.items():
            acc = out.setdefault(op, {f: 0 for f in FIELDS})
            for k, v in c.items():
                # "disabled" is a flag: disabled in any process counts once
                acc[k] = max(acc.get(k, 0), v) if k == "disabled" else acc.get(k, 0) + v
    return out


def format_table(procs: List[ProcessCounters]) -> str:
    rows = [("pid", "op", *FIELDS, "state")]
    for p in procs:
        for op, c in p.counts.items():
            st = p.status.get(op, {})
            state = str(st.get("state", ""))
            if st.get("reason"):
                state += f" ({st['reason']})"
            rows.append((f"{p.pid}{'' if p.alive else '†'}", op, *(str(c.get(f, 0)) for f in FIELDS), state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]
    return "\n".join(lines)
