#!/usr/bin/env python3
"""fused_add_rmsnorm against the kernel SGLang 0.5.23 really runs on Hopper for fp16/bf16.

sgl_kernel.fused_add_rmsnorm (sglang-kernel 0.4.10) calls flashinfer.norm.fused_add_rmsnorm, and
flashinfer 0.7.2 dispatches that to its CuTe-DSL kernel whenever nvidia-cutlass-dsl imports (a
dependency of the wheel) unless FLASHINFER_USE_CUDA_NORM=1.  A CuTe-DSL kernel has no CUDA source
for `extract`, so `astra-sglang bench` times the CUDA norm.cuh path instead.  This script times all
three in one process with bench's own method (L2-cold CUDA graphs of back-to-back calls over
rotating input sets > 4x L2, interleaved replays, median; astra_sglang.harness.timer's helpers):

  cute  flashinfer.norm.fused_add_rmsnorm, eager dispatch (CuTe-DSL), PDL as SGLang enables it
  cuda  the extracted FlashInfer norm.cuh baseline (the workspace, what RESULTS.md calls production)
  ours  kernels/fused_add_rmsnorm/kernel.cu

and checks, on each shape, that cute and ours agree with the spec's fp64 reference on the spec's
inputs, by `check`'s rule (astra_sglang.harness.numerics: ours' error may not exceed
max(k x cute's error, the dtype floor)).  Needs flashinfer-python and
nvidia-cutlass-dsl importable (SITE, a directory whose .pth files are honoured, may add them):

  python3 kernels/dev/bench_cute.py --workspace .gpu_ws/flashinfer/fused_add_rmsnorm \
      --shapes paper --out results.json
"""
from __future__ import annotations

