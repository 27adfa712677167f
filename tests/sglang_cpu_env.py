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
- `sgl_kernel` is a stub whose functions are generated from the op registry: for every
  `sgl_kernel:<fn>` a spec replaces, a CPU function with sgl-kernel's Python signature (from
  the spec's ABI and the adapter) computing the spec's reference (stand-ins for the
  production kernels); a new op folder needs no edit here;
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


# ---------------------------------------------------------------------- stand-ins from the registry
def production_signature(spec, adapter):
    """The Python signature sgl-kernel gives the op, derived from the spec's ABI and the adapter, in
    sgl-kernel's order: inputs and in-place tensors, outputs the caller must pass, scalars with the
    spec's defaults, outputs the adapter can allocate (`out=None`), the ignorable parameters
    (`enable_pdl=None`); each under its ABI name, outputs under the first adapter alias that names
    them (merge_state's v_out is sgl-kernel's v_merged). E.g. rmsnorm(input, weight, eps=1e-6,
    out=None, enable_pdl=None). SGLang calls these positionally; the names only serve keywords."""
    import inspect

    alias = {}
    for param, canon in adapter.aliases.items():
        alias.setdefault(canon, param)
    P = inspect.Parameter
    ptrs = [a for a in spec.abi if a.ctype == "ptr"]
    outs = [a for a in ptrs if a.role == "out"]

    def param(name, default=P.empty):
        return P(alias.get(name, name), P.POSITIONAL_OR_KEYWORD, default=default)

    defaults = spec.scalars(spec.corpus[0].dims) if spec.corpus else {}
    params = [P(a.name, P.POSITIONAL_OR_KEYWORD) for a in ptrs if a.role != "out"]
    params += [param(a.name) for a in outs if a.name not in adapter.alloc]
    params += [P(a.name, P.POSITIONAL_OR_KEYWORD, default=defaults.get(a.name, P.empty)) for a in spec.abi
               if a.ctype != "ptr" and a.name != "dtype" and a.name not in spec.dim_names]
    params += [param(a.name, None) for a in outs if a.name in adapter.alloc]
    params += [P(n, P.POSITIONAL_OR_KEYWORD, default=None) for n in sorted(adapter.ignorable)]
    return inspect.Signature(params)


def _write_reference(spec, views, dims, scalars):
    """Run the spec's fp64 reference on ABI views and write every output and in-place tensor."""
    for name, val in spec.reference(views, dims, scalars).items():
        views[name].copy_(val.to(views[name].dtype))


def production_standin(spec, adapter):
    """A CPU function with sgl-kernel's signature and semantics for one op: binds its arguments,
    allocates optional outputs, computes the spec's reference, returns what the adapter returns."""
    sig = production_signature(spec, adapter)

    def standin(*args, **kwargs):
        b = sig.bind(*args, **kwargs)
        b.apply_defaults()
        canon = {adapter.canonical(k): v for k, v in b.arguments.items() if k not in adapter.ignorable}
        for name, make in adapter.alloc.items():
            if canon.get(name) is None:
                canon[name] = make(canon)
        norm = adapter.normalize(canon)
        if isinstance(norm, str):
            raise ValueError(f"sgl_kernel stand-in for {spec.name}: {norm}")
        views, dims = norm
        scalars = spec.scalars(tuple(dims))
        scalars.update({k: canon[k] for k in scalars if k in canon})
        _write_reference(spec, dict(views), tuple(dims), scalars)
        return adapter.returns(canon)

    standin.__signature__ = sig
    return standin


def _registry():
    """(spec, adapter) of every op the registry finds with a patch adapter."""
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.adapters import get_adapter
    from astra_sglang.registry import get_op

    return [(get_op(op), get_adapter(op)) for op in patchable_ops()]


def make_sgl_kernel(name: str = "sgl_kernel"):
    """A stub `sgl_kernel` whose functions are CPU stand-ins of the production callables of every
    op in the registry (each `sgl_kernel:<fn>` in a spec's `replaces`); `calls` counts their calls."""
    m = StubModule(name)
    m.__path__ = []
    m.calls = {}
    for spec, adapter in _registry():
        for target in spec.replaces:
            mod, fname = target.split(":", 1)
            if mod != "sgl_kernel":
                continue
            fn = production_standin(spec, adapter)

            def counted(*a, _fn=fn, _n=fname, **k):
                m.calls[_n] += 1
                return _fn(*a, **k)

            counted.__name__ = fname
            counted.__wrapped__ = fn
            m.calls[fname] = 0
            setattr(m, fname, counted)
    return m


def fake_production(name: str = "fake_sk"):
    """make_sgl_kernel() registered as module `name`, for tests that patch it via targets=."""
    sys.modules[name] = make_sgl_kernel(name)
    return sys.modules[name]


# ---------------------------------------------------------------------- astra kernels on CPU
def astra_standins(wrong=()):
    """CPU stand-ins for the astra kernels of every op in the registry, behind the ABI (views,
    dims, scalars): the spec's reference. Ops named in `wrong` compute a deliberately wrong result:
    the last element of the op's last written tensor (silu's out, the residual of fused_add_rmsnorm,
    merge_state's lse) is one off."""
    from astra_sglang.patch.adapters import abi_layout
    from astra_sglang.patch.ops import TorchBackend

    out = {}
    for spec, _ in _registry():
        last = abi_layout(spec).mutated[-1]

        def fn(v, dims, sc, _spec=spec, _last=last):
            _write_reference(_spec, v, tuple(dims), sc)
            if _spec.name in wrong:
                v[_last].view(-1)[-1] += 1.0

        out[spec.name] = TorchBackend(f"cpu stand-in{' (WRONG)' if spec.name in wrong else ''}", fn)
    return out


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
