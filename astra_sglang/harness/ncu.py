"""`bench --ncu`: Nsight Compute metrics for one shape, parsed to JSON.

The kernel runs in a worker under `ncu --clock-control none --profile-from-start off`; the
worker warms up, then opens the profiler (cudaProfilerStart) around exactly one call, so only
that call's kernels are profiled. Reported per kernel: duration, DRAM throughput (% of peak),
achieved and theoretical occupancy, registers per thread, local-memory traffic (spills),
launch configuration and the top warp-stall reasons. Where the profiler is not permitted
(no access to the GPU's performance counters, or no ncu), the error says so plainly.
"""
from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ..errors import AstraError

BASE_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__block_size",
    "launch__shared_mem_per_block_static",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
)
STALL_REGEX = r"regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"
_STALL_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")

_NOT_PERMITTED = (
    "ERR_NVGPUCTRPERM", "LibraryNotLoaded", "not permitted", "Permission denied", "Insufficient privilege",
    "profiling is not supported", "Device not supported", "Failed to initialize the profiler",
)


class ProfilerUnavailable(AstraError):
    """ncu is missing or may not read the GPU's performance counters here."""


def find_ncu() -> Optional[str]:
    for c in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if c and Path(c).exists():
            return c
    for p in sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"), reverse=True) if Path("/opt/nvidia/nsight-compute").is_dir() else []:
        return str(p)
    return None


def ncu_argv(ncu: str, log: str, metrics: Sequence[str]) -> List[str]:
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            "--csv", "--log-file", log, "--metrics", ",".join(metrics)]


# ------------------------------------------------------------------------------------------
# parsing (pure)


def _num(v: str) -> Union[float, str]:
    s = (v or "").strip().replace(",", "")
    try:
        return float(s)
    except ValueError:
        return (v or "").strip()


_TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def parse_csv(text: str) -> List[Dict[str, Any]]:
    """Kernels from `ncu --csv` output (long 'Metric Name/Unit/Value' rows, or a wide raw page).

    Returns [{"id", "kernel", "metrics": {name: (unit, value)}}] in launch order."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    kernels: Dict[str, Dict[str, Any]] = {}
    order: List[str] = []
    if "Metric Name" in header:
        ix = {h: i for i, h in enumerate(header)}
        for r in rows[1:]:
            if len(r) < len(header):
                continue
            kid = r[ix["ID"]]
            if kid not in kernels:
                kernels[kid] = {"id": kid, "kernel": r[ix["Kernel Name"]], "metrics": {}}
                order.append(kid)
            kernels[kid]["metrics"][r[ix["Metric Name"]]] = (r[ix.get("Metric Unit", ix["Metric Name"])] if "Metric Unit" in ix else "",
                                                             _num(r[ix["Metric Value"]]))
        return [kernels[k] for k in order]
    # wide "raw" page: header of metric names, a units row, then one row per kernel
    units = rows[1] if len(rows) > 1 else [""] * len(header)
    ix = {h: i for i, h in enumerate(header)}
    for r in rows[2:]:
        if len(r) < len(header) or "ID" not in ix:
            continue
        m = {h: (units[i] if i < len(units) else "", _num(r[i])) for i, h in enumerate(header)
             if "__" in h}
        kernels[r[ix["ID"]]] = {"id": r[ix["ID"]], "kernel": r[ix.get("Kernel Name", 0)], "metrics": m}
        order.append(r[ix["ID"]])
    return [kernels[k] for k in order]


def summarize_kernel(k: Dict[str, Any], top: int = 5) -> Dict[str, Any]:
    m = k["metrics"]

    def val(name: str) -> Optional[float]:
        v = m.get(name)
        return v[1] if v and isinstance(v[1], float) else None

    dur = m.get("gpu__time_duration.sum")
    dur_us = None
    if dur and isinstance(dur[1], float):
        dur_us = dur[1] * _TIME_UNITS.get(dur[0].strip().lower(), 1e-3)
    stalls = []
    for name, (unit, v) in m.items():
        mm = _STALL_RE.match(name)
        if mm and isinstance(v, float) and v > 0:
            stalls.append({"reason": mm.group(1), "warps_per_issue": v})
    stalls.sort(key=lambda s: -s["warps_per_issue"])
    ld, st = val("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"), val("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")
    return {
        "kernel": k["kernel"],
        "duration_us": dur_us,
        "dram_throughput_pct": val("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        "dram_bytes": (val("dram__bytes_read.sum") or 0) + (val("dram__bytes_write.sum") or 0)
        if val("dram__bytes_read.sum") is not None else None,
        "achieved_occupancy_pct": val("sm__warps_active.avg.pct_of_peak_sustained_active"),
        "theoretical_occupancy_pct": val("sm__maximum_warps_per_active_cycle_pct"),
        "registers_per_thread": val("launch__registers_per_thread"),
        "grid_size": val("launch__grid_size"),
        "block_size": val("launch__block_size"),
        "static_shared_bytes": val("launch__shared_mem_per_block_static"),
        "local_load_bytes": ld,
        "local_store_bytes": st,
        "local_spills": bool((ld or 0) + (st or 0) > 0) if ld is not None or st is not None else None,
        "top_stalls": stalls[:top],
    }


def not_permitted(text: str) -> Optional[str]:
    for marker in _NOT_PERMITTED:
        if marker.lower() in text.lower():
            for line in text.splitlines():
                if marker.lower() in line.lower():
                    return line.strip()
            return marker
    return None


def parse_resource_usage(text: str) -> List[Dict[str, Any]]:
    """`cuobjdump --dump-resource-usage` -> [{function, registers, stack, shared, local}]."""
    out = []
    fn = None
    for line in text.splitlines():
        m = re.search(r"Function\s+([^\s:]+)\s*:", line)
        if m:
            fn = m.group(1)
        r = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", line)
        if r and fn:
            out.append({"function": fn, "registers": int(r.group(1)), "stack": int(r.group(2)),
                        "shared": int(r.group(3)), "local": int(r.group(4))})
            fn = None
    return out


def resource_usage(lib: Path) -> List[Dict[str, Any]]:
    exe = shutil.which("cuobjdump") or ("/usr/local/cuda/bin/cuobjdump" if Path("/usr/local/cuda/bin/cuobjdump").exists() else None)
    if not exe:
        return []
    try:
        p = subprocess.run([exe, "--dump-resource-usage", str(lib)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_resource_usage(p.stdout)


# ------------------------------------------------------------------------------------------
# worker side


def run_profile_job(job: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from ..registry import get_op
    from .impl import Impl
    from .inputs import make_case_inputs, to_prod_abi
    from .worker import emit

    spec = get_op(job["op"])
    torch.cuda.init()
    impl = Impl(job["impl"], spec)
    dims = tuple(job["dims"])
    dtype = job["dtype"]
    t = make_case_inputs(spec, dims, dtype, spec.distributions[0] if spec.distributions else "normal", 1, "cuda")
    t = to_prod_abi(spec, t, job.get("prod_attrs"))
    scalars = spec.scalars(dims)
    emit("stage", msg="warm-up")
    for _ in range(int(job.get("warmup", 3))):
        rc = impl(t, dims, dtype, scalars)
        if rc:
            return {"ok": False, "reason": f"kernel returned cudaError {rc}"}
    torch.cuda.synchronize()
    emit("stage", msg="profiled call")
    torch.cuda.profiler.start()
    rc = impl(t, dims, dtype, scalars)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return {"ok": rc == 0, "reason": "" if rc == 0 else f"kernel returned cudaError {rc}"}


# ------------------------------------------------------------------------------------------
# caller side


def profile_impl(op: str, impl: str, dims: Sequence[int], dtype: str, *, prod_attrs=None, timeout: float = 300.0,
                 progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    from .worker import run_worker

    ncu = find_ncu()
    if not ncu:
        raise ProfilerUnavailable("Nsight Compute (ncu) is not installed here: --ncu needs it on PATH")
    job = {"mode": "profile", "op": op, "impl": impl, "dims": list(dims), "dtype": dtype, "prod_attrs": prod_attrs or {}}
    from .worker import default_argv

    for metrics in ((*BASE_METRICS, STALL_REGEX), BASE_METRICS):
        fd, log = tempfile.mkstemp(prefix="astra-ncu-", suffix=".csv")
        os.close(fd)
        wr = run_worker(job, argv=ncu_argv(ncu, log, metrics) + default_argv(), timeout=timeout,
                        total_timeout=timeout * 2, progress=progress)
        text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
        os.unlink(log)
        blocked = not_permitted(text + "\n" + wr.stderr_tail + "\n" + wr.stdout_tail)
        if blocked:
            raise ProfilerUnavailable(f"Nsight Compute may not profile on this machine ({blocked}); it needs access to "
                                      "the GPU performance counters (root, or NVreg_RestrictProfilingToAdminUsers=0)")
        if "Failed to find metric" in text or "not found" in text and "metric" in text.lower():
            continue  # retry without the stall regex
        kernels = parse_csv(text)
        if not wr.ok and not kernels:
            raise AstraError(f"ncu run failed: {wr.reason}")
        return {"kernels": [summarize_kernel(k) for k in kernels], "raw": kernels, "ok": wr.ok,
                "reason": wr.reason, "metrics": list(metrics)}
    raise AstraError("ncu does not know the metrics this tool asks for (older Nsight Compute?)")


def profile(op: str, workspace: Any, candidate: Optional[Union[str, Path]], shape: Union[str, Sequence[int]],
            dtype: str = "fp16", *, timeout: float = 300.0, progress=None) -> Dict[str, Any]:
    """Profile production (and the candidate) on one shape; JSON-ready dict."""
    from ..build import first_error_line
    from ..build.workspace import open_workspace
    from ..registry import get_op

    spec = get_op(op)
    ws = open_workspace(op, workspace)
    dims = spec.shapes(shape)[0].dims if isinstance(shape, str) else tuple(shape)
    out: Dict[str, Any] = {"op": op, "shape": "x".join(map(str, dims)), "dtype": dtype,
                           "tool": "ncu --clock-control none", "impls": {}}
    libs = [("production", ws.build())]
    if candidate:
        libs.append(("candidate", ws.build(Path(candidate))))
    for who, b in libs:
        if not b.ok:
            raise AstraError(f"{who} does not compile: {first_error_line(b.log)}")
        res = profile_impl(op, f"lib:{b.library}", dims, dtype, prod_attrs=ws.attrs if who == "production" else None, timeout=timeout,
                           progress=progress)
        res["resource_usage"] = resource_usage(b.library)
        out["impls"][who] = res
    return out


def format_profile(p: Dict[str, Any]) -> str:
    lines = [f"ncu {p['op']} {p['shape']} {p['dtype']}:"]
    for who, res in p["impls"].items():
        for k in res["kernels"]:
            st = ", ".join(f"{s['reason']} {s['warps_per_issue']:.2f}" for s in k["top_stalls"][:3])
            lines.append(
                f"  {who:10s} {k['kernel'][:60]}: {k['duration_us'] or 0:.2f} µs, DRAM {k['dram_throughput_pct'] or 0:.1f}%, "
                f"occupancy {k['achieved_occupancy_pct'] or 0:.1f}% (theor. {k['theoretical_occupancy_pct'] or 0:.0f}%), "
                f"{k['registers_per_thread'] or 0:.0f} regs, spills {'yes' if k['local_spills'] else 'no'}; stalls: {st}")
    return "\n".join(lines)
