"""astra's shipped linear as bench's in-context neighbour GEMM (`bench --neighbours astra`), and astra's rmsnorm as the
norm serving runs between an op and its consumer GEMM at some sites (sites.Site.norm_after).

In a patched server the GEMMs around a decode op are astra's linear wherever its adapter takes the call, not cuBLAS.
The in-context floor depends on the producer's last kernel: 0.2-0.3 µs behind cuBLAS's split-K reduce kernel,
1.5-1.9 µs behind a single nvjet GEMM kernel (H200, 2026-11-28, kernels/NOTES.md fifteenth). linear releases its
dependents right after its own PDL wait. So the op is timed between the GEMMs the patched server runs: astra's linear
where `linear`'s adapter takes the [tokens, in] x [out, in] shape, else cuBLAS (F.linear) as before."""
from __future__ import annotations

from typing import Any, Optional

DTYPE_CODES = {"torch.float16": 1, "torch.bfloat16": 2}  # the linear ABI's dtype argument


def linear_declines(tokens: int, in_features: int, out_features: int, dtype: Any) -> Optional[str]:
    """Why the patched server would leave this GEMM to cuBLAS (linear's adapter, the same rule serving applies), or
    None where astra's linear runs it."""
    if str(dtype) not in DTYPE_CODES:
        return f"{dtype}: linear takes fp16 / bf16"
    from ..patch.adapters import get_adapter

    return get_adapter("linear").kept_by_sglang((int(tokens), int(in_features), int(out_features)))


def load_abi(lib_path: str, symbol: str, argtypes: list):
    """A built astra kernel library's extern "C" entry, typed (returns its cudaError_t as an int)."""
    import ctypes

    f = getattr(ctypes.CDLL(lib_path, mode=ctypes.RTLD_LOCAL), symbol)
    f.argtypes, f.restype = argtypes, ctypes.c_int
    return f


class AstraLinear:
    """The shipped kernels/linear/kernel.cu, built (patch.apply.build_kernel) and called through its C ABI on the
    current stream: out[t, n] = x[t, :] . w[n, :], x [tokens, in], w [out, in], out [tokens, out], contiguous."""

    def __init__(self, lib_path: str):
        import ctypes

        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.fn = load_abi(lib_path, "astra_linear", [p, p, p, i64, i64, i64, ctypes.c_int, p])

    declines = staticmethod(linear_declines)   # what timer.Neighbours asks of a neighbour GEMM

    def __call__(self, x, w, out) -> None:
        import ctypes

        import torch

        if not (x.is_contiguous() and w.is_contiguous() and out.is_contiguous()):
            raise RuntimeError("astra linear as a neighbour: x, weight and out must be contiguous")
        rc = self.fn(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                     x.shape[0], x.shape[1], w.shape[0], DTYPE_CODES[str(x.dtype)],
                     ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc:
            raise RuntimeError(f"astra linear (a neighbour GEMM) returned cudaError {rc}")


class AstraRMSNorm:
    """The shipped kernels/rmsnorm/kernel.cu, built and called through its C ABI on the current stream, as the norm a
    patched server runs between an op and the consumer GEMM (sites.Site.norm_after): out = x / rms(x) * weight, out of
    place. It stands in for the residual-add norm serving runs there (fused_add_rmsnorm): the same PDL wait first and
    early release of its dependents, without writing the op's output, which bench checks after timing."""

    EPS = 1e-6

    @staticmethod
    def declines(dtype: Any) -> Optional[str]:
        """Why it cannot run after an op of this output dtype (timer.Neighbours asks before capturing), else None."""
        return None if str(dtype) in DTYPE_CODES else f"{dtype}: astra's rmsnorm takes fp16 / bf16"

    def __init__(self, lib_path: str):
        import ctypes

        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.fn = load_abi(lib_path, "astra_rmsnorm", [p, p, p, i64, i64, ctypes.c_double, ctypes.c_int, p])

    def __call__(self, x, weight, out) -> None:
        import ctypes

        import torch

        if str(x.dtype) not in DTYPE_CODES or not (x.is_contiguous() and out.is_contiguous()):
            raise RuntimeError("astra rmsnorm as a neighbour: fp16 / bf16, contiguous x and out")
        rc = self.fn(ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(weight.data_ptr()),
                     x.shape[0], x.shape[1], self.EPS, DTYPE_CODES[str(x.dtype)],
                     ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc:
            raise RuntimeError(f"astra rmsnorm (a neighbour) returned cudaError {rc}")
