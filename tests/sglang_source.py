"""SGLang's own methods compiled at test time from an unpacked wheel's source, for the tests' stand-in classes: the
project never commits code copied from SGLang, FlashInfer or any other project, so a stand-in runs the real body read
from the wheel instead of a copy written out in the test (sglang_signatures.real_function gives a signature alone)."""
from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any, Dict


def _sglang_root(version, request) -> Path:
    """The unpacked sglang package of `version`: 0.5.17 (what the GPU machine serves) or the pinned 0.5.23."""
    return (Path(request.getfixturevalue("sglang_0_5_17_source")) if version == "0.5.17"
            else Path(request.getfixturevalue("wheel_sources")["sglang"])) / "sglang"


def _class(root: Path, rel: str, name: str) -> ast.ClassDef:
    tree = ast.parse((root / rel).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def compile_method(root: Path, rel: str, cls: str, name: str, namespace: Dict[str, Any]):
    """SGLang's `cls.name` from root / rel (root: the sglang package, as `_class` takes it) as a plain function whose
    globals are `namespace`: what the body reads at module level (pass a stand-in module's __dict__ and the body reads
    that module's names at call time, as SGLang's does). Decorators and annotations are dropped, so the names they use
    need not exist. Compiled inside a class of its own name: __qualname__ and the code's co_qualname are `cls.name`,
    private names mangle as in SGLang."""
    fn = copy.deepcopy(_method(_class(root, rel, cls), name))
    fn.decorator_list, fn.returns = [], None
    a = fn.args
    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
        if arg is not None:
            arg.annotation = None
    holder = ast.ClassDef(name=cls, bases=[], keywords=[], body=[fn], decorator_list=[], type_params=[])
    scope: Dict[str, Any] = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[holder], type_ignores=[])), str(root / rel), "exec"),
         namespace, scope)
    method = scope[cls].__dict__[name]
    # a zero-argument super() would bind the holder class, not the stand-in the method is set on
    assert method.__closure__ is None, f"{cls}.{name} uses super()"
    return method
