"""Op registry: every folder under kernels/ with a spec.py is an op, and holds its parts.

An op folder kernels/<op>/ holds spec.py (the contract), launch_<variant>.cu.in (extraction),
kernel.cu (the shipped kernel), adapter.py (what patch replaces) and layer.py (what validate
drives). `op_part` loads one part; a missing part is an error that names the file.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Dict, List

from .errors import AstraError
from .spec import OpSpec

KERNELS_DIR = Path(importlib.import_module("astra_sglang.kernels").__file__).resolve().parent

# part -> what it is, for error messages and `astra-sglang ops`
PARTS = {
    "adapter": "the patch adapter (which SGLang callables it replaces)",
    "layer": "the SGLang layer validate drives",
}


def op_dir(name: str) -> Path:
    return KERNELS_DIR / name


@lru_cache(maxsize=None)
def _all() -> Dict[str, OpSpec]:
    ops: Dict[str, OpSpec] = {}
    for d in sorted(KERNELS_DIR.iterdir()):
        if d.is_dir() and (d / "spec.py").exists():
            mod = importlib.import_module(f"astra_sglang.kernels.{d.name}.spec")
            spec: OpSpec = mod.SPEC
            if spec.name != d.name:
                raise AstraError(f"kernels/{d.name}/spec.py names its op {spec.name!r}; the folder and the op "
                                 "must share one name")
            ops[spec.name] = spec
    return ops


def op_names() -> List[str]:
    return list(_all())


def get_op(name: str) -> OpSpec:
    ops = _all()
    if name not in ops:
        raise AstraError(f"unknown op {name!r}; known ops: {', '.join(ops)}")
    return ops[name]


def has_part(name: str, part: str) -> bool:
    return (op_dir(name) / f"{part}.py").is_file()


def op_part(name: str, part: str) -> ModuleType:
    """kernels/<name>/<part>.py as a module; AstraError naming the file when it is missing."""
    get_op(name)
    if not has_part(name, part):
        raise AstraError(f"op {name} has no {PARTS.get(part, part)}: kernels/{name}/{part}.py is missing")
    return importlib.import_module(f"astra_sglang.kernels.{name}.{part}")


def shipped_kernel(name: str) -> Path:
    return op_dir(name) / "kernel.cu"
