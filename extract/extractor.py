"""`astra-sglang extract <op>`: production kernel -> standalone workspace."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from astra_sglang.build import Arch, compile_flags, find_nvcc, nvcc_version
from astra_sglang.errors import AstraError
from astra_sglang.registry import op_dir
from astra_sglang.spec import OpSpec, Variant

from .closure import compute_closure
from .sources import Root, Sources

# Where each source root lands inside a workspace's src/.
def _dest(root: str, rel: str) -> str:
    return f"src/{root}/{rel}"


def available_variants(spec: OpSpec, sources: Sources) -> List[Tuple[Variant, bool, str]]:
    """(variant, usable, why-not) for --list."""
    out = []
    for v in spec.variants:
        need = {sf.root for sf in v.sources} | set(v.include_roots)
        missing = [n for n in sorted(need) if not sources.has(n)]
        out.append((v, not missing, "" if not missing else "missing " + ", ".join(missing)))
    return out


def choose_variant(spec: OpSpec, sources: Sources, requested: Optional[str]) -> Variant:
    if requested:
        return spec.variant(requested)
    name = spec.default_variant({n: True for n in sources.roots})
    return spec.variant(name)


def _check_facts(v: Variant, sources: Sources) -> Dict[str, str]:
    """Verify the source facts the launcher relies on; return named captures for substitution."""
    captures: Dict[str, str] = {}
    for rel, regex, meaning in v.source_facts:
        sf = next((s for s in v.sources if s.path == rel), None)
        root = sources.get(sf.root if sf else v.sources[0].root, v.name)
        text = (root.base / rel).read_text(errors="replace")
        m = re.search(regex, text, re.MULTILINE)
        if not m:
            raise AstraError(
                f"{rel} ({root.name} {root.version}) no longer matches what the {v.name} launcher relies on: "
                f"{meaning}; this SGLang version needs a launcher update"
            )
        captures.update({k: val for k, val in m.groupdict().items() if val is not None})
    return captures


def render_launcher(spec: OpSpec, v: Variant, captures: Dict[str, str], header: str) -> str:
    tmpl = (op_dir(spec.name) / v.launcher).read_text()
    text = tmpl
    for k, val in captures.items():
        text = text.replace(f"@{k}@", val)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise AstraError(f"launcher {v.launcher} has unresolved placeholders {sorted(set(left))}")
    if spec.symbol not in text:
        raise AstraError(f"launcher {v.launcher} does not define {spec.symbol}")
    return header + text


def extract(
    spec: OpSpec,
    sources: Sources,
    dest: Path,
    arch: Arch,
    variant: Optional[str] = None,
    force: bool = False,
    progress: Callable[[str], None] = lambda s: None,
) -> Path:
    """Write the workspace for `spec` into `dest` and return it. Never clobbers without force."""
    v = choose_variant(spec, sources, variant)
    if v.requires_root and not sources.has(v.requires_root):
        sources.get(v.requires_root, f"variant {v.name}")
    roots: List[Root] = []
    for name in list(dict.fromkeys([sf.root for sf in v.sources] + list(v.include_roots))):
        roots.append(sources.get(name, f"{spec.name} variant {v.name}"))
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise AstraError(f"workspace {dest} already exists; pass --force to overwrite it")
    find_nvcc()  # fail early and clearly; extraction is only useful with a compiler
    progress(f"variant {v.name}: {v.provenance}")
    captures = _check_facts(v, sources)
    closure = compute_closure([(sources.get(sf.root, v.name), sf.path) for sf in v.sources], roots)
    progress(f"include closure: {len(closure.files)} files from {', '.join(r.name for r in roots)}")

    # Build the new workspace beside the old one and swap at the end, so a failure
    # leaves the existing workspace untouched.
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        files: Dict[str, str] = {}
        for (rname, rel), src in sorted(closure.files.items()):
            out = tmp / _dest(rname, rel)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)
            files[_dest(rname, rel)] = hashlib.sha256(src.read_bytes()).hexdigest()
        closure_sha = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        include_dirs = [f"src/{r.name}/{sub}".rstrip("/.") if sub != "." else f"src/{r.name}" for r in roots for sub in r.include_subdirs]
        for d in include_dirs:
            (tmp / d).mkdir(parents=True, exist_ok=True)
        flags = compile_flags(v.flag_profile, arch, v.extra_flags)
        versions = {r.name: r.version for r in roots}
        header = (
            "// Generated by astra-sglang extract: the production kernel behind the astra ABI.\n"
            f"// op: {spec.name}   variant: {v.name}\n"
            f"// production path: {v.provenance}\n"
            f"// sources: {', '.join(f'{k} {val}' for k, val in versions.items())}\n"
            f"// ABI: {spec.c_signature()}\n\n"
        )
        (tmp / "baseline.cu").write_text(render_launcher(spec, v, captures, header))
        nvcc = find_nvcc()
        (tmp / "build.ninja").write_text(
            "# generated by astra-sglang extract; `ninja -C <workspace>` rebuilds the baseline\n"
            f"nvcc = {nvcc}\n"
            f"flags = {' '.join(flags)} {' '.join('-I' + d for d in include_dirs)}\n"
            "rule nvcc_shared\n  command = $nvcc $flags -shared $in -o $out\n  description = nvcc $in\n"
            "build baseline.so: nvcc_shared baseline.cu\ndefault baseline.so\n"
        )
        (tmp / "candidates").mkdir()
        manifest: Dict[str, Any] = {
            "op": spec.name,
            "variant": v.name,
            "provenance": v.provenance,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "arch": arch.sm,
            "nvcc": nvcc_version(nvcc),
            "flags": flags,
            "include_dirs": include_dirs,
            "abi": spec.c_signature(),
            "symbol": spec.symbol,
            "dtypes": list(v.dtypes),
            "attrs": dict(v.attrs),
            "launch_facts": captures,
            "sources": {
                r.name: {"path": str(r.base), "version": r.version, "origin": r.origin} for r in roots
            },
            "files": files,
            "external_includes": sorted(closure.external),
            "closure_sha256": closure_sha,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if dest.exists():
            backup = dest.with_name(f".{dest.name}.old")
            if backup.exists():
                shutil.rmtree(backup)
            dest.rename(backup)
            tmp.rename(dest)
            shutil.rmtree(backup)
        else:
            tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
