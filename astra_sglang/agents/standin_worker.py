"""Timing worker of the CPU stand-in executor: `python -m astra_sglang.agents.standin_worker JOB.json`
prints one line, MARK + JSON. Production and candidate are called interleaved (P C, C P, ...) on the
same inputs; per-call time is the wall time of a batch over the calls in it, and a kernel's time
the fastest of its batches. Runs in its own
process, so a candidate that crashes or hangs takes only this process down.

Beside them, the CPU's counterparts of bench's references: the launch floor (an empty function
behind the same ABI, called the same way) and, per shape, a same-bytes copy (memcpy of the op's
bytes moved, half read and half written, as hot in cache as the op's inputs)."""
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
    """(time, relative spread): the fastest sample, since on a shared CPU other work only adds time
    (a median flips slower/faster under load), and the interquartile range over the median."""
    med = statistics.median(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [med, med, med]
    return min(xs), ((q[2] - q[0]) / med if med > 0 else 0.0)


def bench(job: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from astra_sglang.registry import get_op
    from astra_sglang.build.loader import KernelLib

    spec = get_op(job["op"])
    cand, base = KernelLib(job["lib"], spec), KernelLib(job["baseline"], spec)
    empty = KernelLib(job["empty"], spec) if job.get("empty") else None
    copy_fn = None
    if job.get("copy"):
        copy_fn = ctypes.CDLL(job["copy"]).astra_standin_copy
        copy_fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    floor = None
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
        # about 3 ms per sample for each kernel: a fast one is not timed over a handful of calls
        nb = max(1, int(3000.0 / max(_time(fb, ab, 1), 1.0)))
        nc = max(1, int(3000.0 / max(_time(fc, ac, 1), 1.0)))
        sb: List[float] = []
        sc: List[float] = []
        for r in range(int(job.get("reps", 5))):
            pair = [(fb, ab, sb, nb), (fc, ac, sc, nc)]
            for fn, args, acc, n in (pair if r % 2 == 0 else pair[::-1]):
                acc.append(_time(fn, args, n))
        mb, spb = _stats(sb)
        mc, spc = _stats(sc)
        row = {"shape": list(dims), "baseline_us": mb, "candidate_us": mc, "baseline_spread": spb,
               "candidate_spread": spc}
        if empty is not None and floor is None:
            ae = empty.args({k: v.clone() for k, v in inputs.items()}, dims, "fp32", scalars) + [ctypes.c_void_p(0)]
            fs = [_time(empty._fn, ae, 2000) for _ in range(int(job.get("reps", 5)))]
            floor = (*_stats(fs), min(fs))
        if copy_fn is not None:
            half = max(1, int(spec.bytes_moved(dims, "fp32")) // 2)
            src, dst = torch.ones(half, dtype=torch.uint8), torch.empty(half, dtype=torch.uint8)
            cargs = (dst.data_ptr(), src.data_ptr(), half)
            one = max(_time(copy_fn, cargs, 1), 0.05)
            m = max(1, int(3000.0 / one))
            cs = [_time(copy_fn, cargs, m) for _ in range(int(job.get("reps", 5)))]
            row["copy_us"], row["copy_spread"] = _stats(cs)
            row["copy_min_us"] = min(cs)  # load only adds time: the fastest copy bounds what is possible
        out.append(row)
    res: Dict[str, Any] = {"ok": True, "timings": out}
    if floor is not None:
        res["launch_floor_us"], res["launch_floor_spread"], res["launch_floor_min_us"] = floor
    return res


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