import argparse
import json
import os
import site
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, required=True)
    ap.add_argument("--shapes", default="paper", help="paper | corpus | decode | prefill | AxB,...")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--site", default=os.environ.get("SITE", ""), help="extra site dir (wheels installed with --target)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="also time kernel.cu with FLAGS (-DX=V ...) prepended as #defines, as ours:NAME (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("bench_cute.json"))
    ap.add_argument("--replot", type=Path, help="only draw the plot of a saved JSON (no GPU needed)")
    a = ap.parse_args()
    if a.replot:
        print(plot(json.loads(a.replot.read_text()), a.replot.with_suffix(".png")))
        return 0
    if a.site:
        site.addsitedir(a.site)  # processes nvidia-cutlass-dsl's .pth (its dsl_packages path)
    os.environ.pop("FLASHINFER_USE_CUDA_NORM", None)

    import torch

    from astra_sglang.build.loader import KernelLib
    from astra_sglang.errors import AstraError
    from astra_sglang.harness.inputs import make_case_inputs
    from astra_sglang.harness.numerics import rel_err, tolerance
    from astra_sglang.harness.stats import geomean, median, spread
    from astra_sglang.harness.timer import graph_of as _graph_of, plan_calls, plan_sets, time_graphs as _time_graphs
    from astra_sglang.registry import get_op, shipped_kernel
    from astra_sglang.build.workspace import Workspace

    SPEC = get_op("fused_add_rmsnorm")

    try:
        import flashinfer.norm as fnorm
    except ImportError as e:
        print(f"flashinfer-python does not import here ({e}); pass --site with the wheels installed")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: this benchmark needs one")
        return 2
    if fnorm._use_cuda_norm(torch.device("cuda")):
        print("flashinfer would not use its CuTe-DSL norm here (nvidia-cutlass-dsl missing or arch unsupported)")
        return 2
    try:
        ws = Workspace.open("fused_add_rmsnorm", path=a.workspace)
    except AstraError as e:
        print(e)
        return 2
    libs = {}
    kernel = shipped_kernel(SPEC.name)
    builds = [("cuda", None), ("ours", kernel)]
    for spec in a.variant:  # compile-time variants of ours, e.g. nopdl=-DASTRA_PDL=0
        name, flags = spec.split("=", 1)
        src = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_cute_{name}.cu"
        defs = "".join(f"#define {d[2:].split('=', 1)[0]} {d[2:].split('=', 1)[1] if '=' in d else 1}\n"
                       for d in flags.split())
        src.write_text(defs + kernel.read_text())
        builds.append((f"ours:{name}", src))
    for name, src in builds:
        b = ws.build(src)
        if not b.ok:
            print(f"{name}: build failed\n{b.log[-2000:]}")
            return 1
        libs[name] = KernelLib(b.library, SPEC)
    props = torch.cuda.get_device_properties(0)
    l2 = int(props.L2_cache_size)
    pdl = fnorm.device_support_pdl(torch.device("cuda"))
    if "x" in a.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    else:
        shapes = [s.dims for s in SPEC.shapes(a.shapes)]

    def run_lib(name, s):
        rc = libs[name](s, tuple(s["input"].shape), s["dt"], SPEC.scalars(tuple(s["input"].shape)))
        if rc:
            raise RuntimeError(f"{name} returned cudaError {rc}")

    def run_cute(s):
        eps = SPEC.scalars(tuple(s["input"].shape))["eps"]
        fnorm.fused_add_rmsnorm(s["input"], s["residual"], s["weight"], eps, enable_pdl=pdl)

    impls = {"cute": run_cute, **{n: (lambda s, n=n: run_lib(n, s)) for n in libs}}
    rows, t0 = [], time.time()
    for dims in shapes:
        t, d = dims
        for dt in a.dtypes.split(","):
            seeds = iter(range(1234 + t * 7 + d, 1 << 62))

            def make():
                return {**make_case_inputs(SPEC, dims, dt, "normal", next(seeds), "cuda"), "dt": dt}

            # correctness on fresh inputs: both in-place outputs vs the spec's fp64 reference, check's rule
            ref_in = make()
            want = SPEC.reference(ref_in, dims, SPEC.scalars(dims))
            err = {}
            for name in ["cute"] + [n for n in libs if n.startswith("ours")]:
                s = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in ref_in.items()}
                impls[name](s)
                torch.cuda.synchronize()
                err[name] = max(rel_err(s[k], want[k])["err"] for k in want)
            ok = all(e <= tolerance(SPEC, dt, err["cute"]) for n, e in err.items() if n.startswith("ours"))
            first = make()
            set_bytes = sum(first[k].numel() * first[k].element_size() for k in ("input", "residual", "weight"))
            n_sets, _ = plan_sets(set_bytes, l2)
            sets = [first] + [make() for _ in range(n_sets - 1)]
            pristine = [{k: s[k].clone() for k in ("input", "residual")} for s in sets]
            bytes_moved = int(SPEC.bytes_moved(dims, dt))
            n_calls = plan_calls(max(1.0, bytes_moved / 4e6), n_sets)
            graphs = [_graph_of(lambda i, f=f: f(sets[i % n_sets]), n_calls) for f in impls.values()]

            def restore(_j):
                for s, p in zip(sets, pristine):
                    s["input"].copy_(p["input"])
                    s["residual"].copy_(p["residual"])

            ms = _time_graphs(graphs, a.replays, restore)
            us = {name: [m * 1e3 / n_calls for m in series] for name, series in zip(impls, ms)}
            row = {"shape": f"{t}x{d}", "dtype": dt, "bytes_moved": bytes_moved, "calls_per_replay": n_calls,
                   "input_sets": n_sets, "rel_err": err, "numerics_ok": ok,
                   **{f"{n}_us": median(v) for n, v in us.items()}, **{f"{n}_spread": spread(v) for n, v in us.items()}}
            row["ours_vs_cute"] = row["cute_us"] / row["ours_us"]
            row["ours_vs_cuda"] = row["cuda_us"] / row["ours_us"]
            rows.append(row)
            extra = "".join(f"  {n} {row[n + '_us']:7.2f}" for n in libs if n.startswith("ours:"))
            print(f"{row['shape']:>12} {dt}  cute {row['cute_us']:7.2f}  cuda {row['cuda_us']:7.2f}  ours {row['ours_us']:7.2f}{extra}"
                  f"  ours vs cute {row['ours_vs_cute']:.3f}x  vs cuda {row['ours_vs_cuda']:.3f}x"
                  f"  err cute {err['cute']:.1e} ours {err['ours']:.1e}{'' if ok else '  NUMERICS WORSE'}", flush=True)
            graphs = None  # free the captured graphs before the next shape's sets
            torch.cuda.empty_cache()
    import flashinfer

    res = {"device": props.name, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "replays": a.replays,
           "flashinfer": flashinfer.__version__, "torch": torch.__version__, "pdl": pdl, "command": " ".join(sys.argv),
           "geomean_ours_vs_cute": geomean([r["ours_vs_cute"] for r in rows]),
           "geomean_ours_vs_cuda": geomean([r["ours_vs_cuda"] for r in rows]),
           "geomean_cuda_vs_cute": geomean([r["cute_us"] / r["cuda_us"] for r in rows]),
           "numerics_ok": all(r["numerics_ok"] for r in rows), "seconds": time.time() - t0, "rows": rows}
    a.out.write_text(json.dumps(res, indent=1))
    plot(res, a.out.with_suffix(".png"))
    print(f"geomean ours vs cute {res['geomean_ours_vs_cute']:.3f}x, ours vs cuda {res['geomean_ours_vs_cuda']:.3f}x, "
          f"cuda vs cute {res['geomean_cuda_vs_cute']:.3f}x over {len(rows)} rows; numerics ok: {res['numerics_ok']}")
    return 0 if res["numerics_ok"] else 1


def plot(res, path: Path):
    """Ours' speedup over the CuTe-DSL kernel and over the CUDA norm.cuh kernel, per shape and dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from astra_sglang.figures import save_figure

    rows = res["rows"]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.22 * len(rows) + 2), 4.2))
    for key, color, label in (("ours_vs_cuda", "#8d99ae", "vs CUDA norm.cuh (RESULTS.md production)"),
                              ("ours_vs_cute", "#2a9d8f", "vs CuTe-DSL (flashinfer 0.7.2 eager dispatch)")):
        ax.plot(x, [r[key] for r in rows], "o", ms=3, color=color,
                label=f"{label}: geomean {res['geomean_' + key]:.3f}x")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['shape']} {r['dtype']}" for r in rows], fontsize=5, rotation=90)
    ax.set_ylabel("ours: speedup")
    ax.set_title(f"fused_add_rmsnorm, {res['device']}, L2-cold CUDA graphs, {res['date']}", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
