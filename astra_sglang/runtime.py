"""Deprecated import path: the ctypes loader lives in astra_sglang.build.loader."""
from .build.loader import KernelLib  # noqa: F401
