"""`astra-sglang bench`: how fast is a kernel, against the production kernel, measured properly.

Method (DESIGN.md, Timing):
- each implementation is captured as a CUDA graph of N back-to-back calls over rotating input
  sets totalling more than 4× the L2 (every call L2-cold, no launch gaps between calls); the
  graph is replayed R times, each replay timed with CUDA events; per-call time = replay / N;
- production and candidate are captured on the same input sets and replayed interleaved
  (P C, C P, P C, ...), so clock or thermal drift hits both alike;
- median and spread ((p90 - p10) / median) over replays; a difference smaller than the larger
  spread is reported as noise; speedup per shape and the geometric mean;
- the copy ceiling is measured once per GPU with an SM copy kernel (a graph's y.copy_(x)
  becomes a copy-engine memcpy node, which is slower) and cached on disk; % of ceiling uses
  the spec's bytes moved; the graph launch floor is an empty kernel's per-call time in a graph;
- in-place outputs (inout) are restored from a pristine copy before every replay, outside the
  timed region; production variants with their own convention (FlashInfer's base-2 lse) get
  converted copies of the inputs, made once, outside it too;
- L2-warm timing (one input set, repeated) is an option;
- after timing, the candidate is re-checked on fresh inputs in the very buffers it was timed
  on (catches results cached by pointer or warm-up detection).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import AstraError
from .report import BenchReport, BenchRow, median, spread
from .spec import Shape

DEFAULT_REPLAYS = 30
WARMUP_REPLAYS = 3
TARGET_REPLAY_US = 2000.0  # aim for replays of about 2 ms: far above event resolution
MAX_CALLS = 4096  # kernel nodes per graph
L2_FACTOR = 4.0  # rotating sets total more than this many L2s
MEM_CAP_BYTES = 24 << 30  # input sets for one shape never take more than this
CEILING_BYTES = 1 << 30  # bytes per copy when measuring the ceiling

HELPERS_CU = r"""
// astra-sglang bench helpers: an SM copy kernel (the bandwidth ceiling) and an empty kernel
// (the graph launch floor). Built once per GPU arch into the cache.
#include <cuda_runtime.h>
#include <cstdint>

__global__ void __launch_bounds__(256) astra_copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, int64_t n) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * 4 + threadIdx.x;
  int4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
    if (i < n) v[k] = src[i];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
    if (i < n) dst[i] = v[k];
  }
}

__global__ void astra_empty_kernel() {}

extern "C" cudaError_t astra_copy(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  if (n <= 0) return cudaSuccess;
  const int64_t per_block = 256 * 4;
  const unsigned blocks = static_cast<unsigned>((n + per_block - 1) / per_block);
  astra_copy_kernel<<<blocks, 256, 0, stream>>>(static_cast<const int4*>(src), static_cast<int4*>(dst), n);
  return cudaGetLastError();
}

extern "C" cudaError_t astra_empty(cudaStream_t stream) {
  astra_empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}
