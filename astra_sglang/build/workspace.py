"""A workspace: one extracted op, self-contained (sources, flags, manifest, builds).

Layout of <root>/<op>/:
  manifest.json   op, variant, versions, source roots, every copied file with its sha256,
                  compile flags, arch, the ABI signature
  src/<root>/...  the production include closure (sglang_jit, flashinfer, tvm_ffi, ...)
  baseline.cu     generated launcher: the production kernel behind the astra ABI
  build.ninja     rebuilds baseline.so by hand (`ninja -C <workspace>`)
  build/          content-hashed build cache (one .so per distinct source+flags)
  candidates/     optimize's candidates, one file per round
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import AstraError
from .cache import BuildResult, build_shared

DEFAULT_ROOT = Path("astra-work")


@dataclass
class Workspace:
    path: Path
    manifest: Dict[str, Any]

    @classmethod
    def open(cls, op: str, root: Optional[Path] = None, path: Optional[Path] = None) -> "Workspace":
        p = Path(path) if path else Path(root or DEFAULT_ROOT) / op
        mf = p / "manifest.json"
        if not mf.exists():
            raise AstraError(f"no workspace for {op} at {p}: run `astra-sglang extract {op}` first")
        m = json.loads(mf.read_text())
        if m.get("op") != op:
            raise AstraError(f"workspace {p} holds op {m.get('op')!r}, not {op!r}")
        return cls(p, m)

    @property
    def op(self) -> str:
        return self.manifest["op"]

    @property
    def variant(self) -> str:
        return self.manifest["variant"]

    @property
    def installed(self) -> str:
        """'module:function' of SGLang's installed callable when production is that (an installed variant,
        extract/installed.py: no baseline.cu), else ''."""
        return str(self.manifest.get("callable", "")) if self.manifest.get("kind") == "installed" else ""

    @property
    def include_dirs(self) -> List[Path]:
        return [self.path / d for d in self.manifest.get("include_dirs", [])]

    @property
    def flags(self) -> List[str]:
        return list(self.manifest["flags"])

    @property
    def baseline(self) -> Path:
        return self.path / "baseline.cu"

    @property
    def attrs(self) -> Dict[str, Any]:
        return dict(self.manifest.get("attrs", {}))

    def build(self, source: Optional[Path] = None, timeout: float = 600.0) -> BuildResult:
        """Build `source` (default: the baseline) with the production flags and include dirs."""
        if source is None and self.installed:
            raise AstraError(f"workspace {self.path} has no baseline to build: production is SGLang's installed "
                             f"{self.installed} (harness/installed.py)")
        return build_shared(
            Path(source) if source else self.baseline,
            self.include_dirs,
            self.flags,
            self.path / "build",
            self.manifest["closure_sha256"],
            timeout=timeout,
        )


def open_workspace(op: str, workspace: Any) -> Workspace:
    """`workspace` as a Workspace of `op`: a Workspace, a directory, or None (the default root)."""
    if isinstance(workspace, Workspace):
        if workspace.op != op:
            raise AstraError(f"workspace {workspace.path} holds {workspace.op}, not {op}")
        return workspace
    return Workspace.open(op, path=Path(workspace)) if workspace else Workspace.open(op)
