"""Stand-ins with the exact signatures of SGLang functions, read from an unpacked wheel's source: the patch
adapters' binders are tested against the real parameter lists without importing SGLang."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Dict, Optional


def real_function(pkg_root: Path, module: str, name: str, body: str = "pass",
                  names: Optional[Dict[str, Any]] = None):
    """`module.name` (a module or package under pkg_root, the wheel's top folder) with its own signature and
    `body` (source text); `names` are extra globals its annotations and defaults need."""
    import torch

    path = pkg_root / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = pkg_root / module.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    stub = ast.FunctionDef(name=name, args=fn.args, body=ast.parse(body).body, decorator_list=[], returns=None,
                           type_params=[])
    ns = {"torch": torch, "Optional": object, **(names or {})}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[])), str(path), "exec"), ns)
    return ns[name]
