"""Import REAL SGLang modules on a CPU-only CI machine, for the patch tests.

`pip install --no-deps sglang` (here: the unpacked 0.5.23 wheel) gives SGLang's source but
none of its dependencies, and `import sglang` pulls in half of them. This module makes the
modules the patch touches importable anyway, without running sglang/__init__.py:

- `sglang` is registered as a bare package over the real source directory, so
  `import sglang.srt.layers.activation` runs the real activation.py (and the real modules
  it imports) but not sglang/__init__.py;
- third-party packages SGLang needs and CI does not have (triton, transformers, ...) and a
  few heavy SGLang subpackages that only matter at serving time (distributed, model
  executor, quantization configs, runtime context) are permissive stubs;
- `sgl_kernel` is a stub whose silu_and_mul / fused_add_rmsnorm / merge_state_v2 are CPU
  implementations with sgl-kernel's Python signatures and semantics (tests stand-ins for
  the production kernels);
- `is_cuda()` answers True, so the modules take their CUDA branches and bind the
  production callables at import time exactly as on a GPU server.

Run it in a subprocess (it changes sys.modules / sys.meta_path for good).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

STUB_TOP = ("triton", "orjson", "psutil", "pybase64", "requests", "starlette", "msgspec", "pydantic_core", "zmq",
            "transformers", "tvm_ffi", "pynvml", "tqdm", "IPython", "pydantic", "torchvision")
STUB_SGLANG = ("sglang.srt.distributed", "sglang.srt.layers.quantization", "sglang.srt.model_executor",
               "sglang.srt.runtime_context", "sglang.srt.batch_invariant_ops")


class _StubMeta(type):
    """Stand-in for anything: attributes, calls, subscripts, base classes, decorators."""

    def __new__(mcls, name, bases=(), ns=None, **kw):
        ns = dict(ns or {})
        ns.setdefault("__init_subclass__", classmethod(lambda cls, **k: None))
        return super().__new__(mcls, name, bases, ns)

    def __init__(cls, name, bases=(), ns=None, **kw):
        super().__init__(name, bases, ns or {})

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name)

    def __call__(cls, *a, **k):
        if len(a) == 1 and not k and callable(a[0]) and not isinstance(a[0], _StubMeta):
            return a[0]  # used as a decorator
        return _StubMeta("call")

    def __getitem__(cls, i):
        return cls

    def __setitem__(cls, i, v):
        pass

    def __contains__(cls, i):
        return False

    def __len__(cls):
        return 0

    def __iter__(cls):
        return iter(())

    def __or__(cls, o):
        return cls

    def __ror__(cls, o):
        return cls


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STUB_TOP or any(fullname == p or fullname.startswith(p + ".") for p in STUB_SGLANG):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


# ---------------------------------------------------------------------- sgl_kernel stand-ins
def make_sgl_kernel(name: str = "sgl_kernel"):
    """A stub `sgl_kernel` with CPU versions of the production callables (sgl-kernel's
    Python signatures, FlashInfer/sgl-kernel semantics); `calls` counts their calls."""
    import torch

    m = StubModule(name)
    m.__path__ = []

    def silu_and_mul(input, out=None):
        d = input.shape[-1] // 2
        if out is None:
            out = input.new_empty(input.shape[:-1] + (d,))
        x = input.float()
        out.copy_((torch.nn.functional.silu(x[..., :d]) * x[..., d:]).to(out.dtype))
        return out

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
        s = input.float() + residual.float()
        residual.copy_(s.to(residual.dtype))
        input.copy_((s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(input.dtype))

    def merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
        s_a = s_a.to(torch.float32)
        s_b = s_b.to(torch.float32)
        if v_merged is None:
            v_merged = torch.empty_like(v_a)
        if s_merged is None:
            s_merged = torch.empty_like(s_a)
        ninf = torch.full_like(s_a, float("-inf"))
        a = torch.where(torch.isinf(s_a), ninf, s_a)
        b = torch.where(torch.isinf(s_b), ninf, s_b)
        mx = torch.maximum(a, b)
        p, q = torch.exp(a - mx), torch.exp(b - mx)
        v = (v_a.float() * (p / (p + q)).unsqueeze(-1) + v_b.float() * (q / (p + q)).unsqueeze(-1))
        v_merged.copy_(v.to(v_merged.dtype))
        s_merged.copy_(torch.log(p + q) + mx)
        return v_merged, s_merged

    m.silu_and_mul = silu_and_mul
    m.fused_add_rmsnorm = fused_add_rmsnorm
    m.merge_state_v2 = merge_state_v2
    m.calls = {"silu_and_mul": 0, "fused_add_rmsnorm": 0, "merge_state_v2": 0}
    for fname in list(m.calls):
        fn = getattr(m, fname)

        def counted(*a, _fn=fn, _n=fname, **k):
            m.calls[_n] += 1
            return _fn(*a, **k)

        counted.__name__ = fname
        counted.__wrapped__ = fn
        setattr(m, fname, counted)
    return m


def fake_production(name: str = "fake_sk"):
    """make_sgl_kernel() registered as module `name`, for tests that patch it via targets=."""
    sys.modules[name] = make_sgl_kernel(name)
    return sys.modules[name]


# ---------------------------------------------------------------------- astra kernels on CPU
def astra_standins(wrong=()):
    """CPU stand-ins for the astra kernels, behind the ABI (views, dims, scalars).
    Ops named in `wrong` compute a deliberately wrong result (one element off)."""
    import torch

    from astra_sglang.patch.ops import TorchBackend

    def silu(v, dims, sc):
        d = dims[1]
        x = v["input"].float()
        v["out"].copy_((torch.nn.functional.silu(x[:, :d]) * x[:, d:]).to(v["out"].dtype))
        if "silu_and_mul" in wrong:
            v["out"][0, 0] += 1.0

    def rms(v, dims, sc):
        s = v["input"].float() + v["residual"].float()
        v["residual"].copy_(s.to(v["residual"].dtype))
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + sc["eps"]) * v["weight"].float()
        v["input"].copy_(y.to(v["input"].dtype))
        if "fused_add_rmsnorm" in wrong:
            v["residual"][-1, -1] += 1.0  # the in-place side effect is wrong

    def merge(v, dims, sc):
        ninf = torch.full_like(v["s_a"], float("-inf"))
        a = torch.where(torch.isinf(v["s_a"]), ninf, v["s_a"])
        b = torch.where(torch.isinf(v["s_b"]), ninf, v["s_b"])
        mx = torch.maximum(a, b)
        p, q = torch.exp(a - mx), torch.exp(b - mx)
        out = v["v_a"].float() * (p / (p + q)).unsqueeze(-1) + v["v_b"].float() * (q / (p + q)).unsqueeze(-1)
        v["v_out"].copy_(out.to(v["v_out"].dtype))
        v["s_out"].copy_(torch.log(p + q) + mx)
        if "merge_state" in wrong:
            v["s_out"].mul_(2.0)  # wrong lse base

    fns = {"silu_and_mul": silu, "fused_add_rmsnorm": rms, "merge_state": merge}
    return {op: TorchBackend(f"cpu stand-in{' (WRONG)' if op in wrong else ''}", fn) for op, fn in fns.items()}


def install(sglang_root: Path, with_sgl_kernel: bool = True) -> None:
    """Make real modules under `sglang_root` (the directory holding sglang/) importable."""
    pkg = Path(sglang_root) / "sglang"
    if "sglang" not in sys.modules:
        m = types.ModuleType("sglang")
        m.__path__ = [str(pkg)]
        m.__file__ = str(pkg / "__init__.py")
        sys.modules["sglang"] = m
    import torch  # noqa: F401  (before the stub finder: torch has optional imports of its own)

    sys.meta_path.insert(0, _StubFinder())
    if with_sgl_kernel:
        sys.modules["sgl_kernel"] = make_sgl_kernel()
    common = importlib.import_module("sglang.srt.utils.common")
    utils = importlib.import_module("sglang.srt.utils")
    common.is_cuda = utils.is_cuda = lambda: True
