"""Op registry: every folder under kernels/ with a spec.py is an op."""
from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

from .errors import AstraError
from .spec import OpSpec

KERNELS_DIR = Path(importlib.import_module("astra_sglang.kernels").__file__).resolve().parent


def op_dir(name: str) -> Path:
    return KERNELS_DIR / name


@lru_cache(maxsize=None)
def _all() -> Dict[str, OpSpec]:
    ops: Dict[str, OpSpec] = {}
    for d in sorted(KERNELS_DIR.iterdir()):
        if d.is_dir() and (d / "spec.py").exists():
            mod = importlib.import_module(f"astra_sglang.kernels.{d.name}.spec")
            spec: OpSpec = mod.SPEC
            ops[spec.name] = spec
    return ops


def op_names() -> List[str]:
    return list(_all())


def get_op(name: str) -> OpSpec:
    ops = _all()
    if name not in ops:
        raise AstraError(f"unknown op {name!r}; known ops: {', '.join(ops)}")
    return ops[name]
