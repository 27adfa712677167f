"""CUTLASS/CuTe headers for candidates: where flashinfer-python ships them, and a workspace whose
include path carries them.

flashinfer-python (which SGLang installs) ships CUTLASS's include tree at
flashinfer/data/cutlass/include (cute/ and cutlass/, CUTLASS 4.5 in flashinfer 0.7.2). It is looked
for, in order: $ASTRA_CUTLASS_INCLUDE; beside the flashinfer source root the workspace was extracted
from (manifest "sources"); the installed flashinfer package. The headers are used where they are,
not copied (28 MB): the run log records the directory and CUTLASS's version.

The workspace is widened in memory only (its manifest.json is not touched): check, bench and ncu
take the widened object, so every build of a candidate sees the same include path. Because the
build cache key covers the include dirs, the baseline is rebuilt once under the wider path.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Iterable, List, Optional

ENV = "ASTRA_CUTLASS_INCLUDE"
MARKER = Path("cute") / "tensor.hpp"

# Measured 2026-11-23 on this project's 2-core CPU machine, nvcc 13.0, -arch sm_90a, the JIT flags
# (-std=c++20 -O3 --expt-relaxed-constexpr), compiler CPU time (user): the CuTe fixture
# (tests/optimize_fixtures/cute/silu_cute.cu, 12 kernel instantiations) 15.4-19.4 s, of which
# including <cute/tensor.hpp> alone is 14.4 s (<cute/tensor_impl.hpp> alone 9.5 s, an empty .cu
# 1.5 s); a plain CUDA candidate of the same size 2.7-3.3 s. Over the 10 s goal: the header parse
# is the cost, not the kernel.
COMPILE_NOTE = ("a CuTe candidate costs about 16 s of compiler CPU time cold against about 3 s for plain CUDA "
                "(nvcc 13.0, sm_90a; including <cute/tensor.hpp> alone is 14 s), so use it where its layouts "
                "pay and keep template instantiations few")


def _is_include(d: Path) -> bool:
    return (d / MARKER).is_file() and (d / "cutlass").is_dir()


def _candidates(manifest: Optional[dict]) -> Iterable[Path]:
    env = os.environ.get(ENV)
    if env:
        yield Path(env)
    fi = ((manifest or {}).get("sources") or {}).get("flashinfer") or {}
    if fi.get("path"):
        p = Path(fi["path"])
        for base in (p, *list(p.parents)[:3]):  # .../flashinfer/data/include -> .../data/cutlass/include
            yield base / "cutlass" / "include"
            yield base / "data" / "cutlass" / "include"
    try:
        spec = importlib.util.find_spec("flashinfer")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        yield Path(loc) / "data" / "cutlass" / "include"


def find_include(manifest: Optional[dict] = None) -> Optional[Path]:
    """The CUTLASS include dir (holding cute/ and cutlass/), or None."""
    for d in _candidates(manifest):
        if _is_include(d):
            return d.resolve()
    return None


def cutlass_version(include: Path) -> str:
    try:
        text = (Path(include) / "cutlass" / "version.h").read_text(errors="replace")
    except OSError:
        return "unknown"
    parts = [re.search(rf"#define\s+CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def with_includes(workspace: Any, dirs: List[Path]) -> Any:
    """A copy of `workspace` whose include path ends with `dirs` (absolute paths; the manifest
    lists workspace-relative ones, and joining an absolute path keeps it)."""
    ws = copy.copy(workspace)
    m = dict(workspace.manifest)
    have = list(m.get("include_dirs", []))
    m["include_dirs"] = have + [str(Path(d).resolve()) for d in dirs if str(Path(d).resolve()) not in have]
    ws.manifest = m
    return ws
