"""The shipped kernel's measured speedup on a shape, from the newest bench JSON under results/.

A bench JSON (`astra-sglang bench --out`) of the shipped kernel (its "candidate" is kernels/<op>/kernel.cu;
other candidates are experiments) has "op", "date" and "rows" of {"shape": "32x4096",
"dtype": "bf16", "speedup": 1.31, ...}; where the bench also timed SGLang's installed callable in context, the
speedup over that is the one used (serving_speedup). Benches timed between astra's linears (`--neighbours astra`) are not read: the profile scales the op time of an
unpatched step, whose neighbours are cuBLAS. Lookup: the newest file (by its "date") that has a row
for the op, the dtype and the exact shape; failing that, the row of the same trailing dims whose
token count is nearest within a factor of NEAREST_MAX_RATIO (reported as "~" with the shape it came
from); else unmeasured. The bound: a 64-token row says nothing about 1 token (other launch regime, and
for some ops another production path, e.g. MoE combine's torch.compile'd sum below 33 tokens).
"""
from __future__ import annotations

import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .trace import load_json

NEAREST_MAX_RATIO = 4


@dataclass(frozen=True)
class Speedup:
    value: float
    shape: str          # the bench row's shape
    exact: bool
    source: str         # file
    date: str
    # the bench row's in-context floor bound (its "headroom"): the most any kernel could gain there; None: unmeasured
    attainable: Optional[float] = None

    def label(self) -> str:
        return f"{self.value:.2f}x" if self.exact else f"~{self.value:.2f}x ({self.shape})"


def is_shipped_candidate(op: str, candidate) -> bool:
    """Whether a bench JSON timed the shipped kernel (kernels/<op>/kernel.cu, wherever the checkout was).
    Experiments (PDL variants in /tmp), deliberately wrong kernels (tests/bad_candidates) and baselines
    are benched too, and must not stand in for it: a pdl0 variant's 0.86x was the profile's "speedup" of
    fused_add_rmsnorm at 1x4096 until 2026-11-26. A JSON without a candidate field counts (older benches)."""
    if candidate is None:
        return True
    return str(candidate).replace("\\", "/").endswith(f"kernels/{op}/kernel.cu")


def record_path(path: Path, name: str) -> Path:
    """`path` itself, or where `path` is a folder its NAME (or NAME.xz, as results/ keeps one over 10 KB)."""
    if not path.is_dir():
        return path
    return next((path / n for n in (name, name + ".xz") if (path / n).is_file()), path / name)


# what reading a record can raise: a missing file, bad JSON, a cut-off .xz (EOFError) or a corrupt one
RECORD_ERRORS = (OSError, ValueError, EOFError, lzma.LZMAError)


def read_ab_results(path: Path, kind: str) -> dict:
    """An A/B's results.json (or .json.xz) for `--analyze`: one AstraError line where it cannot be read or holds no
    runs. `kind`: what it should be the results of ("server A/B", "decode-step A/B")."""
    from astra_sglang.errors import AstraError

    try:
        data = load_json(Path(path))
    except RECORD_ERRORS as e:
        raise AstraError(f"{path}: cannot read it as JSON ({e})") from e
    if not isinstance(data, dict) or "runs" not in data:
        raise AstraError(f"{path}: not the results.json of a {kind} (no 'runs')")
    return data


def _rows_of(path: Path) -> Optional[Tuple[str, str, list, str]]:
    try:
        if path.stat().st_size > 20 * 2 ** 20:
            return None
        d = load_json(path)
    except RECORD_ERRORS:
        return None
    if not isinstance(d, dict) or "op" not in d or not isinstance(d.get("rows"), list):
        return None
    if not is_shipped_candidate(str(d["op"]), d.get("candidate")) or d.get("shipped") is False:
        return None   # an experiment, or a kernels/<op>/kernel.cu trial that was reverted (marked "shipped": false)
    if d.get("context_neighbours") == "astra":
        # timed between astra's linears (bench --neighbours astra): production's kernel there is not what the
        # unpatched step ran, so the ratio would not scale the op time the profile measured in it
        return None
    rows = [dict(r, speedup=serving_speedup(r)) for r in d["rows"]
            if isinstance(r, dict) and "shape" in r and isinstance(r.get("speedup"), (int, float))]
    return (str(d["op"]), str(d.get("date", "")), rows, str(d.get("variant") or "")) if rows else None


def serving_speedup(row: dict) -> float:
    """A bench row's speedup over what SGLang runs: against the installed callable in context where the
    bench timed it (`--baseline installed`: moe_combine's <= 32-token rows, where SGLang runs a
    torch.compile'd sum that the extracted baseline is not), else the row's own speedup."""
    inst, cand = row.get("context_installed_us"), row.get("context_cand_us")
    if isinstance(inst, (int, float)) and isinstance(cand, (int, float)) and inst > 0 and cand > 0:
        return inst / cand
    return float(row["speedup"])


def _attainable(row: dict) -> Optional[float]:
    """A bench row's in-context bound (results.BenchRow.headroom), where the bench timed the floor."""
    h = row.get("headroom")
    return float(h) if isinstance(h, (int, float)) and h > 0 else None


class SpeedupTable:
    def __init__(self, files: Sequence[Path]):
        # op -> [(date, file, rows, production variant)] newest first
        self.by_op: Dict[str, List[Tuple[str, str, list, str]]] = {}
        for f in files:
            got = _rows_of(Path(f))
            if got:
                op, date, rows, variant = got
                self.by_op.setdefault(op, []).append((date, str(f), rows, variant))
        for v in self.by_op.values():
            v.sort(key=lambda t: t[0], reverse=True)

    @classmethod
    def from_dirs(cls, dirs: Sequence[Path]) -> "SpeedupTable":
        files: List[Path] = []
        for d in dirs:
            d = Path(d)
            if d.is_file():
                files.append(d)
            elif d.is_dir():
                files += sorted([*d.rglob("*.json"), *d.rglob("*.json.xz")])
        return cls(files)

    def _files(self, op: str, variant: Optional[str]):
        """The op's bench files, newest first; with `variant`, only those against that production (a fused op
        with two call sites has one production sequence per site; a file that names none counts)."""
        return [(d, s, r) for d, s, r, v in self.by_op.get(op, []) if not variant or not v or v == variant]

    def lookup(self, op: str, dims: Optional[Tuple[int, ...]], dtype: str = "bf16",
               variant: Optional[str] = None) -> Optional[Speedup]:
        if dims is None:
            return None
        key = "x".join(str(x) for x in dims)
        for date, src, rows in self._files(op, variant):
            for r in rows:
                if r["shape"] == key and r.get("dtype", dtype) == dtype:
                    return Speedup(float(r["speedup"]), key, True, src, date, _attainable(r))
        best = None
        for date, src, rows in self._files(op, variant):
            for r in rows:
                try:
                    rd = tuple(int(x) for x in str(r["shape"]).split("x"))
                except ValueError:
                    continue
                if len(rd) != len(dims) or rd[1:] != tuple(dims[1:]) or r.get("dtype", dtype) != dtype:
                    continue
                if max(rd[0], dims[0]) > NEAREST_MAX_RATIO * max(min(rd[0], dims[0]), 1):
                    continue
                dist = abs(rd[0] - dims[0]) / max(dims[0], 1)
                if best is None or dist < best[0]:
                    best = (dist, Speedup(float(r["speedup"]), str(r["shape"]), False, src, date, _attainable(r)))
            if best:
                break   # newest file that has this width
        return best[1] if best else None
