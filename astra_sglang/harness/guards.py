"""Guarded buffers: every ABI tensor is a view into a larger allocation with guard bytes around it,
so a write outside the buffer shows as changed guard bytes."""
from __future__ import annotations

from typing import Any, Dict, Tuple

from ..spec import OpSpec
from .numerics import poison_

GUARD_BYTES = 64 * 1024  # guard region before and after every ABI buffer
GUARD_BYTE = 0xA5


class GuardedSet:
    """The ABI tensors of one call, each a view into a larger allocation with guard bytes around it."""

    def __init__(self, spec: OpSpec, protos: Dict[str, Any], device: str, guard_bytes: int = GUARD_BYTES):
        import torch

        self.spec = spec
        self.roles = {a.name: a.role for a in spec.abi if a.ctype == "ptr"}
        self.raw: Dict[str, Any] = {}
        self.views: Dict[str, Any] = {}
        self.guard: Dict[str, int] = {}
        for name in self.roles:
            p = protos[name]
            g = guard_bytes // p.element_size() if guard_bytes else 0
            raw = torch.empty(p.numel() + 2 * g, dtype=p.dtype, device=device)
            self.raw[name] = raw
            self.guard[name] = g
            self.views[name] = raw[g:g + p.numel()].view(p.shape)
        self.fill_guards()

    def fill_guards(self) -> None:
        for name, raw in self.raw.items():
            g = self.guard[name]
            if g:
                b = raw.view(-1).view(__import__("torch").uint8)
                gb = g * raw.element_size()
                b[:gb].fill_(GUARD_BYTE)
                b[b.numel() - gb:].fill_(GUARD_BYTE)

    def load(self, inputs: Dict[str, Any]) -> None:
        """Inputs (and inout) copied in, outputs poisoned, guards rewritten."""
        for name, role in self.roles.items():
            if role in ("in", "inout"):
                self.views[name].copy_(inputs[name])
            else:
                poison_(self.views[name])
        self.fill_guards()

    def guard_damage(self) -> Dict[str, Tuple[int, int]]:
        """name -> (bytes changed before the buffer, bytes changed after it)."""
        import torch

        out = {}
        for name, raw in self.raw.items():
            g = self.guard[name]
            if not g:
                continue
            b = raw.view(-1).view(torch.uint8)
            gb = g * raw.element_size()
            before = int((b[:gb] != GUARD_BYTE).sum())
            after = int((b[b.numel() - gb:] != GUARD_BYTE).sum())
            if before or after:
                out[name] = (before, after)
        return out

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.views.values())
