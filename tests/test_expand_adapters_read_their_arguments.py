"""An adapter with `expand` is not held to the binder's rule that every argument it does not map keeps its default
(patch/adapters.py Binder.bind hands expand every bound value): a parameter SGLang adds with a default, passed
non-default, would go unread and the call be taken as if it were not there. That is how 0.5.23's
fused_experts(fuse_swiglu_interleaved=True) would have reached moe_experts' kernel with interleaved weights (fixed
2026-12-01). So: every parameter with a default of every target an expand adapter replaces, in both SGLang versions,
is named in the adapter's source (or an adapter it imports), where it is read or declined."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from astra_sglang.registry import get_op, op_names, op_part
from sglang_source import _sglang_root

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _defaults(pkg: Path, target: str):
    """The names of target's parameters that have a default, or None where this version has no such function."""
    module, qual = target.split(":")
    path = pkg.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = pkg.parent / module.replace(".", "/") / "__init__.py"
    if not path.exists():
        return None
    scope: ast.AST = ast.parse(path.read_text())
    *owner, name = qual.split(".")
    for cls in owner:
        scope = next((n for n in ast.walk(scope) if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if scope is None:
            return None
    fn = next((n for n in ast.walk(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
              None)
    if fn is None:
        return None
    a = fn.args
    pos = a.posonlyargs + a.args
    return ([p.arg for p in pos[len(pos) - len(a.defaults):]] +
            [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None])


def _adapter_source(op: str) -> str:
    src = (KERNELS / op / "adapter.py").read_text()
    for dep in set(re.findall(r"from astra_sglang\.kernels\.(\w+)(?:\.adapter import| import adapter)", src)):
        src += (KERNELS / dep / "adapter.py").read_text()
    return src


def _expand_ops():
    return [op for op in op_names()
            if (KERNELS / op / "adapter.py").exists() and op_part(op, "adapter").ADAPTER.expand is not None]


def test_some_adapters_expand():
    assert {"moe_experts", "moe_topk_experts", "qknorm_rope_store", "gate_up_silu"} <= set(_expand_ops())


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_every_defaulted_parameter_of_an_expand_target_is_named_by_its_adapter(which, request):
    pkg = _sglang_root(which, request)
    unread, found = [], 0
    for op in _expand_ops():
        src = _adapter_source(op)
        for target in get_op(op).replaces:
            names = _defaults(pkg, target)
            if names is None:
                continue
            found += 1
            unread += [f"{op}: {target}({n}=...)" for n in names if f'"{n}"' not in src and f"'{n}'" not in src]
    assert found >= 10, found
    assert not unread, "read or decline these in the adapter's expand: " + "; ".join(unread)
