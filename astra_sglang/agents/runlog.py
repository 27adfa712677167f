"""The run's JSONL log (append-only, one event per line, fsynced) and the secret redactor.

Every line that reaches the log or the terminal goes through `Redactor`, so an API key never
lands in a file, even inside a provider's error message.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

LOG_NAME = "log.jsonl"

_GENERIC = [
    (re.compile(r"\bsk-[A-Za-z0-9_\-*.]{6,}"), "sk-***"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9_\-.=~+/]{8,}"), r"\1 ***"),
    (re.compile(r"(?i)(api[_-]?key['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]{6,}"), r"\1***"),
    (re.compile(r"(//)[^/@\s:]+:[^/@\s]+@"), r"\1***@"),  # credentials in a URL
]


@dataclass
class Redactor:
    secrets: List[str] = field(default_factory=list)

    def add(self, secret: Optional[str]) -> None:
        if secret and len(secret) >= 4 and secret not in self.secrets:
            self.secrets.append(secret)

    def text(self, s: str) -> str:
        for secret in self.secrets:
            s = s.replace(secret, "***")
        for rx, repl in _GENERIC:
            s = rx.sub(repl, s)
        return s

    def obj(self, o: Any) -> Any:
        if isinstance(o, str):
            return self.text(o)
        if isinstance(o, dict):
            return {k: self.obj(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [self.obj(v) for v in o]
        return o


class RunLog:
    """Append-only JSONL. `elapsed_s` on every event is the run's cumulative wall time across
    sessions (a resumed session starts from the last logged value)."""

    def __init__(self, run_dir: Path, redactor: Redactor) -> None:
        self.path = Path(run_dir) / LOG_NAME
        self.redactor = redactor
        self.events: List[Dict[str, Any]] = read_log(self.path)
        self._base = float(self.events[-1].get("elapsed_s", 0.0)) if self.events else 0.0
        self._t0 = time.monotonic()

    @property
    def elapsed_s(self) -> float:
        return self._base + (time.monotonic() - self._t0)

    def append(self, event: Dict[str, Any]) -> Dict[str, Any]:
        ev = self.redactor.obj(dict(event))
        ev["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        ev["elapsed_s"] = round(self.elapsed_s, 3)
        line = json.dumps(ev, sort_keys=False, default=str)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.events.append(ev)
        return ev

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]


def read_log(path: Path) -> List[Dict[str, Any]]:
    """Events of a log; a last line cut off by a crash is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    out: List[Dict[str, Any]] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def iter_rounds(events: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The completed rounds, last record per round number wins, in round order."""
    by: Dict[int, Dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "round":
            by[int(e["round"])] = e
    return [by[k] for k in sorted(by)]
