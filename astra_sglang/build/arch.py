"""The GPU target: compute capability, parsed from text or read from nvidia-smi (no torch needed)."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from ..errors import AstraError


@dataclass(frozen=True)
class Arch:
    major: int
    minor: int

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"

    @property
    def sgl_cuda_arch(self) -> int:
        return self.major * 100 + self.minor * 10

    def gencode(self, profile: str) -> str:
        # SGLang's JIT targets the arch-specific 'a' variant on 9.x and 10.x+
        # (arch._cuda_arch_suffix); sgl-kernel's wheel is built for sm_90a too.
        suffix = "a" if self.major >= 9 else ""
        t = f"{self.major}{self.minor}{suffix}"
        return f"-gencode=arch=compute_{t},code=sm_{t}"


def parse_arch(text: str) -> Arch:
    m = re.fullmatch(r"(?:sm_?)?(\d+)(\d)a?|(\d+)\.(\d+)", text.strip().lower())
    if not m:
        raise AstraError(f"unsupported arch {text!r}; give it as sm_90 (or 9.0)")
    major, minor = (int(m.group(1)), int(m.group(2))) if m.group(1) else (int(m.group(3)), int(m.group(4)))
    if major < 8:
        raise AstraError(f"unsupported arch sm_{major}{minor}: SGLang's kernels need sm_80 or newer")
    return Arch(major, minor)


def query_gpu(fields: str) -> Optional[str]:
    """First GPU's `nvidia-smi --query-gpu=FIELDS` as one CSV line; None without a usable nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (subprocess.SubprocessError, OSError):
        return None
    return out[0].strip() if out and out[0].strip() else None


def detect_arch() -> Arch:
    """The local GPU's compute capability, via nvidia-smi (no torch needed)."""
    cap = query_gpu("compute_cap")
    if cap:
        return parse_arch(cap)
    raise AstraError("no GPU found to detect the arch from; pass --arch sm_90 to build without a GPU")

