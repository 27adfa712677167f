"""`astra-sglang check`: does a kernel compute the op? An oracle that is hard to fool.

The oracle is the op's torch reference evaluated in fp64 *and* the extracted production
kernel. For every output (including in-place side effects such as fused_add_rmsnorm's
residual, and merge_state's lse), a candidate fails when

    err(candidate vs fp64) > max(k * err(production vs fp64), floor[dtype])     (spec.tolerance)

with err the largest elementwise error relative to the reference's magnitude,

    err = max_i |c_i - r_i| / (|r_i| + 0.01 * rms(r)),

both sides clamped to the output dtype's finite range (an fp16 output that overflows to inf
matches a reference beyond 65504). A NaN where the reference is finite is an error of inf.
Positions where the fp64 reference itself is not finite (±inf lse) must match the reference
or, failing that, what the production kernel returns there.

What else is checked, on fresh random inputs every time (several distributions, never zeros):
- outputs are poisoned with a NaN sentinel before each run; an element still holding it was
  never written;
- every ABI buffer sits inside a larger allocation with guard bytes before and after it:
  changed guard bytes mean a write outside the buffer;
- inputs are compared after the run: a kernel may only write its outputs;
- each (shape, dtype) runs at least twice in the *same buffers* with fresh inputs, so a
  kernel that caches results keyed by pointer, or detects a repeat, fails on the re-run;
- shapes: edge shapes (1 token, unaligned hidden sizes, the largest), the paper's shapes and
  a sample of the corpus; dtypes per the workspace (fp16, bf16, fp32);
- the candidate source passes the static checks (static_checks.py) before it is built.

Everything that touches the GPU runs in a worker subprocess (worker.py) with a timeout: a
compile error, crash, illegal address, hang or NaN is a failed check with its reason.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import AstraError
from .spec import OpSpec, Shape

DEFAULT_TIMEOUT = 60.0  # seconds without progress before a run counts as hung
GUARD_BYTES = 64 * 1024  # guard region before and after every ABI buffer
BIG_CASE_ELEMENTS = 64 * 1024 * 1024  # above this, one distribution (plus the re-run) only
BASELINE_SLACK = 8.0  # production's own error may be at most this many dtype floors
REL_SCALE = 1e-2  # err denominator: |r| + REL_SCALE * rms(r)
MAX_FAILURES = 5

# Poison (a NaN with a recognizable payload) written to outputs before every run.
POISON_BITS = {"float16": 0x7E5A, "bfloat16": 0x7FA5, "float32": 0x7FC5A5A5, "float64": 0x7FF8A5A5A5A5A5A5}
GUARD_BYTE = 0xA5


@dataclass
class CheckResult:
    ok: bool
    reason: str  # the first failure, one line ("" when ok)
    failures: List[str] = field(default_factory=list)
    # one row per (shape, dtype, distribution, run, output tensor)
    details: List[Dict[str, Any]] = field(default_factory=list)
    op: str = ""
    candidate: Optional[str] = None  # path of the candidate (None: the production baseline)
    candidate_sha256: str = ""
    variant: str = ""
    stage: str = ""  # where it ended: static | build | run | sanitize | done
    static: List[Dict[str, Any]] = field(default_factory=list)  # static-check findings
    notes: List[str] = field(default_factory=list)
    shapes: List[str] = field(default_factory=list)
    dtypes: List[str] = field(default_factory=list)
    seed: int = 0
    device: str = ""
    seconds: float = 0.0
    worker_status: str = ""
    log_tail: str = ""

    def summary(self) -> str:
        who = self.candidate or "production baseline"
        if self.ok:
            n = len({(d["shape"], d["dtype"]) for d in self.details})
            missed = sum(1 for x in self.notes if "not checked" in x)
            skipped = sum(1 for x in self.notes if ": skipped (" in x)
            extra = "".join([f", {skipped} skipped (production does not take them)" if skipped else "",
                             f", {missed} NOT CHECKED (harness out of memory)" if missed else ""])
            return (f"PASS {self.op} {who}: {n} shape×dtype cases, {len(self.details)} comparisons{extra} "
                    f"({self.seconds:.1f}s)")
        return f"FAIL {self.op} {who}: {self.reason}"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def to_json(self, path: Union[str, Path]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        return p

    def worst(self) -> List[Dict[str, Any]]:
        """Per output tensor and dtype, the detail row with the largest candidate error / tolerance."""
        best: Dict[Tuple[str, str], Dict[str, Any]] = {}
        for d in self.details:
            k = (d.get("tensor", ""), d.get("dtype", ""))
            r = _ratio(d)
            if k not in best or r > _ratio(best[k]):
                best[k] = d
        return list(best.values())


def _ratio(d: Dict[str, Any]) -> float:
    tol = d.get("tol") or 0.0
    err = d.get("cand_err")
    if err is None:
        return 0.0
    return float("inf") if tol == 0 else err / tol


# ------------------------------------------------------------------------------------------
# shape and dtype selection (pure)


def select_shapes(spec: OpSpec, selector: Union[str, Sequence[Shape]] = "check", sample: int = 8) -> List[Shape]:
    """Shapes for a check: 'check' = edge shapes + paper shapes + a sample of the corpus
    (one decode shape per distinct width, spread over sizes, and the largest corpus shape).
    Anything else goes to OpSpec.shapes (corpus, paper, edge, decode, prefill, AxB,...),
    and several selectors may be joined with '+' (e.g. 'paper+edge')."""
    if not isinstance(selector, str):
        return list(selector)
    if "+" in selector:
        out: List[Shape] = []
        for part in selector.split("+"):
            out.extend(select_shapes(spec, part.strip(), sample))
        return _dedupe(out)
    if selector != "check":
        return spec.shapes(selector)
    out = list(spec.edge_shapes)
    out += [s for s in spec.corpus if "paper" in s.tags]
    by_width: Dict[Tuple[int, ...], Shape] = {}
    for s in sorted(spec.corpus, key=lambda s: _numel(s.dims)):
        by_width.setdefault(s.dims[1:], s)
    widths = sorted(by_width.values(), key=lambda s: _numel(s.dims))
    if len(widths) > sample:
        idx = sorted({round(i * (len(widths) - 1) / (sample - 1)) for i in range(sample)})
        widths = [widths[i] for i in idx]
    out += widths
    if spec.corpus and not any("largest" in s.tags for s in spec.edge_shapes):
        out.append(max(spec.corpus, key=lambda s: _numel(s.dims)))
    return _order(_dedupe(out))


def _numel(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _dedupe(shapes: Sequence[Shape]) -> List[Shape]:
    seen, out = set(), []
    for s in shapes:
        if s.dims not in seen:
            seen.add(s.dims)
            out.append(s)
    return out


def _order(shapes: Sequence[Shape]) -> List[Shape]:
    """Small shapes first: cheap failures surface before the largest shape's reference is computed."""
    return sorted(shapes, key=lambda s: _numel(s.dims))


