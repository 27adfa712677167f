"""Find SGLang's and FlashInfer's kernel sources: installed packages, checkouts, unpacked wheels.

Nothing here imports sglang or flashinfer (their __init__ pulls in torch and
CUDA); packages are located with importlib's finder and versions read from
package metadata or version files.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from astra_sglang.errors import AstraError


@dataclass
class Root:
    """A source tree files are copied from, and the include dirs it contributes (relative)."""

    name: str
    base: Path
    include_subdirs: Tuple[str, ...] = (".",)
    version: str = "unknown"
    origin: str = ""  # "installed", "checkout", "wheel-dir", "download"
    commit: str = ""  # git commit of a checkout, when it has a .git
    detail: str = ""  # where a downloaded tree came from (wheel, requirement, hash)


@dataclass
class Sources:
    roots: Dict[str, Root] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.roots

    def get(self, name: str, why: str) -> Root:
        if name not in self.roots:
            raise AstraError(missing_message(name, why))
        return self.roots[name]


def missing_message(name: str, why: str) -> str:
    return _MISSING[name] + f" (needed for {why})"


_MISSING = {
    "sglang_jit": "SGLang's JIT kernel sources not found: pass --download (fetches the wheels), "
    "`pip install sglang`, or --sglang-src (a git checkout or an unpacked sglang wheel)",
    "sglang_py": "SGLang's Python package not found: `pip install sglang` (its installed callable is the production "
    "baseline), or --sglang-src (an unpacked sglang wheel: the source facts only)",
    "sglang_checkout": "sgl-kernel's csrc is only in an SGLang git checkout: pass --sglang-src PATH/TO/sglang",
    "flashinfer": "FlashInfer headers not found: pass --download (fetches the wheels), "
    "`pip install flashinfer-python`, or --flashinfer-src (a checkout or an unpacked flashinfer-python wheel)",
    "tvm_ffi": "tvm-ffi headers not found (SGLang's JIT kernels include them): pass --download (fetches the "
    "wheels), `pip install apache-tvm-ffi`, or --tvm-ffi-src",
    "dlpack": "dlpack headers not found (shipped with apache-tvm-ffi): pass --download, "
    "`pip install apache-tvm-ffi`, or --tvm-ffi-src",
}


def _pkg_dir(name: str) -> Optional[Path]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _dist_version(dist: str) -> Optional[str]:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _version_near(pkg_dir: Path, dist_names: Tuple[str, ...]) -> str:
    """Version of an unpacked wheel or checkout: dist-info METADATA, version.py, pyproject."""
    parent = pkg_dir.parent
    for dn in dist_names:
        for meta in sorted(parent.glob(f"{dn.replace('-', '_')}-*.dist-info/METADATA")):
            m = re.search(r"^Version: (\S+)", meta.read_text(errors="replace"), re.MULTILINE)
            if m:
                return m.group(1)
    for vf in (pkg_dir / "version.py", pkg_dir / "_version.py", pkg_dir / "version.txt", parent / "version.txt"):
        if vf.exists():
            m = re.search(r"(\d+\.\d+\.\d+[\w.+-]*)", vf.read_text(errors="replace"))
            if m:
                return m.group(1)
    for pp in (parent / "pyproject.toml", parent.parent / "python" / "pyproject.toml"):
        if pp.exists():
            m = re.search(r'^version\s*=\s*"([^"]+)"', pp.read_text(errors="replace"), re.MULTILINE)
            if m:
                return m.group(1)
    return "unknown"


def _git_commit(root: Path) -> str:
    """HEAD's commit of a git checkout without running git (a .git dir, or a worktree's .git file)."""
    g = root / ".git"
    try:
        if g.is_file():
            m = re.match(r"gitdir:\s*(.+)", g.read_text().strip())
            g = (root / m.group(1)).resolve() if m else g
        head = (g / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        if (g / ref).is_file():
            return (g / ref).read_text().strip()
        packed = g / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0]
    except (OSError, AttributeError, IndexError):
        pass
    return ""


def _checkout_version(root: Path) -> str:
    """sglang's version from a checkout: python/pyproject.toml, else sgl-kernel's."""
    for pp in (root / "python" / "pyproject.toml", root / "sgl-kernel" / "pyproject.toml"):
        if pp.exists():
            m = re.search(r'^version\s*=\s*"([^"]+)"', pp.read_text(errors="replace"), re.MULTILINE)
            if m:
                return m.group(1) if pp.parent.name == "python" else f"sgl-kernel {m.group(1)}"
    return "unknown"


def _sglang_from_path(p: Path) -> Tuple[Optional[Path], Optional[Path]]:
    """(sglang package dir, checkout root or None) for a checkout, python/ dir, wheel dir or package dir."""
    p = p.resolve()
    cands = [p / "python" / "sglang", p / "sglang", p]
    for c in cands:
        if (c / "kernels" / "jit" / "include").is_dir() or (c / "srt").is_dir():
            checkout = None
            for r in (p, p.parent, p.parent.parent):
                if (r / "sgl-kernel" / "csrc").is_dir():
                    checkout = r
                    break
            return c, checkout
    if (p / "sgl-kernel" / "csrc").is_dir():
        return None, p
    return None, None


def _flashinfer_include_from_path(p: Path) -> Optional[Path]:
    p = p.resolve()
    for c in (p / "flashinfer" / "data" / "include", p / "data" / "include", p / "include", p):
        if (c / "flashinfer" / "norm.cuh").exists() or (c / "flashinfer" / "utils.cuh").exists():
            return c
    return None


def _tvm_from_path(p: Path) -> Tuple[Optional[Path], Optional[Path]]:
    p = p.resolve()
    for c in (p / "tvm_ffi", p):
        inc = c / "include"
        if (inc / "tvm" / "ffi").is_dir():
            dl = c / "3rdparty" / "dlpack" / "include"
            return inc, (dl if (dl / "dlpack").is_dir() else None)
    return None, None


def discover(
    sglang_src: Optional[Path] = None,
    flashinfer_src: Optional[Path] = None,
    tvm_ffi_src: Optional[Path] = None,
) -> Sources:
    """Locate every source root extract can use. Missing roots are simply absent;
    a variant that needs one fails later with an actionable message."""
    s = Sources()

    # --- SGLang -------------------------------------------------------------
    if sglang_src is not None:
        if not Path(sglang_src).exists():
            raise AstraError(f"--sglang-src {sglang_src} does not exist")
        pkg, checkout = _sglang_from_path(Path(sglang_src))
        if pkg is None and checkout is None:
            raise AstraError(
                f"--sglang-src {sglang_src} is neither an SGLang checkout nor an unpacked sglang wheel "
                "(no sglang/kernels/jit or sgl-kernel/csrc under it)"
            )
        origin = "checkout" if checkout else "wheel-dir"
        ver = _version_near(pkg, ("sglang",)) if pkg else "unknown"
    else:
        pkg, checkout = _pkg_dir("sglang"), None
        origin = "installed"
        ver = _dist_version("sglang") or (_version_near(pkg, ("sglang",)) if pkg else "unknown")
    if pkg is not None and (pkg / "srt").is_dir():  # installed variants: facts from SGLang's Python sources
        s.roots["sglang_py"] = Root("sglang_py", pkg, (".",), ver, origin)
    if pkg is not None and (pkg / "kernels" / "jit" / "include").is_dir():
        s.roots["sglang_jit"] = Root("sglang_jit", pkg / "kernels" / "jit", ("include", "."), ver, origin)
    if checkout is not None:
        cver = ver if ver != "unknown" else _checkout_version(checkout)
        s.roots["sglang_checkout"] = Root(
            "sglang_checkout", checkout, ("sgl-kernel/include", "sgl-kernel/csrc", "."), cver, "checkout",
            _git_commit(checkout),
        )

    # --- FlashInfer -----------------------------------------------------------
    if flashinfer_src is not None:
        if not Path(flashinfer_src).exists():
            raise AstraError(f"--flashinfer-src {flashinfer_src} does not exist")
        inc = _flashinfer_include_from_path(Path(flashinfer_src))
        if inc is None:
            raise AstraError(
                f"--flashinfer-src {flashinfer_src} holds no FlashInfer headers "
                "(expected include/flashinfer/*.cuh or flashinfer/data/include)"
            )
        pkg_guess = inc.parent.parent if inc.name == "include" and inc.parent.name == "data" else inc.parent
        fver = _version_near(pkg_guess, ("flashinfer_python", "flashinfer-python"))
        s.roots["flashinfer"] = Root("flashinfer", inc, (".",), fver, "wheel-dir")
    else:
        fpkg = _pkg_dir("flashinfer")
        if fpkg is not None:
            inc = _flashinfer_include_from_path(fpkg)
            if inc is not None:
                fver = _dist_version("flashinfer-python") or _version_near(fpkg, ("flashinfer_python",))
                s.roots["flashinfer"] = Root("flashinfer", inc, (".",), fver, "installed")

    # --- tvm-ffi / dlpack (SGLang's JIT headers include them) -----------------
    tinc = dl = None
    tver = "unknown"
    if tvm_ffi_src is not None:
        tinc, dl = _tvm_from_path(Path(tvm_ffi_src))
        if tinc is None:
            raise AstraError(f"--tvm-ffi-src {tvm_ffi_src} holds no tvm/ffi headers")
        tver = _version_near(tinc.parent, ("apache_tvm_ffi",))
    else:
        tpkg = _pkg_dir("tvm_ffi")
        if tpkg is not None:
            tinc, dl = _tvm_from_path(tpkg)
            tver = _dist_version("apache-tvm-ffi") or "unknown"
        elif pkg is not None:  # an unpacked wheel set: look beside the sglang package
            tinc, dl = _tvm_from_path(pkg.parent)
    if tinc is not None:
        s.roots["tvm_ffi"] = Root("tvm_ffi", tinc, (".",), tver, "installed" if tvm_ffi_src is None else "wheel-dir")
    if dl is not None:
        s.roots["dlpack"] = Root("dlpack", dl, (".",), tver, s.roots["tvm_ffi"].origin)
    return s


def needed_roots(v) -> List[str]:
    """The source roots a variant reads, in order."""
    names = [sf.root for sf in v.sources] + list(v.include_roots) + [e.source.root for e in v.excerpts]
    if v.requires_root:
        names.insert(0, v.requires_root)
    return list(dict.fromkeys(names))


def missing_roots(s: Sources, v, why: str) -> List[str]:
    """One message per root `v` needs that `s` lacks (dlpack only when tvm-ffi itself is there:
    it ships inside apache-tvm-ffi, so one line covers both)."""
    lost = [n for n in needed_roots(v) if not s.has(n)]
    if "tvm_ffi" in lost and "dlpack" in lost:
        lost.remove("dlpack")
    return [missing_message(n, why) for n in lost]


def mark_downloaded(s: Sources, fetched: Dict[str, "object"], describe) -> Sources:
    """Record on every root that lies in a downloaded tree where that tree came from."""
    for root in s.roots.values():
        for f in fetched.values():
            base = Path(f.path).resolve()
            if root.base.resolve() == base or base in root.base.resolve().parents:
                root.origin, root.detail = "download", describe(f)
    return s
