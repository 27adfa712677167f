"""Run extracted production baselines through the astra ABI against the specs' fp64 references.

    python tests/gpu_baselines/run_baselines.py --ws astra-work/silu_and_mul [--ws ...] \
        [--dtypes fp16,bf16] [--max-per-class 8] [--json out.json] [--md out.md]

For every workspace (one op, one production variant): load its built library (the
newest build/baseline-*.so, or build it when nvcc is available) with
astra_sglang.build.loader.KernelLib, and for each dtype and shape class (decode, prefill,
paper, edge) run fresh random inputs through the ABI on the current stream, with "out"
buffers poisoned (NaN), and compare every output and in-place side effect with the
spec's fp64 reference. Variant conventions are honoured: spec.to_variant_abi /
from_variant_abi around the call (merge_state's base-2 FlashInfer lse) and the
reference's `semantics` from the variant's attrs. Shapes a variant does not take in
production (Variant.supports) are reported as skipped, never as passes.

Error metric per output: max |out - ref| / (1 + |ref|) over positions where the reference
is finite; NaN/inf must sit exactly where the reference has them. A check passes when
the metric is <= the spec's Tolerance.floor for the output's dtype.

Needs astra_sglang installed; on a bare GPU box a plain editable install of the checkout
(`pip install --no-deps --no-build-isolation -e .`) is enough.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import inspect
import json
import math
import platform
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

CLASSES = ("decode", "prefill", "paper", "edge")
# distributions beyond "normal", run on the paper and edge classes
EXTRA_DISTS = {"silu_and_mul": ("large",), "fused_add_rmsnorm": ("large",), "merge_state": ("large", "inf_lse")}


def _bootstrap() -> None:
    """astra_sglang must be installed (a plain `pip install --no-deps -e .` of the checkout will do)."""
    try:
        importlib.import_module("astra_sglang.kernels")
    except ImportError as e:
        raise SystemExit(f"error: astra_sglang is not importable ({e}); from the repository root run "
                         "`pip install --no-deps --no-build-isolation -e .`")


def pick(shapes: Sequence[Any], n: int) -> List[Any]:
    """Up to n shapes spread evenly over the class, sorted by size."""
    s = sorted(shapes, key=lambda x: (math.prod(x.dims), x.dims))
    if len(s) <= n:
        return s
    idx = sorted({round(i * (len(s) - 1) / (n - 1)) for i in range(n)})
    return [s[i] for i in idx]


def library_for(ws_path: Path, spec) -> Path:
    libs = sorted((ws_path / "build").glob("baseline-*.so"), key=lambda p: p.stat().st_mtime)
    if libs:
        return libs[-1]
    from astra_sglang.build.workspace import Workspace

    res = Workspace.open(spec.name, path=ws_path).build()
    if not res.ok:
        raise RuntimeError(f"{ws_path}: baseline does not build: {res.log[-2000:]}")
    return res.library


def compare(out, ref, floor: float) -> Dict[str, Any]:
    import torch

    o = out.double()
    r = ref.double().to(o.device)
    finite = torch.isfinite(r)
    inf_r = torch.isinf(r)
    special_ok = bool(
        torch.equal(torch.isnan(o), torch.isnan(r))
        and torch.equal(torch.isinf(o), inf_r)
        and torch.equal(o[inf_r], r[inf_r])
    )
    if finite.any():
        of, rf = o[finite], r[finite]
        err = float(((of - rf).abs() / (1.0 + rf.abs())).max()) if bool(torch.isfinite(of).all()) else float("inf")
    else:
        err = 0.0
    return {"err": err, "special_ok": special_ok, "ok": special_ok and err <= floor}


def check_one(lib, spec, variant, dims, dtype: str, dist: str, seed: int, attrs: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    tensors = spec.make_inputs(tuple(dims), dtype, gen, dist=dist, device="cuda")
    for a in spec.abi:  # poison write-only outputs
        if a.role == "out":
            tensors[a.name].fill_(float("nan"))
    ref_in = {k: v.clone() for k, v in tensors.items()}
    scalars = spec.scalars(tuple(dims))
    abi = spec.to_variant_abi(tensors, attrs) if spec.to_variant_abi else tensors
    torch.cuda.synchronize()
    code = lib(abi, tuple(dims), dtype, scalars)
    torch.cuda.synchronize()
    if spec.from_variant_abi:
        spec.from_variant_abi(abi, tensors, attrs)
        torch.cuda.synchronize()
    if code != 0:
        return {"ok": False, "error": f"cudaError {code}"}
    kw = {}
    if "semantics" in attrs and "semantics" in inspect.signature(spec.reference).parameters:
        kw["semantics"] = attrs["semantics"]
    ref = spec.reference(ref_in, tuple(dims), scalars, **kw)
    outs = {}
    ok = True
    worst = 0.0
    for name, r in ref.items():
        t = tensors[name]
        dname = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[t.dtype]
        c = compare(t, r, spec.tolerance.floor[dname])
        outs[name] = c
        ok = ok and c["ok"]
        worst = max(worst, c["err"])
    return {"ok": ok, "err": worst, "outputs": outs}


def run_workspace(ws_path: Path, dtypes: Sequence[str], max_per_class: int, log=print) -> List[Dict[str, Any]]:
    import torch

    from astra_sglang.registry import get_op
    from astra_sglang.build.loader import KernelLib

    manifest = json.loads((ws_path / "manifest.json").read_text())
    spec = get_op(manifest["op"])
    variant = spec.variant(manifest["variant"])
    attrs = dict(manifest.get("attrs", {}))
    so = library_for(ws_path, spec)
    lib = KernelLib(so, spec)
    rows = []
    for dtype in dtypes:
        if dtype not in variant.dtypes:
            continue
        for cls in CLASSES:
            shapes = pick([s for s in list(spec.corpus) + list(spec.edge_shapes) if cls in s.tags], max_per_class)
            dists = ("normal",) + (EXTRA_DISTS.get(spec.name, ()) if cls in ("paper", "edge") else ())
            n_ok = n_run = n_skip = 0
            worst = 0.0
            fails = []
            t0 = time.perf_counter()
            for shp in shapes:
                why = variant.supports(shp.dims, dtype) if variant.supports else None
                if why:
                    n_skip += 1
                    continue
                for k, dist in enumerate(dists):
                    seed = zlib.crc32(f"{spec.name} {shp.key()} {dtype} {dist}".encode())
                    try:
                        res = check_one(lib, spec, variant, shp.dims, dtype, dist, seed, attrs)
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        n_skip += 1
                        continue
                    n_run += 1
                    if res["ok"]:
                        n_ok += 1
                    else:
                        fails.append({"dims": list(shp.dims), "dist": dist, **{k2: v for k2, v in res.items() if k2 != "ok"}})
                    if "err" in res and math.isfinite(res["err"]):
                        worst = max(worst, res["err"])
                torch.cuda.empty_cache()
            row = {
                "op": spec.name, "variant": variant.name, "dtype": dtype, "class": cls,
                "shapes": len(shapes), "checks": n_run, "passed": n_ok, "skipped": n_skip,
                "max_err": worst, "floor": spec.tolerance.floor[dtype], "fails": fails[:5],
                "seconds": round(time.perf_counter() - t0, 2),
            }
            rows.append(row)
            log(f"{spec.name:18s} {variant.name:11s} {dtype:5s} {cls:8s} {n_ok}/{n_run} pass"
                f"{f' ({n_skip} skipped)' if n_skip else ''}  max_err {worst:.2e} (floor {row['floor']:.1e})"
                + (f"  FAIL {fails[:2]}" if fails else ""))
    return rows


def device_info() -> Dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name, "capability": f"{p.major}.{p.minor}", "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def to_markdown(rows: List[Dict[str, Any]], info: Dict[str, Any], command: str, manifests: Dict[str, Any]) -> Dict[str, str]:
    """One markdown section per op (for results/<date>-<gpu>/baselines/<op>.md)."""
    out: Dict[str, str] = {}
    for op in dict.fromkeys(r["op"] for r in rows):
        lines = [
            f"## {info['date'][:10]} — {info['gpu']} (sm_{info['capability'].replace('.', '')})",
            "",
            f"- device: {info['gpu']}, compute capability {info['capability']}; torch {info['torch']} "
            f"(CUDA {info['cuda']}), Python {info['python']}",
            f"- date: {info['date']}",
            f"- command: `{command}`",
        ]
        for ws, m in manifests.items():
            if m["op"] == op:
                srcs = ", ".join(f"{k} {v['version']}" for k, v in m["sources"].items())
                lines.append(f"- workspace `{m['variant']}`: extracted for {m['arch']} with nvcc {m['nvcc']} from {srcs}")
        lines += [
            "- metric: max |out - ref| / (1 + |ref|) over every output and in-place side effect vs the spec's "
            "fp64 reference (NaN/inf positions must match); pass when <= the spec's floor for the dtype; "
            "fresh random inputs per check, write-only outputs poisoned with NaN",
            "",
            "| variant | dtype | class | checks passed | skipped (not a production shape) | max err | floor |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if r["op"] != op:
                continue
            lines.append(
                f"| {r['variant']} | {r['dtype']} | {r['class']} | {r['passed']}/{r['checks']} | {r['skipped']} "
                f"| {r['max_err']:.2e} | {r['floor']:.1e} |"
            )
        fails = [r for r in rows if r["op"] == op and r["fails"]]
        for r in fails:
            lines.append(f"\nFailures ({r['variant']} {r['dtype']} {r['class']}): `{json.dumps(r['fails'])[:800]}`")
        out[op] = "\n".join(lines) + "\n"
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ws", action="append", required=True, type=Path, help="an extracted workspace (repeatable)")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--max-per-class", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path, help="folder to write <op>.md sections into")
    args = ap.parse_args(argv)
    _bootstrap()
    info = device_info()
    print(json.dumps(info))
    rows: List[Dict[str, Any]] = []
    manifests = {}
    for ws in args.ws:
        manifests[str(ws)] = json.loads((ws / "manifest.json").read_text())
        rows += run_workspace(ws, args.dtypes.split(","), args.max_per_class)
    command = "python tests/gpu_baselines/run_baselines.py " + " ".join(
        (f"--ws {w}" for w in args.ws)) + f" --dtypes {args.dtypes} --max-per-class {args.max_per_class}"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": info, "command": command, "rows": rows, "manifests": manifests}, indent=1))
    if args.md:
        args.md.mkdir(parents=True, exist_ok=True)
        for op, text in to_markdown(rows, info, command, manifests).items():
            (args.md / f"{op}.md").write_text(text)
    bad = [r for r in rows if r["passed"] != r["checks"]]
    print(f"{sum(r['passed'] for r in rows)}/{sum(r['checks'] for r in rows)} checks passed, "
          f"{sum(r['skipped'] for r in rows)} skipped; {len(bad)} failing rows")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
