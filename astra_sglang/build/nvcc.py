"""The toolchain: where nvcc is, which version, the ninja file that reruns a build, its first error."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence, Tuple

from ..errors import AstraError

# Where nvcc is looked for when neither CUDA_HOME/CUDA_PATH nor PATH has it.
FALLBACK_NVCC: Tuple[str, ...] = ("/usr/local/cuda/bin/nvcc",)


def find_nvcc() -> str:
    cand = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cand and (Path(cand) / "bin" / "nvcc").exists():
        return str(Path(cand) / "bin" / "nvcc")
    path = shutil.which("nvcc") or next((p for p in FALLBACK_NVCC if Path(p).exists()), None)
    if not path:
        raise AstraError("nvcc not found: install the CUDA toolkit (nvcc ≥ 12.4) or set CUDA_HOME")
    return path


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def ninja_text(nvcc: str, flags: Sequence[str], includes: Sequence[str], out: str, source: str, comment: str) -> str:
    """A ninja file that builds `source` into the shared library `out` with nvcc."""
    def q(s: str) -> str:
        return s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")

    return (
        f"# {comment}\n"
        f"nvcc = {nvcc}\n"
        f"flags = {' '.join(flags)} {' '.join('-I' + i for i in includes)}\n"
        "rule nvcc_shared\n"
        "  command = $nvcc $flags -shared $in -o $out\n"
        "  description = nvcc $in\n"
        f"build {q(out)}: nvcc_shared {q(source)}\n"
        f"default {q(out)}\n"
    )


def first_error_line(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()
    return (log.strip().splitlines() or ["unknown build failure"])[0]
