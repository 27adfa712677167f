"""Helpers for the SGLang layers each op's kernels/<op>/layer.py builds for `validate`."""
from __future__ import annotations


def construct(cls, *args, **kwargs):
    """Build an SGLang layer outside a server. sglang 0.5.17's SiluAndMul() reads the runtime
    context in __init__ (ValueError "config namespace 'exec' not published" outside a
    server); its forward_cuda needs none of it, so build it with its base class's __init__."""
    try:
        return cls(*args, **kwargs)
    except ValueError as e:
        if "not published" not in str(e) or args or kwargs:
            raise
        obj = cls.__new__(cls)
        cls.__mro__[1].__init__(obj)
        return obj
