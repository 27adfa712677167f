"""Every validate layer (kernels/<op>/layer.py) that unpacks `dims` whole names as many dims as its op's spec has.
validate runs these only on a GPU with SGLang installed; gemma_qknorm_rope's spec gained a seventh dim (q_out_stride)
while its layer still unpacked six, and every validate case on the H200 refused with "too many values to unpack"
(2026-11-30). This reads the layers' source, so the CPU suite catches it."""
from __future__ import annotations

import ast

import pytest

from astra_sglang.registry import get_op, has_part, op_dir, op_names

LAYER_OPS = [op for op in op_names() if has_part(op, "layer")]


def _whole_unpackings(tree: ast.AST):
    """(line, names) of each `a, b, ... = dims` (dims itself, not a slice of it)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "dims":
            for tgt in node.targets:
                if isinstance(tgt, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in tgt.elts):
                    yield node.lineno, len(tgt.elts)


def test_some_layers_are_checked():
    assert {"gemma_qknorm_rope", "dense_rope_store", "moe_align"} <= set(LAYER_OPS)


@pytest.mark.parametrize("op", LAYER_OPS)
def test_a_layer_unpacks_as_many_dims_as_its_spec_has(op):
    n = len(get_op(op).dim_names)
    tree = ast.parse((op_dir(op) / "layer.py").read_text())
    bad = [f"line {line}: {k} names" for line, k in _whole_unpackings(tree) if k != n]
    assert not bad, f"{op}'s layer.py unpacks dims into the wrong number of names (the spec has {n}): {bad}"
