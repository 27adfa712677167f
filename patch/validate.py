"""`astra-sglang validate`: SGLang's own layers with and without the patch, same inputs.

For each op, dtype, shape and value distribution of the op spec, fresh inputs are made
(spec.make_inputs), SGLang's layer runs unpatched, then patched (self-check off, so the
astra kernel really serves the call), and both outputs (every output and in-place side
effect) are judged against the fp64 reference with the check's rule:
err(patched) <= max(k * err(unpatched), floor[dtype]).

A case passes only if the astra kernel actually ran for it (its call counter moved).
If SGLang's layer never reached a patched callable for a shape (it routes that shape to
another kernel, e.g. merge_state's Triton path), the case is reported as n/a; if the
patched callable was reached but handed the call back to the original, the case fails.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from astra_sglang.errors import AstraError


@dataclass
class Case:
    op: str
    dtype: str
    dims: tuple
    dist: str
    status: str = ""  # PASS | FAIL | n/a
    calls: int = 0
    fallbacks: int = 0
    errors: Dict[str, Any] = field(default_factory=dict)  # output -> (err patched, err unpatched, tol)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


class _Layers(Mapping):
    """op -> kernels/<op>/layer.py's run_layer, loaded when asked for (a missing one is an error)."""

    def __getitem__(self, op: str) -> Callable[..., Dict[str, Any]]:
        from astra_sglang.registry import op_part

        return op_part(op, "layer").run_layer

    def __iter__(self):
        from astra_sglang.registry import op_names

        return iter(op_names())

    def __len__(self) -> int:
        return len(list(iter(self)))


LAYERS: Mapping[str, Callable[..., Dict[str, Any]]] = _Layers()


