"""Timing worker of the CPU stand-in executor: `python -m astra_sglang.agents.standin_worker JOB.json`
prints one line, MARK + JSON. Production and candidate are called interleaved (P C, C P, ...) on the
same inputs; per-call time is the wall time of a batch over the calls in it. Runs in its own
process, so a candidate that crashes or hangs takes only this process down."""
from __future__ import annotations

import ctypes
import json
import statistics
import sys
import time
from typing import Any, Dict, List

MARK = "@@astra-standin "


def _time(fn, args, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - t0) / 1e3 / n  # µs per call


def _stats(xs: List[float]):
    med = statistics.median(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [med, med, med]
    return med, ((q[2] - q[0]) / med if med > 0 else 0.0)


def bench(job: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from astra_sglang.registry import get_op
    from astra_sglang.runtime import KernelLib

    spec = get_op(job["op"])
    cand, base = KernelLib(job["lib"], spec), KernelLib(job["baseline"], spec)
    out = []
    for i, dims in enumerate(job["shapes"]):
        dims = tuple(dims)
        inputs = spec.make_inputs(dims, "fp32", torch.Generator().manual_seed(1234 + i), "normal", device="cpu")
        scalars = spec.scalars(dims)
        tb = {k: v.clone() for k, v in inputs.items()}
        tc = {k: v.clone() for k, v in inputs.items()}
        ab = base.args(tb, dims, "fp32", scalars) + [ctypes.c_void_p(0)]
        ac = cand.args(tc, dims, "fp32", scalars) + [ctypes.c_void_p(0)]
        fb, fc = base._fn, cand._fn
        one = max(_time(fb, ab, 1), _time(fc, ac, 1), 1.0)
        n = max(1, int(3000.0 / one))  # about 3 ms per sample
        sb: List[float] = []
        sc: List[float] = []
        for r in range(int(job.get("reps", 5))):
            pair = [(fb, ab, sb), (fc, ac, sc)]
            for fn, args, acc in (pair if r % 2 == 0 else pair[::-1]):
                acc.append(_time(fn, args, n))
        mb, spb = _stats(sb)
        mc, spc = _stats(sc)
        out.append({"shape": list(dims), "baseline_us": mb, "candidate_us": mc,
                    "baseline_spread": spb, "candidate_spread": spc})
    return {"ok": True, "timings": out}


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    try:
        res = bench(job)
    except Exception as e:  # report, never a traceback as the answer
        res = {"ok": False, "reason": f"{type(e).__name__}: {e}"}
    sys.stdout.write("\n" + MARK + json.dumps(res) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
