"""Call a built kernel through the astra ABI with ctypes, on the caller's current CUDA stream."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..errors import AstraError
from ..spec import DTYPE_CODES, OpSpec


class KernelLib:
    """A loaded baseline or candidate library exposing `astra_<op>`."""

    def __init__(self, path: Path, spec: OpSpec):
        self.path = Path(path)
        self.spec = spec
        try:
            # RTLD_LOCAL: two builds of one op (baseline, candidate) coexist in a process.
            self._lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise AstraError(f"cannot load {self.path}: {e}") from e
        try:
            self._fn = getattr(self._lib, spec.symbol)
        except AttributeError as e:
            raise AstraError(f"{self.path.name} does not export {spec.symbol} (the op's ABI entry point)") from e
        self._fn.argtypes = spec.ctypes_argtypes()
        self._fn.restype = ctypes.c_int

    def args(self, tensors: Mapping[str, Any], dims: Sequence[int], dtype: str,
             scalars: Optional[Mapping[str, Any]] = None) -> list:
        dimv = dict(zip(self.spec.dim_names, dims))
        scalars = dict(scalars or {})
        out = []
        for a in self.spec.abi:
            if a.ctype == "ptr":
                out.append(ctypes.c_void_p(tensors[a.name].data_ptr()))
            elif a.name == "dtype":
                out.append(DTYPE_CODES[dtype])
            elif a.name in dimv:
                out.append(int(dimv[a.name]))
            elif a.name in scalars:
                out.append(scalars[a.name])
            else:
                raise AstraError(f"no value for ABI argument {a.name!r} of {self.spec.name}")
        return out

    def __call__(self, tensors: Mapping[str, Any], dims: Sequence[int], dtype: str,
                 scalars: Optional[Mapping[str, Any]] = None, stream: Optional[int] = None) -> int:
        """Launch on `stream` (default: torch's current stream). Returns the cudaError_t code."""
        if stream is None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        return int(self._fn(*self.args(tensors, dims, dtype, scalars), ctypes.c_void_p(stream)))
