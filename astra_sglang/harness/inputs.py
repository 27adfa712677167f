"""Inputs of one case and the production variant's conventions: fresh random inputs (never zeros),
conversion to and from the variant's ABI (e.g. base-2 lse), the reference's keyword arguments."""
from __future__ import annotations

from typing import Any, Dict, Optional

from ..errors import AstraError
from ..spec import OpSpec


def make_case_inputs(spec: OpSpec, dims, dtype: str, dist: str, seed: int, device: str) -> Dict[str, Any]:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    inputs = spec.make_inputs(tuple(dims), dtype, gen, dist, device=device)
    for a in spec.abi:
        if a.ctype == "ptr" and a.role in ("in", "inout"):
            t = inputs[a.name]
            if t.numel() and t.is_floating_point() and not bool((t != 0).any()):
                raise AstraError(f"{spec.name} make_inputs gave an all-zero {a.name!r} ({dist}): inputs must never be zeros")
    return inputs


def to_prod_abi(spec: OpSpec, tensors: Dict[str, Any], attrs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The tensors the production variant's kernel takes (spec.to_variant_abi, e.g. base-2 lse for
    FlashInfer's merge_state). Candidates take the op's own convention, unconverted."""
    if attrs and spec.to_variant_abi is not None:
        return spec.to_variant_abi(tensors, attrs)
    return tensors


def from_prod_abi(spec: OpSpec, views: Dict[str, Any], attrs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Copies of the production variant's outputs, in the op's convention (spec.from_variant_abi)."""
    names = [a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("out", "inout")]
    if attrs and spec.from_variant_abi is not None:
        conv = {n: views[n].new_empty(views[n].shape) for n in names}
        spec.from_variant_abi(views, conv, attrs)
        return conv
    return {n: views[n].clone() for n in names}


def takes_model_dtype(spec: OpSpec) -> bool:
    """Whether the op's reference declares the `model_dtype` keyword (spec.py's reference contract)."""
    import inspect

    try:
        return "model_dtype" in inspect.signature(spec.reference).parameters
    except (TypeError, ValueError):
        return False


def reference_kwargs(spec: OpSpec, attrs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Workspace attrs the reference takes as keyword arguments (e.g. merge_state's `semantics`):
    the production variant is judged against its own semantics, candidates against the op's."""
    import inspect

    if not attrs:
        return {}
    try:
        params = list(inspect.signature(spec.reference).parameters.values())[3:]
    except (TypeError, ValueError):
        return {}
    return {p.name: attrs[p.name] for p in params if p.name in attrs}