"""
HELPERS_VERSION = "1"


def cache_dir() -> Path:
    return Path(os.environ.get("ASTRA_CACHE_DIR", Path.home() / ".cache" / "astra-sglang"))


# ------------------------------------------------------------------------------------------
# planning (pure)


def plan_sets(set_bytes: int, l2_bytes: int, l2: str = "cold", mem_cap: int = MEM_CAP_BYTES) -> Tuple[int, str]:
    """How many rotating input sets: enough to exceed L2_FACTOR × L2 (at least 2), within mem_cap.

    Returns (n_sets, note) where note says when the memory cap kept the rotation short."""
    if l2 == "warm":
        return 1, ""
    if set_bytes <= 0:
        return 2, ""
    need = max(2, math.ceil(L2_FACTOR * l2_bytes / set_bytes))
    cap = max(1, mem_cap // set_bytes)
    if need > cap:
        n = max(1, cap)
        return n, (f"only {n} input sets fit in {mem_cap >> 30} GiB ({n * set_bytes / max(l2_bytes, 1):.1f}× L2)")
    return need, ""


def plan_calls(est_us: float, n_sets: int, target_us: float = TARGET_REPLAY_US, max_calls: int = MAX_CALLS) -> int:
    """Calls per graph replay: about target_us of work, every set used equally often, at least one pass."""
    est_us = max(est_us, 0.5)
    n = max(n_sets, int(math.ceil(target_us / est_us)))
    per = int(math.ceil(n / n_sets))
    n = per * n_sets
    if n > max_calls:
        n = max(n_sets, (max_calls // n_sets) * n_sets)
    return n


def ceiling_key(name: str, uuid: str, extra: str = "") -> str:
    return f"{name}|{uuid}|{extra}"


def load_cached_ceiling(path: Path, key: str) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    v = data.get(key)
    return v if isinstance(v, dict) and v.get("gbps") else None


def store_ceiling(path: Path, key: str, value: Dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = value
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# worker side (torch + CUDA)


class _Helpers:
    def __init__(self, lib_path: str):
        import ctypes

        self.lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_LOCAL)
        self.lib.astra_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        self.lib.astra_copy.restype = ctypes.c_int
        self.lib.astra_empty.argtypes = [ctypes.c_void_p]
        self.lib.astra_empty.restype = ctypes.c_int

    @staticmethod
    def _stream():
        import torch

        return torch.cuda.current_stream().cuda_stream

    def copy(self, dst, src, nbytes: int) -> int:
        import ctypes

        return self.lib.astra_copy(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), nbytes,
                                   ctypes.c_void_p(self._stream()))

    def empty(self) -> int:
        import ctypes

        return self.lib.astra_empty(ctypes.c_void_p(self._stream()))


def _graph_of(fn: Callable[[int], None], n: int):
    """Capture fn(0..n-1) into a CUDA graph (after one eager warm-up pass outside capture)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(0)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    torch.cuda.synchronize()
    return g


def _time_graphs(graphs: Sequence[Any], replays: int, before: Optional[Callable[[int], None]] = None,
                 warmup: int = WARMUP_REPLAYS) -> List[List[float]]:
    """Replay the graphs interleaved (rotating the order every round); ms per replay for each."""
    import torch

    k = len(graphs)
    for _ in range(warmup):
        for j, g in enumerate(graphs):
            if before:
                before(j)
            g.replay()
    torch.cuda.synchronize()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
              for _ in range(k)]
    for r in range(replays):
        order = list(range(k))
        if r % 2:
            order.reverse()
        for j in order:
            if before:
                before(j)
            a, b = events[j][r]
            a.record()
            graphs[j].replay()
            b.record()
    torch.cuda.synchronize()
    return [[a.elapsed_time(b) for a, b in events[j]] for j in range(k)]


