"""Installed variants (spec.Variant.callable): production is SGLang's installed Python callable, not a CUDA
source extract could copy (the Triton router, torch.compile'd sums). What extract writes for them: a manifest
that names the callable (module:function) and the source facts checked in the sglang package it was read from
(file, sha256, what each guards); no baseline.cu, nothing to build. check and bench re-check the same facts
against the sglang the worker will import (harness/installed.py: verify_installed) and then run the callable
as the production implementation."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from astra_sglang.errors import AstraError
from astra_sglang.spec import OpSpec, Variant

from .sources import Root, Sources

ROOT = "sglang_py"  # the sglang package dir (sources.discover)


def check_facts(v: Variant, base: Path, where: str) -> Tuple[Dict[str, str], List[Dict[str, str]]]:
    """Every (file, regex, meaning) of the installed variant `v` against the sglang package at `base`.
    Returns (named captures, one record per fact: file, sha256, meaning). Raises a one-line AstraError
    naming the first fact that no longer holds (`where` says which sglang)."""
    captures: Dict[str, str] = {}
    records: List[Dict[str, str]] = []
    texts: Dict[str, str] = {}
    for rel, regex, meaning in v.source_facts:
        if rel not in texts:
            f = base / rel
            if not f.is_file():
                raise AstraError(f"{rel} is not in {where}: the {v.name} variant's source facts cannot be checked "
                                 "(this SGLang version needs a spec update)")
            texts[rel] = f.read_text(errors="replace")
        m = re.search(regex, texts[rel], re.MULTILINE)
        if not m:
            raise AstraError(f"{rel} ({where}) no longer matches what the {v.name} baseline relies on: {meaning}; "
                             "this SGLang version needs a spec update")
        captures.update({k: val for k, val in m.groupdict().items() if val is not None})
        records.append({"file": rel, "sha256": hashlib.sha256(texts[rel].encode()).hexdigest(), "meaning": meaning})
    return captures, records


def manifest_for(spec: OpSpec, v: Variant, root: Root, arch_sm: Optional[str], flags: List[str],
                 captures: Dict[str, str], facts: List[Dict[str, str]]) -> Dict[str, Any]:
    return {
        "op": spec.name,
        "variant": v.name,
        "kind": "installed",
        "callable": v.callable,
        "provenance": v.provenance,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "arch": arch_sm,
        "flags": flags,  # what candidates are built with (the op's kernel flags)
        "include_dirs": [],
        "abi": spec.c_signature(),
        "symbol": spec.symbol,
        "dtypes": list(v.dtypes),
        "attrs": dict(v.attrs),
        "launch_facts": captures,
        "source_facts": facts,
        "sources": {root.name: {"path": str(root.base), "version": root.version, "origin": root.origin}},
        "files": {},
        "closure_sha256": hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest(),
    }


def extract_installed(spec: OpSpec, v: Variant, sources: Sources, dest: Path, arch_sm: Optional[str],
                      flags: List[str], progress: Callable[[str], None] = lambda s: None) -> Path:
    """Write the installed variant's workspace into `dest` (checked by the caller: absent or --force)."""
    root = sources.get(ROOT, f"{spec.name} variant {v.name}")
    progress(f"variant {v.name}: production is the installed callable {v.callable}")
    captures, facts = check_facts(v, root.base, f"sglang {root.version} at {root.base}")
    progress(f"{len(facts)} source facts hold in sglang {root.version}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        (tmp / "candidates").mkdir()
        m = manifest_for(spec, v, root, arch_sm, flags, captures, facts)
        (tmp / "manifest.json").write_text(json.dumps(m, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
