"""`extract --download`: the sglang, flashinfer-python and apache-tvm-ffi wheels of one SGLang
release, fetched with pip into the cache and unpacked, so a machine without SGLang extracts in
one command.

The flashinfer-python and apache-tvm-ffi versions are the ones the sglang wheel's METADATA pins
(Requires-Dist), so the headers match what that SGLang release runs. Only the trees extract reads
are unpacked (plus each wheel's METADATA, which carries its version). Wheels of any platform do:
only sources and headers are used, never the binaries.

Cache layout (one root: $ASTRA_CACHE_DIR, default ~/.cache/astra-sglang):
  sources/wheels/*.whl                      what pip downloaded
  sources/sglang-<version>/{sglang,flashinfer,tvm}/   the unpacked trees
  sources/sglang-<version>/sources.json     which wheel each tree came from (requirement, sha256)
A release already in the cache is used without touching the network.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from astra_sglang.errors import AstraError

from .progress import bar

# key -> (distribution, the members extract reads). flashinfer's cutlass/ holds the CUTLASS/CuTe
# headers candidates may include; its csrc/ (258 MB) is not needed.
PACKAGES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "sglang": ("sglang", ("sglang/kernels/", "sglang/version.py", "sglang/_version.py")),
    "flashinfer": ("flashinfer-python", ("flashinfer/data/include/", "flashinfer/data/cutlass/")),
    "tvm": ("apache-tvm-ffi", ("tvm_ffi/include/", "tvm_ffi/3rdparty/dlpack/include/")),
}
# Platforms whose wheels pip may take; the first python version that has a wheel wins.
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_aarch64",
             "manylinux_2_28_aarch64", "any")
PY_VERSIONS = ("3.12", "3.11", "3.10")


def sources_dir() -> Path:
    from astra_sglang.build import cache_root  # the one cache root ($ASTRA_CACHE_DIR)

    return cache_root("sources")


@dataclass
class Fetched:
    """One unpacked wheel: where it lies and where it came from."""

    key: str  # sglang | flashinfer | tvm
    requirement: str
    wheel: str  # file name
    sha256: str
    version: str
    path: Path


def check_version(text: str) -> str:
    """An SGLang version as pip understands it, or a one-line error (before any network)."""
    try:
        return str(Version(text.strip()))
    except InvalidVersion:
        raise AstraError(f"--sglang {text!r} is not a version (give it as 0.5.23)") from None


def installed_sglang_version() -> Optional[str]:
    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return None


def cached(version: str) -> Optional[Dict[str, Fetched]]:
    """The unpacked sources of sglang `version` when a complete earlier download holds them."""
    rec = sources_dir() / f"sglang-{version}" / "sources.json"
    if not rec.is_file():
        return None
    try:
        data = json.loads(rec.read_text())
        out = {k: Fetched(k, v["requirement"], v["wheel"], v["sha256"], v["version"], rec.parent / k)
               for k, v in data["packages"].items()}
    except (ValueError, KeyError, TypeError):
        return None
    return out if set(out) == set(PACKAGES) and all(f.path.is_dir() for f in out.values()) else None


def _pip_download(req: str, dest: Path, progress: Callable[[str], None]) -> Path:
    """Download the one wheel `req` names into `dest`; its path. pip draws its own bar on a terminal."""
    progress(f"downloading {req} with pip")
    tty = sys.stderr.isatty()
    last = ""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    for pyver in dict.fromkeys((here,) + PY_VERSIONS):
        tmp = Path(tempfile.mkdtemp(prefix=".dl.", dir=dest))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", pyver, *(a for p in PLATFORMS for a in ("--platform", p)),
               "-d", str(tmp), req]
        if not tty:
            cmd.insert(4, "-q")
        try:
            # on a terminal pip's progress goes straight to the user's stderr
            proc = subprocess.run(cmd, stdout=(sys.stderr.fileno() if tty else subprocess.PIPE),
                                  stderr=(None if tty else subprocess.STDOUT), text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise AstraError(f"pip download {req} did not finish in 30 minutes") from None
        wheels = sorted(tmp.glob("*.whl"))
        if proc.returncode == 0 and len(wheels) == 1:
            out = dest / wheels[0].name
            os.replace(wheels[0], out)
            shutil.rmtree(tmp, ignore_errors=True)
            return out
        shutil.rmtree(tmp, ignore_errors=True)
        text = proc.stdout or ""
        errs = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ERROR")]
        last = errs[-1] if errs else (text.strip().splitlines() or [f"pip exited {proc.returncode}"])[-1]
        if "No matching distribution" not in text and "Could not find a version" not in text:
            break  # not a tag mismatch (network, index): another python version will not help
    raise AstraError(f"pip could not download {req}: {last.removeprefix('ERROR: ')}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _metadata(whl: Path) -> str:
    with zipfile.ZipFile(whl) as z:
        name = next((n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), None)
        if name is None:
            raise AstraError(f"{whl.name} has no METADATA: not a wheel")
        return z.read(name).decode("utf-8", "replace")


def pinned_requirements(metadata: str) -> Dict[str, str]:
    """{'flashinfer': 'flashinfer-python==0.7.2', 'tvm': 'apache-tvm-ffi==0.1.11'} from sglang's
    METADATA Requires-Dist (extras and markers dropped: only the version specifier matters)."""
    want = {canonicalize_name(dist): key for key, (dist, _) in PACKAGES.items() if key != "sglang"}
    out: Dict[str, str] = {}
    for line in re.findall(r"^Requires-Dist:\s*(.+)$", metadata, re.MULTILINE):
        try:
            r = Requirement(line.strip())
        except InvalidRequirement:
            continue
        key = want.get(canonicalize_name(r.name))
        if key and key not in out and not (r.marker and "extra" in str(r.marker)):
            out[key] = f"{PACKAGES[key][0]}{r.specifier}"
    return out


def _unpack(whl: Path, members: Tuple[str, ...], dest: Path) -> None:
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if not n.endswith("/") and
                 (n.startswith(members) or re.fullmatch(r"[^/]+\.dist-info/METADATA", n))]
        if not any(n.startswith(members) for n in names):
            raise AstraError(f"{whl.name} holds none of {', '.join(members)}: this release is laid out "
                             "differently from what extract knows")
        for n in bar(names, desc=f"unpack {whl.name.split('-')[0]}", unit="file"):
            z.extract(n, dest)


def fetch(version: Optional[str], progress: Callable[[str], None] = lambda s: None) -> Dict[str, Fetched]:
    """The unpacked sglang / flashinfer / tvm-ffi sources of SGLang `version` (default: the installed
    sglang's, else the newest release), from the cache or downloaded into it."""
    version = version or installed_sglang_version()
    if version:
        hit = cached(version)
        if hit:
            progress(f"sources of sglang {version} from the cache ({hit['sglang'].path.parent})")
            return hit
    wheels = sources_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    sg = _pip_download(f"sglang=={version}" if version else "sglang", wheels, progress)
    version = sg.name.split("-")[1]
    hit = cached(version)  # "newest" may be a release fetched before
    if hit:
        progress(f"sources of sglang {version} from the cache ({hit['sglang'].path.parent})")
        return hit
    pins = pinned_requirements(_metadata(sg))
    lost = [PACKAGES[k][0] for k in PACKAGES if k != "sglang" and k not in pins]
    if lost:
        raise AstraError(f"sglang {version}'s METADATA does not require {', '.join(lost)}: this release "
                         "predates the JIT kernels extract knows; pick one with --sglang (e.g. 0.5.17 or newer)")
    files = {"sglang": (f"sglang=={version}", sg)}
    for key, req in pins.items():
        files[key] = (req, _pip_download(req, wheels, progress))

    # Unpack into a temporary folder and move it into place whole: an interrupted run leaves no
    # half-unpacked release that a later run would take for complete.
    final = sources_dir() / f"sglang-{version}"
    tmp = Path(tempfile.mkdtemp(prefix=f".sglang-{version}.", dir=sources_dir()))
    try:
        record = {}
        for key, (req, whl) in files.items():
            progress(f"unpacking {whl.name}")
            _unpack(whl, PACKAGES[key][1], tmp / key)
            record[key] = {"requirement": req, "wheel": whl.name, "sha256": _sha256(whl),
                           "version": whl.name.split("-")[1]}
        (tmp / "sources.json").write_text(json.dumps({
            "sglang": version,
            "fetched": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "packages": record}, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out = cached(version)
    assert out is not None
    return out


def describe(f: Fetched) -> str:
    """Where a downloaded tree came from, for --list and the manifest."""
    return f"{f.wheel} (pip download {f.requirement}, sha256 {f.sha256[:12]})"


def listing() -> List[str]:
    """Releases in the cache, newest first."""
    d = sources_dir()
    if not d.is_dir():
        return []
    vers = [p.name.removeprefix("sglang-") for p in d.glob("sglang-*") if (p / "sources.json").is_file()]
    return sorted(vers, key=lambda v: Version(v) if re.match(r"^\d", v) else Version("0"), reverse=True)