def measure_ceiling(helpers: _Helpers, nbytes: int = CEILING_BYTES, calls: int = 10, replays: int = 10) -> Dict[str, Any]:
    """SM copy-kernel bandwidth (bytes read + written per second), GB/s."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    nbytes = int(min(nbytes, free // 4)) // 4096 * 4096
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)

    def call(i: int) -> None:
        rc = helpers.copy(dst, src, nbytes)
        if rc:
            raise RuntimeError(f"copy kernel failed: cudaError {rc}")

    g = _graph_of(call, calls)
    ms = _time_graphs([g], replays)[0]
    if not torch.equal(src[:4096], dst[:4096]) or not torch.equal(src[-4096:], dst[-4096:]):
        raise RuntimeError("the copy kernel did not copy")
    per_call_s = median(ms) / 1e3 / calls
    del src, dst, g
    torch.cuda.empty_cache()
    return {"gbps": 2 * nbytes / per_call_s / 1e9, "bytes": nbytes, "spread": spread(ms),
            "measured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def measure_launch_floor(helpers: _Helpers, calls: int = 1000, replays: int = 10) -> float:
    """Per-call time of an empty kernel in a graph of back-to-back calls, µs."""
    def call(i: int) -> None:
        rc = helpers.empty()
        if rc:
            raise RuntimeError(f"empty kernel failed: cudaError {rc}")

    g = _graph_of(call, calls)
    ms = _time_graphs([g], replays)[0]
    return median(ms) * 1e3 / calls


def _set_bytes(tensors: Dict[str, Any], names: Sequence[str]) -> int:
    return sum(tensors[n].numel() * tensors[n].element_size() for n in names)


def run_bench_job(job: Dict[str, Any]) -> Dict[str, Any]:
    """Worker entry (mode 'bench')."""
    import torch

    from .check import GuardedSet, Impl, FatalCaseError, _case_seed, make_case_inputs, run_case, to_prod_abi
    from .registry import get_op
    from .worker import emit

    spec = get_op(job["op"])
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    dev_name = props.name
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or job.get("l2_bytes") or (50 << 20))
    uuid = str(getattr(props, "uuid", ""))
    emit("stage", msg=f"device {dev_name}: {props.multi_processor_count} SMs, L2 {l2_bytes >> 20} MiB")
    helpers = _Helpers(job["helper_lib"])
    key = ceiling_key(dev_name, uuid, torch.version.cuda or "")
    cached = load_cached_ceiling(Path(job["ceiling_cache"]), key) if not job.get("remeasure") else None
    if cached:
        ceiling, source = cached, "cached"
    else:
        emit("stage", msg="measuring the copy ceiling (SM copy kernel)")
        ceiling, source = measure_ceiling(helpers), "measured"
        store_ceiling(Path(job["ceiling_cache"]), key, ceiling)
    emit("stage", msg="measuring the graph launch floor")
    floor_us = measure_launch_floor(helpers)
    gbps = float(ceiling["gbps"])
    prod = Impl(job["prod"], spec)
    cand = Impl(job["cand"], spec) if job.get("cand") else None
    replays = int(job.get("replays", DEFAULT_REPLAYS))
    l2 = job.get("l2", "cold")
    seed = int(job.get("seed", 0))
    prod_attrs = job.get("prod_attrs") or {}
    skip = job.get("skip", {})
    ptr_names = [a.name for a in spec.abi if a.ctype == "ptr"]
    inout = [a.name for a in spec.abi if a.ctype == "ptr" and a.role == "inout"]
    rows: List[Dict[str, Any]] = []
    notes: List[str] = []
    recheck = {"ok": True, "reason": "", "cases": 0, "failures": []}
    for shape in job["shapes"]:
        dims = tuple(int(x) for x in shape["dims"])
        skey = "x".join(map(str, dims))
        for dtype in job["dtypes"]:
            if f"{skey} {dtype}" in skip:
                notes.append(f"{skey} {dtype}: skipped ({skip[f'{skey} {dtype}']})")
                continue
            emit("stage", msg=f"timing {skey} {dtype}")
            dist = spec.distributions[0] if spec.distributions else "normal"
            first = make_case_inputs(spec, dims, dtype, dist, _case_seed(seed, dims, dtype, "bench", 0), "cuda")
            sb = _set_bytes(first, ptr_names)
            n_sets, cap_note = plan_sets(sb, l2_bytes, l2, int(job.get("mem_cap", MEM_CAP_BYTES)))
            # set 0 lives in guarded buffers: the re-check after timing reuses exactly these pointers
            gset = GuardedSet(spec, first, "cuda")
            gset.load(first)
            sets = [gset.views]
            for i in range(1, n_sets):
                t = make_case_inputs(spec, dims, dtype, dist, _case_seed(seed, dims, dtype, "bench", i), "cuda")
                sets.append({n: t[n] for n in ptr_names})
            # production takes its variant's convention (e.g. base-2 lse): converted copies of the
            # inputs that differ, made once here, outside the timed region; outputs are shared
            prod_sets = [{n: to_prod_abi(spec, s, prod_attrs)[n] for n in ptr_names} for s in sets]
            pristine = [{n: s[n].clone() for n in inout} for s in sets] if inout else []
            scalars = spec.scalars(dims)
            bm = int(spec.bytes_moved(dims, dtype))
            est = max(floor_us, bm / (gbps * 1e3)) if gbps else floor_us
            n_calls = plan_calls(est, n_sets)
            impls = [("production", prod)] + ([("candidate", cand)] if cand else [])
            graphs = []
            row_note = cap_note
            failed, who_failed = "", ""
            for who, impl in impls:
                def call(i: int, impl=impl, who=who) -> None:
                    rc = impl((prod_sets if who == "production" else sets)[i % n_sets], dims, dtype, scalars)
                    if rc:
                        raise RuntimeError(f"{who} returned cudaError {rc}")
                try:
                    graphs.append(_graph_of(call, n_calls))
                except RuntimeError as e:
                    failed = f"{skey} {dtype}: {who} could not be captured/run: {str(e).splitlines()[0]}"
                    who_failed = who
                    break
            if failed:
                if who_failed == "production":
                    notes.append(failed)
                    continue
                recheck.update(ok=False, reason=recheck["reason"] or failed)
                recheck["failures"].append(failed)
                emit("row", row=None, failure=failed)
                continue

            def restore(j: int) -> None:
                for s, ps, p in zip(sets, prod_sets, pristine):
                    for n in inout:
                        s[n].copy_(p[n])
                        if ps[n] is not s[n]:
                            ps[n].copy_(to_prod_abi(spec, {**s}, prod_attrs)[n])

            ms = _time_graphs(graphs, replays, restore if inout else None)
            per_call = [[m * 1e3 / n_calls for m in series] for series in ms]
            row = BenchRow.make(skey, dtype, per_call[0], per_call[1] if cand else None, bm, gbps,
                                calls_per_replay=n_calls, input_sets=n_sets, replays=replays,
                                tags=list(shape.get("tags", [])), note=row_note)
            rows.append(row.__dict__)
            emit("row", row=row.__dict__)
            del graphs
            # re-check on fresh inputs in the buffers the candidate was just timed on
            if job.get("recheck", True):
                emit("stage", msg=f"re-check {skey} {dtype} after timing")
                try:
                    bufs_p = GuardedSet(spec, first, "cuda")
                    d, f, n = run_case(spec, cand or prod, prod, gset, gset if cand is None else bufs_p, dims, dtype, dist,
                                       _case_seed(seed, dims, dtype, "recheck"), "cuda", run_index=1,
                                       label=f"{skey} {dtype} re-check after timing", baseline_only=cand is None,
                                       prod_attrs=prod_attrs)
                    del bufs_p
                except FatalCaseError as e:
                    f, n = [str(e)], []
                    recheck["cases"] += 1
                    recheck["failures"] += f
                    recheck.update(ok=False, reason=recheck["reason"] or f[0])
                    return _bench_result(rows, notes, recheck, dev_name, props, l2_bytes, gbps, source, floor_us)
                recheck["cases"] += 1
                notes += n
                if f:
                    recheck["failures"] += f
                    recheck.update(ok=False, reason=recheck["reason"] or f[0])
            del sets, prod_sets, pristine, gset, first
            torch.cuda.empty_cache()
    return _bench_result(rows, notes, recheck, dev_name, props, l2_bytes, gbps, source, floor_us)


def _bench_result(rows, notes, recheck, dev_name, props, l2_bytes, gbps, source, floor_us) -> Dict[str, Any]:
    import torch

    return {
        "ok": bool(recheck["ok"]), "reason": recheck["reason"], "rows": rows, "notes": notes, "recheck": recheck,
        "device": dev_name, "sm_count": props.multi_processor_count, "l2_bytes": l2_bytes, "ceiling_gbps": gbps,
        "ceiling_source": source, "launch_floor_us": floor_us,
        "software": {"torch": torch.__version__, "cuda": torch.version.cuda or "",
                     "driver": _driver_version()},
    }


def _driver_version() -> str:
    from .build import query_gpu

    return query_gpu("driver_version") or ""


# ------------------------------------------------------------------------------------------
# caller side


def build_helpers(arch_text: str) -> Path:
    """Build (once per arch, cached) the copy/empty helper kernels."""
    from .build import build_shared, first_error_line, parse_arch

    arch = parse_arch(arch_text)
    d = cache_dir() / "helpers"
    d.mkdir(parents=True, exist_ok=True)
    src = d / "astra_bench_helpers.cu"
    if not src.exists() or src.read_text() != HELPERS_CU:
        src.write_text(HELPERS_CU)
    flags = [arch.gencode("sglang_jit"), "-O3", "-std=c++17", "-Xcompiler", "-fPIC"]
    res = build_shared(src, [], flags, d / "build", f"helpers-v{HELPERS_VERSION}")
    if not res.ok:
        raise AstraError(f"the bench helper kernels do not compile: {first_error_line(res.log)}")
    return res.library


def bench(
    op: str,
    workspace: Any,
    candidate: Optional[Union[str, Path]] = None,
    *,
    shapes: Union[str, Sequence[Shape]] = "paper",
    dtypes: Sequence[str] = ("fp16", "bf16"),
    l2: str = "cold",
    replays: int = DEFAULT_REPLAYS,
    seed: Optional[int] = None,
    timeout: float = 120.0,
    total_timeout: float = 3600.0,
    recheck: bool = True,
    static: bool = True,
    remeasure_ceiling: bool = False,
    command: str = "",
    progress: Optional[Callable[[str], None]] = None,
) -> BenchReport:
    """Time production (and `candidate`) on `shapes`; see the module docstring.

    Never raises for anything the candidate does: a failure leaves report.ok False with the reason.
    Raises AstraError for usage errors."""
    from .build import first_error_line
    from .check import _open_workspace, _skips, select_shapes, workspace_dtypes
    from .registry import get_op
    from .static_checks import scan_file, summarize
    from .worker import run_worker

    t0 = time.monotonic()
    say = progress or (lambda s: None)
    if l2 not in ("cold", "warm"):
        raise AstraError(f"--l2 must be cold or warm, not {l2!r}")
    spec = get_op(op)
    ws = _open_workspace(op, workspace)
    shape_list = select_shapes(spec, shapes)
    have = workspace_dtypes(spec, ws.manifest)
    dts = [d for d in dtypes if d in have]
    if not dts:
        raise AstraError(f"none of the dtypes {', '.join(dtypes)} is supported by this {op} workspace "
                         f"(it has: {', '.join(have)})")
    seed = int(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    rep = BenchReport(op=op, variant=ws.variant, candidate=str(candidate) if candidate else None, l2=l2, replays=replays,
                      date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), command=command)

    def fail(reason: str) -> BenchReport:
        rep.ok, rep.reason = False, reason
        rep.seconds = time.monotonic() - t0
        return rep

    cand_path = Path(candidate) if candidate else None
    if cand_path is not None:
        if not cand_path.exists():
            raise AstraError(f"candidate {cand_path} does not exist")
        import hashlib

        rep.candidate_sha256 = hashlib.sha256(cand_path.read_bytes()).hexdigest()
        if static:
            s = summarize(scan_file(cand_path, ws.include_dirs))
            if s:
                return fail(s)
    say("building the production baseline")
    pb = ws.build()
    if not pb.ok:
        return fail(f"the production baseline does not compile: {first_error_line(pb.log)}")
    cb = None
    if cand_path is not None:
        say(f"building {cand_path.name}")
        cb = ws.build(cand_path)
        if not cb.ok:
            return fail(f"compile error: {first_error_line(cb.log)}")
    helpers = build_helpers(ws.manifest.get("arch", "sm_90"))
    job = {
        "mode": "bench", "op": op, "prod": f"lib:{pb.library}", "cand": f"lib:{cb.library}" if cb else None,
        "shapes": [{"dims": list(s.dims), "tags": list(s.tags)} for s in shape_list], "dtypes": dts,
        "l2": l2, "replays": replays, "seed": seed, "prod_attrs": ws.attrs,
        "helper_lib": str(helpers), "ceiling_cache": str(cache_dir() / "ceiling.json"),
        "remeasure": remeasure_ceiling, "recheck": recheck, "skip": _skips(spec, ws.variant, shape_list, dts),
    }
    wr = run_worker(job, timeout=timeout, total_timeout=total_timeout, progress=say)
    rows = [ev["row"] for ev in wr.events if ev.get("event") == "row" and ev.get("row")]
    p = wr.payload or {}
    rep.rows = [BenchRow(**r) for r in (p.get("rows") or rows)]
    for k in ("device", "sm_count", "l2_bytes", "ceiling_gbps", "ceiling_source", "launch_floor_us", "software"):
        if k in p:
            setattr(rep, k, p[k])
    rep.notes = [f"{d}: not benchmarked (the workspace has no {d})" for d in dtypes if d not in have]
    rep.notes += list(p.get("notes", []))
    rep.recheck = dict(p.get("recheck", {}))
    rep.seconds = time.monotonic() - t0
    if wr.status in ("ok", "failed") and p:
        rep.ok, rep.reason = bool(p.get("ok")), p.get("reason", "")
        return rep
    return fail(wr.reason)
