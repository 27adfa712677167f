"""`bench --baseline installed`: the SGLang callable the patch replaces, timed through torch in the same
graph harness beside the extracted baseline, so what SGLang really runs (FlashInfer's CuTe-DSL norm on
Hopper, Triton kernels, version drift) is measured, and extracted == installed is shown in bits.

Which callable: the first of the spec's `replaces` (module:function) whose module the installed
environment has; the op's patch adapter (kernels/<op>/adapter.py) maps the ABI's tensors and scalars
onto the callable's parameters, as patch does in a live server.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Dict, Mapping, Optional, Sequence

from ..errors import AstraError


def resolve_installed(spec) -> str:
    """'module:function' of the first replaced callable whose module is installed (no import of it here)."""
    tried = []
    for target in spec.replaces:
        mod = target.split(":")[0]
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return target
        tried.append(mod)
    if not spec.replaces:
        raise AstraError(f"--baseline installed: {spec.name} names no SGLang callable it replaces (spec.replaces)")
    raise AstraError(f"--baseline installed: none of {', '.join(tried)} is installed here (SGLang's callable for "
                     f"{spec.name} is what it times)")


class InstalledImpl:
    """The installed callable behind the harness's call: (tensors, dims, dtype, scalars) -> 0.

    Callables that return their outputs (adapter.outputs_of) have them copied into the ABI's output buffers
    (Binder.call_with): the copy is the binding's, not SGLang's, and bench times it alone (`binding`) to
    take it out of the production time."""

    def __init__(self, target: str, spec):
        from astra_sglang.patch.adapters import Binder, get_adapter

        mod, _, name = target.partition(":")
        try:
            fn = importlib.import_module(mod)
            for part in name.split("."):  # a function, or a layer method (Class.method) a fused op's adapter expands
                fn = getattr(fn, part)
        except (ImportError, AttributeError) as e:
            raise AstraError(f"cannot load the installed {target}: {str(e).splitlines()[0] if str(e) else e!r}") from e
        self.target = target
        self.fn = getattr(fn, "__astra_original__", fn)  # SGLang's own, even in a patched process
        self.binder = Binder(self.fn, get_adapter(spec.name), spec)
        if not self.binder.ok:
            raise AstraError(f"the installed {target} does not map onto {spec.name}'s ABI: {self.binder.problem}")
        self.returns_outputs = self.binder.adapter.outputs_of is not None or bool(self.binder.adapter.returned)
        self._scratch: Dict[Any, Any] = {}

    def kwargs(self, tensors: Mapping[str, Any], scalars: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        scalars = dict(scalars or {})
        out: Dict[str, Any] = {}
        for param, canon in self.binder.canon_of.items():
            if canon in tensors:
                out[param] = tensors[canon]
            elif canon in scalars:
                out[param] = scalars[canon]
        return out

    def __call__(self, tensors, dims: Sequence[int], dtype: str, scalars, stream=None) -> int:
        # abi_dims: the shape, for a fused op's `sequence` that views the harness's row buffers as SGLang's layer does
        canon = {**dict(scalars or {}), **dict(tensors), "abi_dims": tuple(dims)}
        self.binder.call_with(self.fn, {}, canon)  # torch's current stream, like SGLang's call
        return 0

    def binding(self, tensors) -> None:
        """The copies a call makes to land returned outputs in `tensors`, alone (same sizes, same kernels)."""
        for n in self.binder.adapter.returned or self.binder.layout.mutated:
            if n in tensors:
                t = tensors[n]
                key = (n, tuple(t.shape), t.dtype, t.device)
                src = self._scratch.get(key)
                if src is None:
                    src = self._scratch[key] = t.clone()
                t.copy_(src)


def bitwise_mismatches(spec, prod, inst, dims, dtype: str, dist: str, seed: int, prod_attrs) -> Dict[str, int]:
    """Elements that differ bit for bit between the extracted production kernel and the installed callable
    on the same fresh inputs, per output (in-place side effects included)."""
    import torch

    from .inputs import from_prod_abi, make_case_inputs, to_prod_abi
    from .numerics import bitwise_changed

    t = make_case_inputs(spec, dims, dtype, dist, seed, "cuda")
    a = {n: v.clone() for n, v in to_prod_abi(spec, t, prod_attrs).items()}
    b = {n: v.clone() for n, v in t.items()}
    names = [x.name for x in spec.abi if x.ctype == "ptr" and x.role in ("out", "inout")]
    for n in names:
        if n not in t or any(x.name == n and x.role == "out" for x in spec.abi):
            a[n].zero_()
            b[n].zero_()
    scalars = spec.scalars(tuple(dims))
    prod(a, dims, dtype, scalars)
    inst(b, dims, dtype, scalars)
    torch.cuda.synchronize()
    from .numerics import canonical_outputs

    pa = canonical_outputs(spec, from_prod_abi(spec, a, prod_attrs), dims)
    b = canonical_outputs(spec, b, dims)
    return {n: bitwise_changed(pa[n], b[n]) for n in names}


def verify_installed(ws) -> str:
    """'installed:module:function' for an installed workspace (the production implementation check and bench
    run), after re-checking its source facts against the sglang this environment imports (found without
    importing it). One-line AstraError when sglang or the callable is missing or a fact no longer holds."""
    from astra_sglang.extract.installed import check_facts
    from astra_sglang.extract.sources import _dist_version, _pkg_dir, _version_near

    from ..registry import get_op

    target = ws.installed
    spec = get_op(ws.op)
    v = spec.variant(ws.variant)
    pkg = _pkg_dir("sglang")
    made = ws.manifest.get("sources", {}).get("sglang_py", {}).get("version", "?")
    if pkg is None:
        raise AstraError(f"{ws.op}'s production baseline is SGLang's installed {target} (workspace {ws.path}, "
                         f"extracted from sglang {made}), and sglang is not installed here: `pip install sglang` "
                         "in this environment")
    ver = _dist_version("sglang") or _version_near(pkg, ("sglang",))
    check_facts(v, pkg, f"the installed sglang {ver} at {pkg}")
    mod = target.split(":")[0]
    try:
        found = importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise AstraError(f"the installed sglang {ver} has no module {mod} (the {ws.op} baseline {target})")
    return f"installed:{target}"


def describe_production(ws) -> str:
    """What production is in a check's or bench's output and JSON."""
    if ws.installed:
        ver = ws.manifest.get("sources", {}).get("sglang_py", {}).get("version", "?")
        return (f"installed {ws.installed} (SGLang's callable through torch and the op's adapter; extracted from "
                f"sglang {ver}; variant {ws.variant})")
    return f"extracted {ws.variant} (baseline.cu built with SGLang's flags)"
