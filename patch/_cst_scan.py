"""The libcst pass of discovery: one file -> its imports, attribute lookups, module-level
functions, JIT loader calls and torch.ops uses, with line numbers and enclosing guards."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider


class _Visitor(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, module: str, is_pkg: bool):
        super().__init__()
        self.module = module
        self.package = module if is_pkg else module.rpartition(".")[0]
        self.scopes: List[str] = []
        self.guards: List[str] = []
        self.imports: List[Tuple[str, str, str, int, str, str]] = []  # (src_mod, name, local, line, scope, guard)
        self.module_aliases: Dict[str, str] = {}  # local -> imported module (import X [as Y])
        self.attrs: List[Tuple[str, str, int, str, str]] = []  # (dotted base, attr, line, scope, guard)
        self.defs: List[Tuple[str, int, str]] = []  # (name, line, guard) module-level functions, "Class.method"
        self.top_class: Optional[str] = None  # the module-level class being visited
        self.jit_calls: List[Tuple[str, List[str], List[str], int, str]] = []  # (func, cuda_files, wrappers, line, guard)
        self.torch_ops: List[Tuple[str, str, int, str, str]] = []  # (ns, name, line, scope, guard)

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _scope(self) -> str:
        return ".".join(self.scopes) if self.scopes else "module"

    def _guard(self) -> str:
        return self.guards[-1] if self.guards else ""

    def _code(self, node: cst.CSTNode) -> str:
        return cst.Module(body=[]).code_for_node(node)

    # scopes and guards
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not self.scopes:
            self.defs.append((node.name.value, self._line(node), self._guard()))
        elif len(self.scopes) == 1 and self.top_class == self.scopes[0]:  # a method of a module-level class
            self.defs.append((f"{self.top_class}.{node.name.value}", self._line(node), self._guard()))
        self.scopes.append(node.name.value)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not self.scopes:
            self.top_class = node.name.value
        self.scopes.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.pop()
        if not self.scopes:
            self.top_class = None

    def visit_If(self, node: cst.If) -> None:
        self.guards.append("if " + " ".join(self._code(node.test).split()))

    def leave_If(self, node: cst.If) -> None:
        self.guards.pop()

    def visit_Try(self, node: cst.Try) -> None:
        self.guards.append("try")

    def leave_Try(self, node: cst.Try) -> None:
        self.guards.pop()

    # imports
    def _resolve(self, node: cst.ImportFrom) -> Optional[str]:
        mod = get_full_name_for_node(node.module) if node.module is not None else ""
        level = len(node.relative)
        if level == 0:
            return mod
        base = self.package.split(".") if self.package else []
        if level - 1 > len(base):
            return None
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([mod] if mod else []))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        src = self._resolve(node)
        if src is None or isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = get_full_name_for_node(alias.name) or ""
            local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else name
            self.imports.append((src, name, local, self._line(node), self._scope(), self._guard()))
            # `from pkg import submodule` makes `local` a module alias too
            self.module_aliases.setdefault(local, f"{src}.{name}")

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = get_full_name_for_node(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.module_aliases[alias.asname.name.value] = full
            else:
                self.module_aliases.setdefault(full.split(".")[0], full.split(".")[0])
                self.module_aliases[full] = full

    def visit_Attribute(self, node: cst.Attribute) -> None:
        full = get_full_name_for_node(node)
        if not full or "." not in full:
            return
        base, _, attr = full.rpartition(".")
        if full.startswith("torch.ops."):
            parts = full.split(".")
            if len(parts) >= 4:
                self.torch_ops.append((parts[2], parts[3], self._line(node), self._scope(), self._guard()))
            return
        self.attrs.append((base, attr, self._line(node), self._scope(), self._guard()))

    def visit_Call(self, node: cst.Call) -> None:
        fn = get_full_name_for_node(node.func) or ""
        if fn.rpartition(".")[2] != "load_jit" or not self.scopes:
            return
        files: List[str] = []
        wrappers: List[str] = []
        for arg in node.args:
            kw = arg.keyword.value if arg.keyword is not None else ""
            if kw == "cuda_files" and isinstance(arg.value, (cst.List, cst.Tuple)):
                for el in arg.value.elements:
                    if isinstance(el.value, cst.SimpleString):
                        files.append(el.value.evaluated_value)
            elif kw == "cuda_wrappers" and isinstance(arg.value, (cst.List, cst.Tuple)):
                for el in arg.value.elements:
                    v = el.value
                    if isinstance(v, cst.Tuple) and v.elements and isinstance(v.elements[0].value, cst.SimpleString):
                        wrappers.append(v.elements[0].value.evaluated_value)
        self.jit_calls.append((self.scopes[0], files, wrappers, self._line(node), self._guard()))


def scan_file(path: Path, module: str) -> Optional[_Visitor]:
    try:
        tree = cst.parse_module(Path(path).read_text(errors="replace"))
    except cst.ParserSyntaxError:
        return None
    v = _Visitor(module, Path(path).name == "__init__.py")
    MetadataWrapper(tree, unsafe_skip_copy=True).visit(v)
    return v
