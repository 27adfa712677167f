"""Shared builders for op families: ops whose specs differ only in a formula and their facts.

One module a family (activation: the gated MLP activations; rmsnorm: the RMSNorm family; qkv: the ops over
the q/k/v column blocks of the qkv projection). Each kernels/<op>/spec.py stays the op's one entry point: it
names the op, its provenance and source facts, and calls its family for the rest. Kernels share nothing:
each stays one self-contained source under the ABI (issue 14: share the design, not a header).
"""
from __future__ import annotations

from typing import Sequence, Tuple

from ..spec import AbiArg


def abi(pointers: Sequence[Tuple[str, str]], dim_names: Sequence[str],
        scalars: Sequence[Tuple[str, str]] = ()) -> Tuple[AbiArg, ...]:
    """The ABI convention of every family op: device pointers (name, role), one int64 per shape dim in
    dim_names order, the scalars (name, ctype), then `int dtype` (the stream follows, added by the loader)."""
    return (tuple(AbiArg(n, "ptr", role) for n, role in pointers) + tuple(AbiArg(d, "i64") for d in dim_names)
            + tuple(AbiArg(n, c) for n, c in scalars) + (AbiArg("dtype", "i32"),))
