"""Implementations the worker can call: a built library or a Python stand-in, behind one call."""
from __future__ import annotations

from pathlib import Path

from ..errors import AstraError
from ..spec import OpSpec


class Impl:
    """A callable kernel: a built library (lib:/path.so), a Python stand-in (py:/file.py:function) or the
    installed SGLang callable (installed:module:function, installed.py).

    Python stand-ins take (tensors: dict, dims, dtype: str, scalars: dict) and return an int
    error code; they let the whole harness run on the CPU in tests."""

    def __init__(self, ref: str, spec: OpSpec):
        self.ref = ref
        self.spec = spec
        kind, _, rest = ref.partition(":")
        # installed callables that return their outputs: the copies into the ABI buffers alone (bench times
        # them to take them out of production's time); None for everything else
        self.binding = None
        if kind == "lib":
            from ..build.loader import KernelLib

            self._lib = KernelLib(Path(rest), spec)
            self._py = None
        elif kind == "py":
            import importlib.util

            file, _, fn = rest.rpartition(":")
            mspec = importlib.util.spec_from_file_location(f"astra_stand_in_{abs(hash(file))}", file)
            mod = importlib.util.module_from_spec(mspec)
            assert mspec.loader is not None
            mspec.loader.exec_module(mod)
            self._py = getattr(mod, fn)
            self._lib = None
        elif kind == "installed":  # installed:module:function, SGLang's callable through its adapter
            from .installed import InstalledImpl

            self._lib = InstalledImpl(rest, spec)
            self._py = None
            self.binding = self._lib.binding if self._lib.returns_outputs else None
        else:
            raise AstraError(f"unknown implementation reference {ref!r}")

    def __call__(self, tensors, dims, dtype, scalars, stream=None) -> int:
        if self._lib is not None:
            return self._lib(tensors, dims, dtype, scalars, stream=stream)
        return int(self._py(tensors, dims, dtype, scalars) or 0)


def cuda_error_name(code: int) -> str:
    try:
        import ctypes

        import torch

        rt = torch.cuda.cudart()
        s = rt.cudaGetErrorString(code)
        return s if isinstance(s, str) else ctypes.string_at(s).decode()
    except Exception:
        return f"cudaError {code}"