def validation_shapes(spec, selector: str):
    from astra_sglang.spec import dedupe_shapes

    if selector == "validate":
        tags = {t for s in spec.corpus for t in s.tags}
        if "paper" in tags:
            picked = list(spec.shapes("paper"))
        else:   # ops without paper shapes (the MoE ops): a sample of the decode and prefill corpus
            picked = []
            for tag, n in (("decode", 6), ("prefill", 2)):
                rows = spec.shapes(tag) if tag in tags else []
                picked += rows[:: max(1, -(-len(rows) // n))]
        # rows a spec names for validate (linear's longest, moe_experts' 2-token rows)
        picked += [s for s in spec.corpus if "validate" in s.tags]
        return list(dedupe_shapes([s for s in picked + list(spec.edge_shapes) if "largest" not in s.tags]))
    return spec.shapes(selector)


def validate(
    ops: Sequence[str],
    *,
    candidates: Optional[Dict[str, Any]] = None,
    dtypes: Optional[Sequence[str]] = None,
    shapes: str = "validate",
    seed: int = 0,
    device: str = "cuda",
    layers: Optional[Dict[str, Callable[..., Dict[str, Any]]]] = None,
    backends: Optional[Dict[str, Any]] = None,
    targets: Optional[Dict[str, Sequence[str]]] = None,
    progress: Callable[[str], None] = lambda m: None,
    isolate: Any = True,
) -> List[Case]:
    import torch

    from astra_sglang.registry import get_op

    from . import apply_astra_kernels, revert_astra_kernels
    from .adapters import get_adapter
    from .counters import totals
    from .ops import compare

    if device == "cuda" and not torch.cuda.is_available():
        raise AstraError("validate runs SGLang's layers on a CUDA GPU; none is visible here")
    real_layers = layers is None
    if real_layers:
        layers = {o: LAYERS[o] for o in ops}  # a missing kernels/<op>/layer.py is an error naming it
    missing = [o for o in ops if o not in layers]
    if missing:
        raise AstraError(f"no SGLang layer to validate {', '.join(missing)} with")
    if real_layers:
        try:
            import sglang  # noqa: F401  (fail early with one line)
        except Exception as e:
            raise AstraError(f"cannot import sglang here ({e}); validate needs an SGLang that runs on this GPU")

    revert_astra_kernels()
    cases = build_cases(ops, dtypes, shapes)
    inputs = [case_inputs(c, seed + i, device) for i, c in enumerate(cases)]
    progress(f"{len(cases)} case(s); running SGLang's layers unpatched")
    if real_layers and device == "cuda" and isolate:
        baseline = _unpatched_isolated(cases, ops, dtypes, shapes, seed, device, progress)
    elif isinstance(isolate, str):  # tests: isolate the given "module:attr" layers on any device
        baseline = _unpatched_isolated(cases, ops, dtypes, shapes, seed, device, progress, layers_ref=isolate)
    else:
        baseline = [_unpatched_one(layers, c, inp) for c, inp in zip(cases, inputs)]

    cdir = tempfile.mkdtemp(prefix="astra-validate-")
    patcher = apply_astra_kernels(list(ops), candidates=candidates, backends=backends, targets=targets,
                                  self_check="off", counter_dir=cdir, propagate=False,
                                  plan=None if real_layers else False)
    try:
        progress("running them patched")
        for c, inp, base in zip(cases, inputs, baseline):
            if c.status == "n/a":
                continue
            spec = get_op(c.op)
            before = totals(cdir).get(c.op, {})
            scalars = spec.scalars(c.dims)
            got = layers[c.op](_clone(inp), c.dims, scalars)
            after = totals(cdir).get(c.op, {})
            c.calls = after.get("calls", 0) - before.get("calls", 0)
            c.fallbacks = after.get("fallbacks", 0) - before.get("fallbacks", 0)
            if c.calls == 0:
                kept = get_adapter(c.op).kept_by_sglang(c.dims) if c.dims else None
                if kept:
                    c.status, c.detail = "n/a", f"{kept} (by design)"
                elif c.fallbacks:
                    st = patcher.states.get(c.op) if patcher is not None else None
                    why = st.last_fallback if st is not None else ""
                    c.status, c.detail = "FAIL", ("the patched callable handed the call back to SGLang's original"
                                                  + (f": {why}" if why else ""))
                else:
                    c.status, c.detail = "n/a", "SGLang's layer reached no patched callable for this shape"
                continue
            names = [n for n in base if n in got]
            # the reference needs the case's scalars (rope's is_neox, a norm's eps): the inputs carry tensors only
            res = compare(spec, {**inp, **scalars}, base, got, c.dims, names)
            c.errors = {n: tuple(float(x) for x in v) for n, v in res.errors.items()}
            c.status = "PASS" if res.ok else "FAIL"
            c.detail = res.detail
    finally:
        revert_astra_kernels()
    for op in ops:
        if not any(c.op == op and c.status == "PASS" for c in cases):
            for c in cases:
                if c.op == op and c.status == "n/a":
                    c.status, c.detail = "FAIL", "no case of this op reached the astra kernel"
                    break
    return cases


def _clone(inp: Dict[str, Any]) -> Dict[str, Any]:
    return {k: (v.clone() if hasattr(v, "clone") else v) for k, v in inp.items()}


def format_results(cases: Sequence[Case]) -> str:
    rows = [("op", "dtype", "shape", "dist", "result", "calls", "worst err (patched / unpatched / tol)")]
    for c in cases:
        worst = ""
        if c.errors:
            n, (e, p, t) = max(c.errors.items(), key=lambda kv: kv[1][0] / kv[1][2] if kv[1][2] else 0)
            worst = f"{n}: {e:.2g} / {p:.2g} / {t:.2g}"
        elif c.detail:
            worst = c.detail
        rows.append((c.op, c.dtype, "x".join(map(str, c.dims)), c.dist, c.status, str(c.calls), worst))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(r[i].ljust(w[i]) for i in range(len(w))) + "  " + r[-1] for r in rows]
    n_pass = sum(c.status == "PASS" for c in cases)
    n_fail = sum(c.status == "FAIL" for c in cases)
    lines.append(f"{n_pass} passed, {n_fail} failed, {len(cases) - n_pass - n_fail} n/a")
    return "\n".join(lines)


# ------------------------------------------------------- the unpatched pass, crash-isolated
def build_cases(ops: Sequence[str], dtypes: Optional[Sequence[str]], shapes: str) -> List[Case]:
    """Every (op, shape, dtype, distribution) validate runs, in a fixed order (parent and child agree).
    dtypes None: each op's fp16/bf16, or its own dtypes where it has neither (moe_align: int32)."""
    from astra_sglang.harness.cases import default_dtypes
    from astra_sglang.registry import get_op

    cases: List[Case] = []
    for op in ops:
        spec = get_op(op)
        dts = list(dtypes) if dtypes else default_dtypes(spec.dtypes, spec.serving_dtypes)
        bad = [d for d in dts if d not in spec.dtypes]
        if bad:
            raise AstraError(f"{op} has no dtype {', '.join(bad)} (it has {', '.join(spec.dtypes)})")
        for shape in validation_shapes(spec, shapes):
            for dt in dts:
                for dist in spec.distributions:
                    cases.append(Case(op, dt, tuple(shape.dims), dist))
    return cases


def case_inputs(c: Case, seed: int, device: str) -> Dict[str, Any]:
    """The spec's inputs for a case, as check makes them (never all zeros)."""
    from astra_sglang.harness.inputs import make_case_inputs
    from astra_sglang.registry import get_op

    return make_case_inputs(get_op(c.op), c.dims, c.dtype, c.dist, seed, device)


def _unpatched_one(layers, c: Case, inp) -> Dict[str, Any]:
    from astra_sglang.registry import get_op

    try:
        return layers[c.op](_clone(inp), c.dims, get_op(c.op).scalars(c.dims))
    except (ValueError, RuntimeError) as e:
        # SGLang itself refuses some spec shapes (sgl_kernel's silu_and_mul wants 16-byte
        # aligned halves, so hidden % 8 != 0 raises): nothing to compare against.
        if "CUDA error" in str(e) or "illegal" in str(e):
            raise  # a sticky device fault is not a refusal: stop loudly
        c.status = "n/a"
        c.detail = f"SGLang's own layer refuses this shape: {_first_line(e)}"
        return {}


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _unpatched_isolated(cases, ops, dtypes, shapes, seed, device, progress,
                        layers_ref: str = "astra_sglang.patch.validate:LAYERS") -> List[Dict[str, Any]]:
    """Run SGLang's unpatched layers in child processes (CUDA_LAUNCH_BLOCKING=1).

    A production kernel that faults on a shape (sglang 0.5.17's sgl_kernel silu_and_mul does a
    misaligned 16-byte load when hidden % 8 == 4, seen on an H200) leaves a sticky CUDA error
    that no process survives; the child dies, that case becomes n/a with the fault as its
    reason, and a fresh child resumes at the next case.
    """
    import json
    import os
    import subprocess
    import sys

    import torch

    work = tempfile.mkdtemp(prefix="astra-validate-unpatched-")
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    env.pop("ASTRA_SGLANG_OPS", None)  # the child must run SGLang unpatched
    start = 0
    streak: List[int] = []  # indices of the latest run of back-to-back crashes with one reason
    while start < len(cases):
        args = json.dumps({"ops": list(ops), "dtypes": list(dtypes) if dtypes else None, "shapes": shapes, "seed": seed,
                           "device": device, "start": start, "dir": work, "layers": layers_ref})
        proc = subprocess.run([sys.executable, "-m", "astra_sglang.patch.validate", args], env=env,
                              capture_output=True, text=True)
        cur_file = os.path.join(work, "current")
        current = int(open(cur_file).read()) if os.path.exists(cur_file) else start
        if proc.returncode == 0:
            break
        if current >= len(cases) or os.path.exists(os.path.join(work, f"{current}.pt")):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise AstraError(f"validate's unpatched child failed outside a case: {tail}")
        errs = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln]
        c = cases[current]
        c.status = "n/a"
        c.detail = f"SGLang's own kernel crashed on this shape: {(errs or ['exit ' + str(proc.returncode)])[-1].strip()}"
        progress(f"SGLang's own {c.op} crashed on {'x'.join(map(str, c.dims))} {c.dtype} {c.dist}; "
                 f"continuing in a fresh process")
        start = current + 1
        prev = cases[streak[-1]] if streak else None
        same = prev is not None and streak[-1] == current - 1 and prev.op == c.op and prev.detail == c.detail
        streak = streak + [current] if same else [current]
        if _hopeless(cases, streak):
            start = _skip_op(cases, start, c, len(streak), progress)
    out: List[Dict[str, Any]] = []
    for i, c in enumerate(cases):
        pt = os.path.join(work, f"{i}.pt")
        if c.status == "n/a" and not os.path.exists(pt):
            out.append({})
            continue
        rec = torch.load(pt, map_location=device)
        if rec.get("refused"):
            c.status, c.detail = "n/a", rec["refused"]
            out.append({})
        else:
            out.append(rec["outputs"])
    return out


CRASH_STREAK = 3  # back-to-back crashes of one op, one reason, over more than one shape: its layer crashes always


def _hopeless(cases: Sequence[Case], streak: Sequence[int]) -> bool:
    """Whether the latest crashes say the op's layer crashes on every case (a layer that cannot run here, not a
    shape SGLang's kernel faults on): CRASH_STREAK in a row with the same reason, on at least two shapes. Each
    crash costs a fresh process (~25 s on a GPU)."""
    return len(streak) >= CRASH_STREAK and len({cases[i].dims for i in streak}) > 1


def _skip_op(cases: Sequence[Case], start: int, crashed: Case, n: int, progress) -> int:
    """Mark the crashed op's remaining cases n/a (not run) -> the index of the next op's first case."""
    end = next((j for j in range(start, len(cases)) if cases[j].op != crashed.op), len(cases))
    for c in cases[start:end]:
        c.status = "n/a"
        c.detail = f"not run: SGLang's own layer crashed on the {n} cases before it, each the same way"
    if end > start:
        progress(f"SGLang's own {crashed.op} crashed {n} times in a row the same way on several shapes; "
                 f"its {end - start} remaining case(s) are not run")
    return end


def _child(argv: Sequence[str]) -> None:
    """Child of _unpatched_isolated: run cases from `start`, one result file each."""
    import json
    import os

    import torch

    import importlib

    a = json.loads(argv[0])
    mod, attr = a["layers"].split(":")
    layers = getattr(importlib.import_module(mod), attr)
    cases = build_cases(a["ops"], a["dtypes"], a["shapes"])
    for i in range(a["start"], len(cases)):
        c = cases[i]
        with open(os.path.join(a["dir"], "current"), "w") as f:
            f.write(str(i))
        got = _unpatched_one(layers, c, case_inputs(c, a["seed"] + i, a["device"]))
        if a["device"] == "cuda":
            torch.cuda.synchronize()
        rec = {"refused": c.detail} if c.status == "n/a" else {"outputs": {k: v.cpu() for k, v in got.items()}}
        torch.save(rec, os.path.join(a["dir"], f"{i}.pt"))
    with open(os.path.join(a["dir"], "current"), "w") as f:
        f.write(str(len(cases)))


if __name__ == "__main__":
    import sys

    _child(sys.argv[1:])
