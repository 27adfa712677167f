"""Include-closure scan: every header a production source pulls in, ROCm branches skipped.

The scan mirrors the compiler's lookup: a quoted include tries the including file's
directory first, an angled one does not; both then try each root's include dirs in
order (the workspace's -I order).
Headers that resolve nowhere (CUDA toolkit, libc++, cub) stay external and are
recorded, not copied.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .sources import Root

_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w+)(.*)$")
_INCLUDE_ARG = re.compile(r'^\s*[<"]([^>"]+)[>"]')
# A conditional that selects the ROCm/HIP (or other non-CUDA vendor) build.
_ROCM = re.compile(r"USE_ROCM|__HIP_PLATFORM_AMD__|__HIPCC__|__HIP__|USE_MUSA|__MUSACC__|FLASHINFER_ENABLE_HIP")


def _rocm_polarity(directive: str, arg: str) -> Optional[bool]:
    """True when the branch is ROCm-only, False when it is the CUDA-only side, None if unrelated."""
    if not _ROCM.search(arg):
        return None
    if directive == "ifdef":
        return True
    if directive == "ifndef":
        return False
    a = arg.strip()
    if directive in ("if", "elif"):
        if re.fullmatch(r"!\s*defined\s*\(?\s*\w+\s*\)?", a):
            return False
        if re.fullmatch(r"defined\s*\(?\s*\w+\s*\)?(\s*\|\|\s*defined\s*\(?\s*\w+\s*\)?)*", a) or re.fullmatch(r"\w+", a):
            return True
    return None  # a compound condition: keep both branches (safe: may copy more)


def scan_include_directives(text: str) -> List[Tuple[str, bool]]:
    """(target, angled) for each #include of `text` outside ROCm-only branches, in order."""
    out: List[Tuple[str, bool]] = []
    # Stack of (skip_this_branch, polarity) for each open conditional.
    stack: List[Tuple[bool, Optional[bool]]] = []
    for line in text.splitlines():
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        d, arg = m.group(1), m.group(2)
        if d in ("if", "ifdef", "ifndef"):
            pol = _rocm_polarity(d, arg)
            stack.append((pol is True, pol))
        elif d == "elif":
            if stack:
                _, pol = stack[-1]
                newpol = _rocm_polarity("elif", arg)
                # after a CUDA-only branch, an elif is the non-CUDA side
                stack[-1] = ((newpol is True) or (pol is False), pol if newpol is None else newpol)
        elif d == "else":
            if stack:
                _, pol = stack[-1]
                stack[-1] = (pol is False, pol)
        elif d == "endif":
            if stack:
                stack.pop()
        elif d == "include":
            if any(skip for skip, _ in stack):
                continue
            im = _INCLUDE_ARG.match(arg)
            if im:
                out.append((im.group(1), arg.strip().startswith("<")))
    return out


def scan_includes(text: str) -> List[str]:
    """The include targets of `text` outside ROCm-only branches, in order."""
    return [t for t, _ in scan_include_directives(text)]


@dataclass
class Closure:
    # (root name, path relative to root base) -> absolute source path
    files: Dict[Tuple[str, str], Path] = field(default_factory=dict)
    external: Set[str] = field(default_factory=set)


def _locate(target: str, including: Path, roots: Sequence[Root], angled: bool = False) -> Optional[Tuple[Root, Path]]:
    """The compiler's lookup: a quoted include tries the including file's directory first;
    both forms then try each root's include dirs in order (the -I order of the build)."""
    cands: List[Tuple[Root, Path]] = []
    for r in roots if not angled else ():
        try:
            including.relative_to(r.base)
            cands.append((r, including.parent / target))
        except ValueError:
            pass
    for r in roots:
        for sub in r.include_subdirs:
            cands.append((r, r.base / sub / target))
    for r, c in cands:
        if c.is_file():
            c = Path(_normalize(c))
            try:
                c.relative_to(r.base)
            except ValueError:
                continue
            return r, c
    return None


def _normalize(p: Path) -> str:
    parts: List[str] = []
    for part in p.parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return str(Path(*parts))


def compute_closure(start: Sequence[Tuple[Root, str]], roots: Sequence[Root]) -> Closure:
    """Breadth-first closure of `start` files (root, relative path) over `roots`."""
    cl = Closure()
    todo: List[Tuple[Root, Path]] = []
    for r, rel in start:
        p = r.base / rel
        if not p.is_file():
            from astra_sglang.errors import AstraError

            raise AstraError(f"production source {rel} not found under {r.base} ({r.name} {r.version})")
        todo.append((r, Path(_normalize(p))))
    while todo:
        r, p = todo.pop(0)
        key = (r.name, str(p.relative_to(r.base)))
        if key in cl.files:
            continue
        cl.files[key] = p
        for target, angled in scan_include_directives(p.read_text(errors="replace")):
            hit = _locate(target, p, roots, angled)
            if hit is None:
                cl.external.add(target)
            else:
                todo.append(hit)
    return cl
