"""Find where the installed SGLang reaches an op, by reading its source with libcst.

Nothing is imported: the source tree is located with importlib's finder and parsed.
For each op the spec's `replaces` list (module:function) is the seed; discovery reports

  definition         the function itself (module:function in the list, defined there)
  import_binding     `from X import f [as g]` at module level (also under if/try): a name
                     bound at import time, which the patch must rebind in that module
  call_time_import   the same inside a function body: looked up on X at call time
  attribute_lookup   `X.f` through `import X [as Y]`: looked up on X at call time
  jit_factory        a function that JIT-builds the op's production CUDA source
                     (load_jit(..., cuda_files=[...]) naming the spec's sglang_jit file)
  torch_op           `torch.ops.<ns>.<f>` called directly (cannot be rebound; reported)

Re-exports are followed: a module that binds f at import time is itself a source of f
for modules that import it from there (transitively).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from astra_sglang.errors import AstraError

KINDS = ("definition", "import_binding", "call_time_import", "attribute_lookup", "jit_factory", "torch_op")


@dataclass(frozen=True)
class Site:
    op: str
    kind: str
    module: str
    path: str  # relative to the scanned root
    line: int
    target: str  # the "module:function" reached (for jit_factory: the cuda file)
    local_name: str  # name bound in `module` (alias), attribute, or factory function
    scope: str = "module"  # "module" or the enclosing function's qualified name
    guard: str = ""  # innermost enclosing if/try condition, "" when unconditional
    detail: Tuple[Tuple[str, str], ...] = ()

    def info(self) -> Dict[str, str]:
        return dict(self.detail)


@dataclass
class Discovery:
    root: Path  # the directory holding the top-level packages that were scanned
    packages: Tuple[str, ...]
    versions: Dict[str, str]
    sites: List[Site] = field(default_factory=list)
    files_scanned: int = 0

    def for_op(self, op: str, kind: Optional[str] = None) -> List[Site]:
        return [s for s in self.sites if s.op == op and (kind is None or s.kind == kind)]

    def to_json(self) -> str:
        return json.dumps(
            {
                "root": str(self.root),
                "packages": list(self.packages),
                "versions": self.versions,
                "files_scanned": self.files_scanned,
                "sites": [asdict(s) for s in self.sites],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> "Discovery":
        d = json.loads(text)
        sites = [Site(**{**s, "detail": tuple(tuple(x) for x in s.get("detail", ()))}) for s in d["sites"]]
        return cls(Path(d["root"]), tuple(d["packages"]), d["versions"], sites, d.get("files_scanned", 0))


@dataclass(frozen=True)
class OpQuery:
    """What discovery looks for, for one op."""

    op: str
    targets: Tuple[str, ...]  # "module:function"
    jit_files: Tuple[str, ...] = ()  # cuda_files entries of SGLang's JIT loader, e.g. elementwise/activation.cuh


def query_for_spec(spec) -> OpQuery:
    routed = _routed_jit_files(spec.name)
    jit = []
    for v in spec.variants:
        for s in v.sources:
            if s.root == "sglang_jit":
                p = s.path[len("csrc/"):] if s.path.startswith("csrc/") else s.path
                if routed is None or p in routed:
                    jit.append(p)
    return OpQuery(spec.name, tuple(spec.replaces), tuple(dict.fromkeys(jit)))


def _routed_jit_files(op: str) -> Optional[Set[str]]:
    """The JIT sources whose modules the op's adapter routes (None: no adapter to ask). Several ops
    extract from one JIT source (activation.cuh: silu, gelu, gelu_tanh); a factory goes to one op, so
    only an op that routes a method of it may claim it."""
    try:
        from .adapters import get_adapter

        return set(get_adapter(op).jit_routes)
    except AstraError:
        return None


# ---------------------------------------------------------------------- locating sources
# (extract's finders: a package's directory without importing it; a tree's version)
from astra_sglang.extract.sources import _pkg_dir as find_package_dir  # noqa: E402
from astra_sglang.extract.sources import _version_near  # noqa: E402

_DISTS = {"sglang": ("sglang",), "sgl_kernel": ("sglang-kernel", "sgl-kernel"), "flashinfer": ("flashinfer-python",)}


def _version_of(pkg_dir: Path) -> str:
    return _version_near(pkg_dir, _DISTS.get(pkg_dir.name, (pkg_dir.name,)))


def module_name(pkg_dir: Path, path: Path) -> str:
    rel = path.relative_to(pkg_dir.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


# ---------------------------------------------------------------------- discovery
def _candidate_files(pkg_dirs: Sequence[Path], words: Iterable[str]) -> List[Path]:
    words = sorted({w for w in words if w})
    # plain substring test first (fast), then whole-word match
    pat = re.compile("|".join(rf"(?<!\w){re.escape(w)}\b" if re.fullmatch(r"\w+", w) else re.escape(w) for w in words))
    out = []
    for d in pkg_dirs:
        for p in sorted(d.rglob("*.py")):
            try:
                text = p.read_text(errors="replace")
            except OSError:
                continue
            if any(w in text for w in words) and pat.search(text):
                out.append(p)
    return out


def discover(
    queries: Sequence[OpQuery],
    roots: Optional[Dict[str, Path]] = None,
    packages: Sequence[str] = ("sglang", "sgl_kernel", "flashinfer"),
) -> Discovery:
    """Scan the installed (or given) packages for every site of the queried ops.

    roots: package name -> package directory (default: located with importlib, no import).
    """
    pkg_dirs: Dict[str, Path] = {}
    for name in packages:
        d = (roots or {}).get(name) or find_package_dir(name)
        if d is not None and d.is_dir():
            pkg_dirs[name] = Path(d)
    if "sglang" not in pkg_dirs:
        raise AstraError(
            "sglang is not installed here (or not importable): install it (`pip install sglang`, or "
            "`pip install --no-deps sglang` to scan without running it) or pass its source with --sglang-src"
        )
    versions = {n: _version_of(d) for n, d in pkg_dirs.items()}

    # Names to look for, per op; grows with re-exports.
    want: Dict[Tuple[str, str], str] = {}  # (module, name) -> op
    target_of: Dict[Tuple[str, str], str] = {}  # (module, name) -> the seed target it aliases
    for q in queries:
        for t in q.targets:
            mod, _, fn = t.partition(":")
            want[(mod, fn)] = q.op
            target_of[(mod, fn)] = t
    jit_files = {f: q.op for q in queries for f in q.jit_files}

    from ._cst_scan import scan_file  # libcst: only needed to scan, not to read a saved plan

    parsed: Dict[Path, Tuple[str, Any]] = {}

    def parse_new(words: Set[str]) -> bool:
        added = False
        for p in _candidate_files(list(pkg_dirs.values()), words):
            if p in parsed:
                continue
            pkg = next(d for d in pkg_dirs.values() if d in p.parents or d == p.parent)
            mod = module_name(pkg, p)
            v = scan_file(p, mod)
            if v is None:
                continue
            parsed[p] = (mod, v)
            added = True
        return added

    def words(names):  # a method target ("Class.method") is found through its class's name
        return {n.split(".")[0] for n in names}

    searched = words(n for (_, n) in want) | set(jit_files)
    parse_new(searched)

    def rel(p: Path) -> str:
        for d in pkg_dirs.values():
            if d in p.parents:
                return str(p.relative_to(d.parent))
        return str(p)

    sites: Set[Site] = set()
    # Re-export closure: module-level bindings become new sources, to a fixpoint; files
    # mentioning a new alias are parsed as it appears.
    changed = True
    while changed:
        changed = False
        for p, (mod, v) in list(parsed.items()):
            for src, name, local, line, scope, guard in v.imports:
                key = (src, name)
                if key not in want:
                    continue
                op, tgt = want[key], target_of[key]
                kind = "import_binding" if scope == "module" else "call_time_import"
                s = Site(op, kind, mod, rel(p), line, tgt, local, scope, guard, (("from", f"{src}:{name}"),))
                if s not in sites:
                    sites.add(s)
                    changed = True
                if scope == "module" and (mod, local) not in want:
                    want[(mod, local)] = op
                    target_of[(mod, local)] = tgt
                    changed = True
        fresh = words(n for (_, n) in want) - searched
        if fresh:
            searched |= fresh
            changed |= parse_new(fresh)
    for p, (mod, v) in parsed.items():
        for name, line, guard in v.defs:
            if (mod, name) in want and target_of[(mod, name)] == f"{mod}:{name}":
                sites.add(Site(want[(mod, name)], "definition", mod, rel(p), line, f"{mod}:{name}", name, "module", guard))
        for base, attr, line, scope, guard in v.attrs:
            src = v.module_aliases.get(base)
            if src and (src, attr) in want:
                key = (src, attr)
                sites.add(Site(want[key], "attribute_lookup", mod, rel(p), line, target_of[key], attr, scope, guard,
                               (("via", base),)))
        for fn, cfiles, wrappers, line, guard in v.jit_calls:
            for f in cfiles:
                if f in jit_files:
                    sites.add(Site(jit_files[f], "jit_factory", mod, rel(p), line, f, fn, fn, guard,
                                   (("cuda_file", f), ("wrappers", ",".join(wrappers)))))
        for ns, name, line, scope, guard in v.torch_ops:
            for (m, n), op in list(want.items()):
                if n == name and m.split(".")[0] == ns:
                    sites.add(Site(op, "torch_op", mod, rel(p), line, f"torch.ops.{ns}.{name}", name, scope, guard))
    ordered = sorted(sites, key=lambda s: (s.op, KINDS.index(s.kind), s.module, s.line, s.local_name))
    root = pkg_dirs["sglang"].parent
    return Discovery(root, tuple(pkg_dirs), versions, ordered, len(parsed))


def discover_for_specs(specs, roots: Optional[Dict[str, Path]] = None) -> Discovery:
    return discover([query_for_spec(s) for s in specs], roots=roots)


def cache_key(specs, roots: Optional[Dict[str, Path]] = None) -> str:
    h = hashlib.sha256()
    for s in specs:
        q = query_for_spec(s)
        h.update(repr((q.op, q.targets, q.jit_files)).encode())
    for name in ("sglang", "sgl_kernel", "flashinfer"):
        d = (roots or {}).get(name) or find_package_dir(name)
        if d is not None:
            h.update(f"{name}={d}={_version_of(Path(d))}".encode())
            init = Path(d) / "__init__.py"
            if init.exists():
                h.update(str(init.stat().st_mtime_ns).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------- report
_EFFECT = {
    "definition": "replaced on its module",
    "import_binding": "rebound in this module",
    "call_time_import": "sees the replaced module attribute",
    "attribute_lookup": "sees the replaced module attribute",
    "jit_factory": "factory wrapped: the module it returns routes {wrappers} to the astra op",
    "torch_op": "NOT patched (calls the registered torch op directly)",
}


def format_report(disc: Discovery, ops: Sequence[str], jit_methods: Optional[Dict[str, Sequence[str]]] = None) -> str:
    """A human-readable dry-run report: what would be patched where."""
    lines = [f"sglang source: {disc.root} ({', '.join(f'{k} {v}' for k, v in disc.versions.items())}); "
             f"{disc.files_scanned} candidate files parsed"]
    for op in ops:
        sites = disc.for_op(op)
        lines.append(f"\n{op}: {len(sites)} site(s)")
        if not sites:
            lines.append("  (no call sites found in this SGLang: the patch would never run)")
        for kind in KINDS:
            ks = [s for s in sites if s.kind == kind]
            if not ks:
                continue
            effect = _EFFECT[kind]
            if kind == "definition" and all("." in s.local_name for s in ks):
                effect = "replaced on its class (a layer method a fused op replaces)"
            if kind == "jit_factory":
                routed = ",".join((jit_methods or {}).get(op, ())) or "nothing (no adapter)"
                effect = effect.format(wrappers=routed)
            lines.append(f"  {kind} ({len(ks)}): {effect}")
            for s in ks:
                where = f"{s.module}:{s.line}"
                bind = s.local_name if s.kind != "jit_factory" else f"{s.local_name}() [{s.info().get('cuda_file')}]"
                extra = f" <- {s.target}" if s.kind in ("import_binding", "call_time_import", "attribute_lookup") else ""
                ctx = f" in {s.scope}" if s.scope != "module" and s.kind != "jit_factory" else ""
                g = f"  [{s.guard}]" if s.guard else ""
                lines.append(f"    {where:60s} {bind}{extra}{ctx}{g}")
    return "\n".join(lines)