def workspace_dtypes(spec: OpSpec, manifest: Dict[str, Any], requested: Optional[Sequence[str]] = None) -> List[str]:
    have = [d for d in spec.dtypes if d in manifest.get("dtypes", spec.dtypes)]
    if not requested:
        return have
    bad = [d for d in requested if d not in have]
    if bad:
        raise AstraError(f"dtype {', '.join(bad)} not supported by this {spec.name} workspace (it has: {', '.join(have)})")
    return list(requested)


def to_prod_abi(spec: OpSpec, tensors: Dict[str, Any], attrs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The tensors the production variant's kernel takes (spec.to_variant_abi, e.g. base-2 lse for
    FlashInfer's merge_state). Candidates take the op's own convention, unconverted."""
    if attrs and spec.to_variant_abi is not None:
        return spec.to_variant_abi(tensors, attrs)
    return tensors


def from_prod_abi(spec: OpSpec, views: Dict[str, Any], attrs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Copies of the production variant's outputs, in the op's convention (spec.from_variant_abi)."""
    names = [a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("out", "inout")]
    if attrs and spec.from_variant_abi is not None:
        conv = {n: views[n].new_empty(views[n].shape) for n in names}
        spec.from_variant_abi(views, conv, attrs)
        return conv
    return {n: views[n].clone() for n in names}


def reference_kwargs(spec: OpSpec, attrs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Workspace attrs the reference takes as keyword arguments (e.g. merge_state's `semantics`):
    the production variant is judged against its own semantics, candidates against the op's."""
    import inspect

    if not attrs:
        return {}
    try:
        params = list(inspect.signature(spec.reference).parameters.values())[3:]
    except (TypeError, ValueError):
        return {}
    return {p.name: attrs[p.name] for p in params if p.name in attrs}


# ------------------------------------------------------------------------------------------
# tolerance and error metrics (torch, device-agnostic)


def dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def tolerance(spec: OpSpec, tensor_dtype: str, prod_err: Optional[float]) -> float:
    """max(k * production error, floor of the output's dtype). tensor_dtype: fp16|bf16|fp32|..."""
    floor = float(spec.tolerance.floor.get(tensor_dtype, spec.tolerance.floor.get("fp32", 1e-5)))
    if prod_err is None or not math.isfinite(prod_err):
        return floor
    return max(spec.tolerance.k * prod_err, floor)


def rel_err(out, ref, chunk: int = 1 << 24) -> Dict[str, Any]:
    """Errors of `out` against the fp64 `ref` (same shape). See the module docstring.

    Returns the max relative error over positions where ref is finite ('err'; inf when out has
    NaN there), the normwise error, and the counts of NaN and of non-finite reference positions.
    Works in chunks so the largest shapes need little extra memory."""
    import torch

    o = out.reshape(-1)
    r = ref.reshape(-1)
    odt = out.dtype
    fmax = torch.finfo(odt).max if odt.is_floating_point else float("inf")
    n = o.numel()
    sq_ref = 0.0
    n_ref_nonfinite = 0
    for i in range(0, n, chunk):
        rr = r[i:i + chunk].to(torch.float64)
        fin = torch.isfinite(rr)
        n_ref_nonfinite += int((~fin).sum())
        rr = torch.where(fin, rr.clamp(-fmax, fmax), torch.zeros_like(rr))
        sq_ref += float((rr * rr).sum())
    rms = math.sqrt(sq_ref / n) if n else 0.0
    scale = REL_SCALE * rms + 1e-300
    err = 0.0
    nan = 0
    sq_diff = 0.0
    for i in range(0, n, chunk):
        rr = r[i:i + chunk].to(torch.float64)
        fin = torch.isfinite(rr)
        rr = torch.where(fin, rr.clamp(-fmax, fmax), torch.zeros_like(rr))
        oc = o[i:i + chunk].to(torch.float64)
        nan_here = torch.isnan(oc) & fin
        nan += int(nan_here.sum())
        oc = torch.nan_to_num(oc, nan=0.0, posinf=fmax, neginf=-fmax).clamp(-fmax, fmax)
        d = torch.where(fin & ~nan_here, (oc - rr).abs(), torch.zeros_like(rr))
        if d.numel():
            err = max(err, float((d / (rr.abs() + scale)).max()))
        sq_diff += float((d * d).sum())
    if nan:
        err = float("inf")
    norm = math.sqrt(sq_diff) / math.sqrt(sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else float("inf"))
    return {"err": err, "norm": norm, "nan": nan, "ref_nonfinite": n_ref_nonfinite}


def nonfinite_mismatch(out, ref, prod=None) -> int:
    """Positions where the reference is ±inf/NaN and `out` matches neither it nor production."""
    import torch

    r = ref.reshape(-1).to(torch.float64)
    bad = ~torch.isfinite(r)
    if not bool(bad.any()):
        return 0
    o = out.reshape(-1).to(torch.float64)[bad]
    rb = r[bad]
    same = (o == rb) | (torch.isnan(o) & torch.isnan(rb))
    if prod is not None:
        p = prod.reshape(-1).to(torch.float64)[bad]
        same = same | (o == p) | (torch.isnan(o) & torch.isnan(p))
    return int((~same).sum())


def count_poison(t) -> int:
    """Elements of `t` that still hold the poison bit pattern."""
    import torch

    name = dtype_name(t)
    if name not in POISON_BITS:
        return 0
    ity = {"float16": torch.int16, "bfloat16": torch.int16, "float32": torch.int32, "float64": torch.int64}[name]
    bits = POISON_BITS[name]
    if bits >= 1 << (8 * t.element_size() - 1):
        bits -= 1 << (8 * t.element_size())
    return int((t.reshape(-1).view(ity) == bits).sum())


def poison_(t) -> None:
    import torch

    name = dtype_name(t)
    if name in POISON_BITS:
        ity = {"float16": torch.int16, "bfloat16": torch.int16, "float32": torch.int32, "float64": torch.int64}[name]
        bits = POISON_BITS[name]
        if bits >= 1 << (8 * t.element_size() - 1):
            bits -= 1 << (8 * t.element_size())
        t.reshape(-1).view(ity).fill_(bits)
    else:
        t.fill_(-0x5A5A)


# ------------------------------------------------------------------------------------------
# guarded buffers (torch)


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


def bitwise_changed(a, b) -> int:
    """Elements where a and b differ bit for bit (NaN-safe)."""
    import torch

    if a.dtype.is_floating_point:
        ity = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return int((a.reshape(-1).view(ity) != b.reshape(-1).view(ity)).sum())
    return int((a.reshape(-1) != b.reshape(-1)).sum())


# ------------------------------------------------------------------------------------------
# implementations the worker can call


class Impl:
    """A callable kernel: a built library (lib:/path.so) or a Python stand-in (py:/file.py:function).

    Python stand-ins take (tensors: dict, dims, dtype: str, scalars: dict) and return an int
    error code; they let the whole harness run on the CPU in tests."""

    def __init__(self, ref: str, spec: OpSpec):
        self.ref = ref
        self.spec = spec
        kind, _, rest = ref.partition(":")
        if kind == "lib":
            from .runtime import KernelLib

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


# ------------------------------------------------------------------------------------------
# one case: fresh inputs into existing buffers, candidate and production, compare


class FatalCaseError(Exception):
    """A CUDA error that poisons the context (illegal address, ...): the run cannot go on."""


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _case_seed(seed: int, *parts: Any) -> int:
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(h[:7], "little")


def make_case_inputs(spec: OpSpec, dims, dtype: str, dist: str, seed: int, device: str) -> Dict[str, Any]:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    inputs = spec.make_inputs(tuple(dims), dtype, gen, dist, device=device)
    for a in spec.abi:
        if a.ctype == "ptr" and a.role in ("in", "inout"):
            t = inputs[a.name]
            if t.numel() and t.is_floating_point() and not bool((t != 0).any()):
                raise AstraError(f"{spec.name} make_inputs gave an all-zero {a.name!r} ({dist}): inputs must never be zeros")
    return inputs


def run_case(
    spec: OpSpec,
    cand: Impl,
    prod: Impl,
    bufs_c: GuardedSet,
    bufs_p: GuardedSet,
    dims: Tuple[int, ...],
    dtype: str,
    dist: str,
    seed: int,
    device: str,
    *,
    run_index: int = 0,
    label: str = "",
    baseline_only: bool = False,
    prod_attrs: Optional[Dict[str, Any]] = None,
    stage: Callable[[str], None] = lambda s: None,
) -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    """Run candidate and production on one fresh input draw. Returns (details, failures, notes).

    prod_attrs: the workspace's variant attrs: production gets its inputs converted to the
    variant's convention (spec.to_variant_abi) and is judged against the reference under its
    own semantics (reference_kwargs); the candidate implements the op's own ABI and contract.
    Raises FatalCaseError when a launch leaves the CUDA context unusable."""
    import torch

    label = label or f"{'x'.join(map(str, dims))} {dtype} {dist}"
    rerun = run_index == 1  # the same distribution as run 0, fresh values, same buffers
    scalars = spec.scalars(tuple(dims))
    inputs = make_case_inputs(spec, dims, dtype, dist, seed, device)
    failures: List[str] = []
    notes: List[str] = []
    outs: Dict[str, Dict[str, Any]] = {}
    who_list = [("production", prod, bufs_p)] if baseline_only else [("candidate", cand, bufs_c), ("production", prod, bufs_p)]
    for who, impl, bufs in who_list:
        abi_in = to_prod_abi(spec, inputs, prod_attrs) if who == "production" else inputs
        bufs.load(abi_in)
        _sync(device)
        stage(f"{who} on {label}" + (f" (run {run_index + 1})" if rerun else ""))
        try:
            rc = impl(bufs.views, dims, dtype, scalars)
            _sync(device)
        except Exception as e:  # torch raises RuntimeError / AcceleratorError for CUDA errors
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FatalCaseError(f"{label}: {who} crashed the CUDA context: {msg}") from e
        if rc != 0:
            name = cuda_error_name(rc)
            if who == "production":
                notes.append(f"{label}: production returned {name}; case skipped")
                return [], [], notes
            failures.append(f"{label}: candidate returned {name}")
            return [], failures, notes
        dmg = bufs.guard_damage()
        for name, (before, after) in dmg.items():
            where = " and ".join(w for w, n in (("before the start", before), ("past the end", after)) if n)
            failures.append(f"{label}: {who} wrote outside {name}: {before + after} guard bytes changed {where}")
        for name, role in bufs.roles.items():
            if role == "in":
                n = bitwise_changed(bufs.views[name], abi_in[name])
                if n:
                    failures.append(f"{label}: {who} modified its input {name} ({n} elements changed)")
            elif role == "out":
                v = bufs.views[name]
                n = count_poison(v)
                if n:
                    failures.append(
                        f"{label}: {who} never wrote {n} of {v.numel()} elements of {name} (poison left)"
                        + (" on a re-run with fresh inputs in the same buffers (result cached by pointer?)"
                           if rerun else ""))
        if who == "production":
            outs[who] = from_prod_abi(spec, bufs.views, prod_attrs)
        else:
            outs[who] = {n: bufs.views[n].clone() for n, r in bufs.roles.items() if r in ("out", "inout")}
    ref_in = {a.name: inputs[a.name].to(torch.float64) for a in spec.abi if a.ctype == "ptr" and a.role in ("in", "inout")}
    del inputs, abi_in
    ref = spec.reference(ref_in, tuple(dims), scalars)
    kw = reference_kwargs(spec, prod_attrs)
    ref_p = spec.reference(ref_in, tuple(dims), scalars, **kw) if kw else ref
    del ref_in
    details: List[Dict[str, Any]] = []
    for name, r in ref.items():
        rp = rel_err(outs["production"][name], ref_p[name])
        short = _SHORT.get(dtype_name(outs["production"][name]), dtype)
        if baseline_only:
            rc_ = rp
            limit = BASELINE_SLACK * tolerance(spec, short, None)
            tol = limit
            mism = nonfinite_mismatch(outs["production"][name], ref_p[name])
            ok = rp["err"] <= limit
            if not ok:
                failures.append(f"{label}: production's {name} disagrees with the fp64 reference: error "
                                f"{rp['err']:.3g} > {limit:.3g} ({BASELINE_SLACK:g}× the {short} floor)"
                                + (f", {rp['nan']} NaN where the reference is finite" if rp["nan"] else ""))
            if mism:
                notes.append(f"{label}: production's {name} differs from the reference at {mism} non-finite positions")
        else:
            rc_ = rel_err(outs["candidate"][name], r)
            prod_err = rp["err"]
            tol = tolerance(spec, short, prod_err)
            mism = nonfinite_mismatch(outs["candidate"][name], r, outs["production"][name])
            ok = rc_["err"] <= tol and not mism
            again = " on a re-run with fresh inputs in the same buffers (stale result cached by pointer?)" if rerun else ""
            if rc_["nan"]:
                failures.append(f"{label}: candidate's {name} has {rc_['nan']} NaN where the reference is finite{again}")
            elif rc_["err"] > tol:
                failures.append(f"{label}: candidate's {name} error {rc_['err']:.3g} > tolerance {tol:.3g} "
                                f"(production {prod_err:.3g}; max({spec.tolerance.k:g}×production, {short} floor)){again}")
            if mism:
                failures.append(f"{label}: candidate's {name} differs from reference and production at {mism} "
                                f"positions where the reference is ±inf/NaN")
        details.append({
            "shape": "x".join(map(str, dims)), "dtype": dtype, "dist": dist, "run": run_index, "tensor": name,
            "cand_err": None if baseline_only else rc_["err"], "prod_err": rp["err"], "tol": tol, "ok": ok,
            "cand_norm": None if baseline_only else rc_["norm"], "prod_norm": rp["norm"],
            "nan": rc_["nan"], "ref_nonfinite": int(rp["ref_nonfinite"]),
        })
    if failures:
        for d in details:
            if any(f"{d['tensor']} " in f or f"{d['tensor']}:" in f for f in failures):
                d["ok"] = False
    return details, failures, notes


def case_plan(spec: OpSpec, dims: Sequence[int], dtype: str, big: int = BIG_CASE_ELEMENTS) -> List[Tuple[str, int]]:
    """(distribution, run index) for one shape×dtype: the first distribution twice (the second time in
    the same buffers with fresh inputs), then every other distribution (fresh inputs, same buffers).
    Cases over `big` elements run the first distribution only (twice)."""
    dists = list(spec.distributions) or ["normal"]
    plan = [(dists[0], 0), (dists[0], 1)]
    if _numel(dims) <= big:
        plan += [(d, i + 2) for i, d in enumerate(dists[1:])]
    return plan


# ------------------------------------------------------------------------------------------
# the worker's side


def _check_shape_dtype(spec, cand, prod, dims, dtype, device, guard, seed, big, only_first_dist, baseline_only,
                       prod_attrs, details, failures, notes, max_fail, emit) -> Optional[Dict[str, Any]]:
    """All runs of one shape×dtype; appends to details/failures/notes. Returns a final result dict when
    the job must stop (a fatal CUDA error, or max_fail failures), else None."""
    import torch

    protos = spec.make_inputs(dims, dtype, torch.Generator(device=device).manual_seed(1), spec.distributions[0]
                              if spec.distributions else "normal", device=device)
    bufs_p = GuardedSet(spec, protos, device, guard)
    bufs_c = bufs_p if baseline_only else GuardedSet(spec, protos, device, guard)
    del protos
    plan = case_plan(spec, dims, dtype, big)
    if only_first_dist:
        plan = plan[:2]
    for dist, run in plan:
        try:
            d, f, n = run_case(spec, cand, prod, bufs_c, bufs_p, dims, dtype, dist,
                               _case_seed(seed, dims, dtype, dist, run), device, run_index=run,
                               baseline_only=baseline_only, prod_attrs=prod_attrs,
                               stage=lambda m: emit("stage", msg=m))
        except FatalCaseError as e:
            failures.append(str(e))
            emit("case", details=[], failures=[str(e)], notes=[])
            return {"ok": False, "reason": failures[0], "failures": failures, "details": details,
                    "notes": notes, "fatal": True}
        details += d
        failures += f
        notes += n
        emit("case", details=d, failures=f, notes=n)
        if len(failures) >= max_fail:
            return {"ok": False, "reason": failures[0], "failures": failures, "details": details, "notes": notes}
        if f:
            break  # one failure per shape×dtype is enough; go on to the next
    return None


def run_check_job(job: Dict[str, Any]) -> Dict[str, Any]:
    """Worker entry (mode 'check'). Emits a 'case' event per case; returns the result dict."""
    import torch

    from .registry import get_op
    from .worker import emit

    spec = get_op(job["op"])
    device = job.get("device", "cuda")
    dev_name = "cpu"
    if device.startswith("cuda"):
        torch.cuda.init()
        dev_name = torch.cuda.get_device_name()
    emit("stage", msg=f"loading kernels on {dev_name}")
    prod = Impl(job["prod"], spec)
    baseline_only = not job.get("cand")
    cand = prod if baseline_only else Impl(job["cand"], spec)
    guard = int(job.get("guard_bytes", GUARD_BYTES))
    seed = int(job.get("seed", 0))
    max_fail = int(job.get("max_failures", MAX_FAILURES))
    prod_attrs = job.get("prod_attrs") or {}
    big = int(job.get("big_case_elements", BIG_CASE_ELEMENTS))
    only_first_dist = bool(job.get("first_dist_only", False))
    details: List[Dict[str, Any]] = []
    failures: List[str] = []
    notes: List[str] = []
    skip = job.get("skip", {})  # "AxB dtype" -> why production does not take it
    for dims in job["shapes"]:
        dims = tuple(int(x) for x in dims)
        for dtype in job["dtypes"]:
            key = f"{'x'.join(map(str, dims))} {dtype}"
            if key in skip:
                notes.append(f"{key}: skipped ({skip[key]})")
                continue
            try:
                out = _check_shape_dtype(spec, cand, prod, dims, dtype, device, guard, seed, big, only_first_dist,
                                         baseline_only, prod_attrs, details, failures, notes, max_fail, emit)
            except torch.cuda.OutOfMemoryError as e:  # the harness's memory, not the candidate's fault
                msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else "out of memory"
                notes.append(f"{key}: not checked: the harness ran out of GPU memory ({msg})")
                emit("case", details=[], failures=[], notes=[notes[-1]])
                out = None
            if out is not None:  # fatal (the CUDA context may be gone: touch nothing) or too many failures
                out["device"] = dev_name
                return out
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return {"ok": not failures, "reason": failures[0] if failures else "", "failures": failures,
            "details": details, "notes": notes, "device": dev_name}


# ------------------------------------------------------------------------------------------
# the caller's side


def _progress_fn(progress: Optional[Callable[[str], None]]) -> Callable[[str], None]:
    return progress or (lambda s: None)


def run_check(
    spec: OpSpec,
    prod: str,
    cand: Optional[str],
    shapes: Sequence[Shape],
    dtypes: Sequence[str],
    *,
    seed: int = 0,
    device: str = "cuda",
    timeout: float = DEFAULT_TIMEOUT,
    total_timeout: float = 3600.0,
    prod_attrs: Optional[Dict[str, Any]] = None,
    guard_bytes: int = GUARD_BYTES,
    skip: Optional[Dict[str, str]] = None,
    argv: Optional[Sequence[str]] = None,
    env: Optional[Dict[str, str]] = None,
    first_dist_only: bool = False,
    max_failures: int = MAX_FAILURES,
    progress: Optional[Callable[[str], None]] = None,
) -> Tuple[bool, str, List[str], List[Dict[str, Any]], List[str], str, Any]:
    """Run the check job in a worker on implementation references (lib:... / py:...).

    Returns (ok, reason, failures, details, notes, device, WorkerResult)."""
    from .worker import run_worker

    job = {
        "mode": "check", "op": spec.name, "prod": prod, "cand": cand, "device": device,
        "shapes": [list(s.dims) for s in shapes], "dtypes": list(dtypes), "seed": seed,
        "prod_attrs": prod_attrs or {}, "guard_bytes": guard_bytes, "skip": skip or {},
        "first_dist_only": first_dist_only, "max_failures": max_failures,
    }
    wr = run_worker(job, argv=argv, timeout=timeout, total_timeout=total_timeout, env=env, progress=progress)
    details: List[Dict[str, Any]] = []
    failures: List[str] = []
    notes: List[str] = []
    for ev in wr.events:
        if ev.get("event") == "case":
            details += ev.get("details", [])
            failures += ev.get("failures", [])
            notes += ev.get("notes", [])
    p = wr.payload or {}
    if wr.status in ("ok", "failed") and p:
        failures = list(p.get("failures", failures))
        details = list(p.get("details", details))
        notes = list(p.get("notes", notes))
        reason = p.get("reason", "") or (failures[0] if failures else "")
        return bool(p.get("ok")) and not failures, reason, failures, details, notes, p.get("device", ""), wr
    # timeout / crash / worker error: the candidate failed, and we say how
    who = "candidate" if cand else "production baseline"
    reason = wr.reason
    if "candidate on" not in wr.stage and "production on" not in wr.stage and cand:
        reason = f"{who}: {reason}"
    return False, reason, [reason] + failures, details, notes, "", wr


def _open_workspace(op: str, workspace: Any):
    from .workspace import Workspace

    if isinstance(workspace, Workspace):
        if workspace.op != op:
            raise AstraError(f"workspace {workspace.path} holds {workspace.op}, not {op}")
        return workspace
    return Workspace.open(op, path=Path(workspace)) if workspace else Workspace.open(op)


def _skips(spec: OpSpec, variant: str, shapes: Sequence[Shape], dtypes: Sequence[str]) -> Dict[str, str]:
    """Shapes the production variant does not take (Variant.supports), keyed 'AxB dtype'."""
    try:
        v = spec.variant(variant)
    except AstraError:
        return {}
    sup = getattr(v, "supports", None)
    out: Dict[str, str] = {}
    if sup is None:
        return out
    for s in shapes:
        for dt in dtypes:
            why = sup(tuple(s.dims), dt)
            if why:
                out[f"{s.key()} {dt}"] = f"production {variant} does not take it: {why}"
    return out


def check_candidate(
    op: str,
    workspace: Any,
    candidate: Optional[Union[str, Path]],
    *,
    shapes: Union[str, Sequence[Shape]] = "check",
    dtypes: Optional[Sequence[str]] = None,
    seed: Optional[int] = None,
    timeout: float = DEFAULT_TIMEOUT,
    total_timeout: float = 3600.0,
    sanitize: bool = False,
    progress: Optional[Callable[[str], None]] = None,
    max_failures: int = MAX_FAILURES,
) -> CheckResult:
    """Check `candidate` (a .cu behind the op's ABI; None = the production baseline) in `workspace`.

    `timeout` is the longest the worker may go without progress (a hang); `total_timeout` caps
    the whole run. Never raises for anything the candidate does; raises AstraError for
    usage errors (unknown op, missing workspace, bad dtype/shape selector)."""
    from .build import first_error_line
    from .registry import get_op
    from .static_checks import errors as static_errors
    from .static_checks import scan_file, summarize

    t0 = time.monotonic()
    say = _progress_fn(progress)
    spec = get_op(op)
    ws = _open_workspace(op, workspace)
    shape_list = select_shapes(spec, shapes)
    dts = workspace_dtypes(spec, ws.manifest, dtypes)
    seed = int(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    res = CheckResult(False, "", op=op, candidate=str(candidate) if candidate else None, variant=ws.variant,
                      shapes=[s.key() for s in shape_list], dtypes=dts, seed=seed)

    def done(stage: str) -> CheckResult:
        res.stage = stage
        res.seconds = time.monotonic() - t0
        return res

    cand_path = Path(candidate) if candidate else None
    if cand_path is not None:
        if not cand_path.exists():
            raise AstraError(f"candidate {cand_path} does not exist")
        res.candidate_sha256 = hashlib.sha256(cand_path.read_bytes()).hexdigest()
        findings = scan_file(cand_path, ws.include_dirs)
        res.static = [f.to_dict() for f in findings]
        if static_errors(findings):
            res.reason = summarize(findings) or "static check failed"
            res.failures = [f"static check: {f.one_line()}" for f in static_errors(findings)]
            return done("static")
    say("building the production baseline")
    pb = ws.build()
    if not pb.ok:
        res.reason = f"the production baseline does not compile: {first_error_line(pb.log)}"
        res.failures = [res.reason]
        res.log_tail = pb.log[-4000:]
        return done("build")
    cb = None
    if cand_path is not None:
        say(f"building {cand_path.name}")
        cb = ws.build(cand_path)
        if not cb.ok:
            res.reason = f"compile error: {first_error_line(cb.log)}"
            res.failures = [res.reason]
            res.log_tail = cb.log[-4000:]
            return done("build")
    skip = _skips(spec, ws.variant, shape_list, dts)
    prod_attrs = ws.attrs
    ok, reason, failures, details, notes, device, wr = run_check(
        spec, f"lib:{pb.library}", f"lib:{cb.library}" if cb else None, shape_list, dts, seed=seed,
        timeout=timeout, total_timeout=total_timeout, prod_attrs=prod_attrs, skip=skip,
        max_failures=max_failures, progress=say)
    res.ok, res.reason, res.failures, res.details, res.notes, res.device = ok, reason, failures, details, notes, device
    res.worker_status = wr.status
    res.log_tail = wr.stderr_tail[-2000:]
    if not ok or not sanitize:
        return done("run")
    for tool in ("memcheck", "racecheck"):
        say(f"compute-sanitizer {tool}")
        sres = sanitize_run(spec, ws, f"lib:{cb.library}" if cb else f"lib:{pb.library}", tool, dts, seed,
                            prod_attrs=None if cb else prod_attrs, timeout=max(timeout, 300.0), skip=skip, progress=say)
        res.notes.append(f"compute-sanitizer {tool}: {sres['summary']}")
        if not sres["ok"]:
            res.ok = False
            res.reason = f"compute-sanitizer {tool}: {sres['reason']}"
            res.failures.insert(0, res.reason)
            res.log_tail = sres.get("log", "")[-4000:]
            return done("sanitize")
    return done("done")


def sanitizer_shapes(spec: OpSpec, n: int = 3) -> List[Shape]:
    """Small shapes for compute-sanitizer (it is slow): the smallest edge shapes and the smallest paper shape."""
    edge = sorted(spec.edge_shapes, key=lambda s: _numel(s.dims))[:n]
    paper = sorted([s for s in spec.corpus if "paper" in s.tags], key=lambda s: _numel(s.dims))[:1]
    return _dedupe(edge + paper)


def parse_sanitizer_log(text: str) -> Tuple[int, str]:
    """(number of errors, first error line) from a compute-sanitizer log."""
    import re

    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    n = int(m.group(1)) if m else 0
    m2 = re.search(r"RACECHECK SUMMARY:\s*(\d+)\s+hazard", text)
    if m2:
        n = max(n, int(m2.group(1)))
    first = ""
    for line in text.splitlines():
        s = line.strip().lstrip("=").strip()
        if re.match(r"(Invalid|Race|Error|Uninitialized|Barrier|Hazard|Program hit|Malloc|Leaked|Warning: .*hazard)", s):
            first = s
            break
    return n, first


def sanitize_run(spec: OpSpec, ws, impl: str, tool: str, dtypes: Sequence[str], seed: int, *,
                 prod_attrs=None, timeout: float = 300.0, skip=None, progress=None) -> Dict[str, Any]:
    """Run the candidate alone (production as its own oracle is not needed: values were checked)
    on a few small shapes under compute-sanitizer; memory straight from cudaMalloc, no guards,
    so out-of-bounds accesses hit the allocation's end."""
    import tempfile

    exe = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer", "/opt/nvidia/compute-sanitizer/compute-sanitizer")
         if Path(p).exists()), None)
    if not exe:
        return {"ok": True, "summary": "not run (compute-sanitizer not found)", "reason": ""}
    from .worker import default_argv

    fd, log = tempfile.mkstemp(prefix=f"astra-{tool}-", suffix=".log")
    os.close(fd)
    argv = [exe, "--tool", tool, "--log-file", log, "--error-exitcode", "86", "--print-limit", "20"]
    if tool == "racecheck":
        argv += ["--racecheck-report", "hazard"]
    argv += default_argv()
    ok, reason, failures, details, notes, device, wr = run_check(
        spec, impl, None, sanitizer_shapes(spec), list(dtypes)[:1], seed=seed, timeout=timeout,
        total_timeout=max(timeout * 4, 900.0), prod_attrs=prod_attrs, guard_bytes=0, skip=skip, argv=argv,
        env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, first_dist_only=True, progress=progress)
    text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
    try:
        os.unlink(log)
    except OSError:
        pass
    n, first = parse_sanitizer_log(text)
    if n or wr.rc == 86:
        return {"ok": False, "reason": first or f"{n} errors", "summary": f"{n} errors", "log": text}
    if not ok and wr.status in ("timeout", "crashed", "error"):
        return {"ok": False, "reason": wr.reason, "summary": wr.status, "log": text + wr.stderr_tail}
    return {"ok": True, "summary": "0 errors", "reason": "", "log": text}
