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
        self._plan: Optional[list] = None

    def args(self, tensors: Mapping[str, Any], dims: Sequence[int], dtype: str,
             scalars: Optional[Mapping[str, Any]] = None) -> list:
        """The ABI's arguments in order (pointers as ints: argtypes makes them void*). On the hot path of every
        patched eager call, so the ABI is walked through a plan made once."""
        plan = self._plan
        if plan is None:
            plan = self._plan = self._make_plan()
        out = []
        for kind, key in plan:
            if kind == 0:
                out.append(tensors[key].data_ptr())
            elif kind == 1:
                out.append(int(dims[key]))
            elif kind == 2:
                if scalars is None or key not in scalars:
                    raise AstraError(f"no value for ABI argument {key!r} of {self.spec.name}")
                out.append(scalars[key])
            else:
                out.append(DTYPE_CODES[dtype])
        return out

    def _make_plan(self) -> list:
        """(0, tensor name) | (1, dim index) | (2, scalar name) | (3, None: the dtype code), per ABI argument."""
        dims = {n: i for i, n in enumerate(self.spec.dim_names)}
        plan = []
        for a in self.spec.abi:
            if a.ctype == "ptr":
                plan.append((0, a.name))
            elif a.name == "dtype":
                plan.append((3, None))
            elif a.name in dims:
                plan.append((1, dims[a.name]))
            else:
                plan.append((2, a.name))
        return plan

    def __call__(self, tensors: Mapping[str, Any], dims: Sequence[int], dtype: str,
                 scalars: Optional[Mapping[str, Any]] = None, stream: Optional[int] = None) -> int:
        """Launch on `stream` (default: torch's current stream). Returns the cudaError_t code."""
        if stream is None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        return int(self._fn(*self.args(tensors, dims, dtype, scalars), ctypes.c_void_p(stream)))
