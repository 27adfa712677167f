"""compute-sanitizer (memcheck, racecheck) over the candidate on a few small shapes."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from ..spec import OpSpec, Shape
from .cases import dedupe, numel
from .checkjob import run_check


def sanitizer_shapes(spec: OpSpec, n: int = 3) -> List[Shape]:
    """Small shapes for compute-sanitizer (it is slow): the smallest edge shapes and the smallest paper shape."""
    edge = sorted(spec.edge_shapes, key=lambda s: numel(s.dims))[:n]
    paper = sorted([s for s in spec.corpus if "paper" in s.tags], key=lambda s: numel(s.dims))[:1]
    return dedupe(edge + paper)


def parse_sanitizer_log(text: str) -> Tuple[int, str]:
    """(number of errors, first error line) from a compute-sanitizer log."""
    import re

    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    n = int(m.group(1)) if m else 0
    m2 = re.search(r"RACECHECK SUMMARY:\s*(\d+)\s+hazard", text)
    if m2:
        n = max(n, int(m2.group(1)))
    first = ""
    for line in text.splitlines():
        s = line.strip().lstrip("=").strip()
        if re.match(r"(Invalid|Race|Error|Uninitialized|Barrier|Hazard|Program hit|Malloc|Leaked|Warning: .*hazard)", s):
            first = s
            break
    return n, first


def sanitize_run(spec: OpSpec, ws, impl: str, tool: str, dtypes: Sequence[str], seed: int, *,
                 prod_attrs=None, timeout: float = 300.0, skip=None, progress=None) -> Dict[str, Any]:
    """Run the candidate alone (production as its own oracle is not needed: values were checked)
    on a few small shapes under compute-sanitizer; memory straight from cudaMalloc, no guards,
    so out-of-bounds accesses hit the allocation's end."""
    import tempfile

    exe = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer", "/opt/nvidia/compute-sanitizer/compute-sanitizer")
         if Path(p).exists()), None)
    if not exe:
        return {"ok": True, "summary": "not run (compute-sanitizer not found)", "reason": ""}
    from .worker import default_argv

    fd, log = tempfile.mkstemp(prefix=f"astra-{tool}-", suffix=".log")
    os.close(fd)
    argv = [exe, "--tool", tool, "--log-file", log, "--error-exitcode", "86", "--print-limit", "20"]
    if tool == "racecheck":
        argv += ["--racecheck-report", "hazard"]
    argv += default_argv()
    run = run_check(
        spec, impl, None, sanitizer_shapes(spec), list(dtypes)[:1], seed=seed, timeout=timeout,
        total_timeout=max(timeout * 4, 900.0), prod_attrs=prod_attrs, guard_bytes=0, skip=skip, argv=argv,
        env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, first_dist_only=True, progress=progress)
    text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
    try:
        os.unlink(log)
    except OSError:
        pass
    n, first = parse_sanitizer_log(text)
    wr = run.worker
    if n or wr.rc == 86:
        return {"ok": False, "reason": first or f"{n} errors", "summary": f"{n} errors", "log": text}
    if not run.ok and wr.status in ("timeout", "crashed", "error"):
        return {"ok": False, "reason": wr.reason, "summary": wr.status, "log": text + wr.stderr_tail}
    return {"ok": True, "summary": "0 errors", "reason": "", "log": text}
