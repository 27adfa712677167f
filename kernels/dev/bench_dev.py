#!/usr/bin/env python3
"""Dev harness for kernels/<op>/kernel.cu: build production baselines + variants of ours, check them
against an fp64 torch reference and the production kernel, time them L2-cold in CUDA graphs.

One device call does everything (see kernels/NOTES.md for how it was used):

    python3 kernels/dev/bench_dev.py --ops silu_and_mul,fused_add_rmsnorm,merge_state \
        --variants default,pdl0 --shapes paper --dtypes fp16,bf16 --out $OUT

Baselines come from `astra-sglang extract` workspaces: .kwork/<op> (silu_and_mul: SGLang JIT;
fused_add_rmsnorm: FlashInfer FusedAddRMSNorm with sgl-kernel's host code and flags; merge_state:
FlashInfer MergeState, base-2 LSE, the harness converts) and, when present,
.gpu_ws/sgl_kernel/merge_state (sgl-kernel merge_attn_states, "sgl", the merge baseline then).
`v2cfg` is our merge kernel built with sgl-kernel's launch shape (one 16-byte pack per thread,
128-thread blocks, no PDL), a stand-in where no sgl-kernel workspace exists. Carry .kwork (and
.gpu_ws) to the device machine.

Timing: a CUDA graph of N back-to-back calls cycling over K input sets with K * set_bytes > 4 x L2
(every call L2-cold), implementations interleaved replay by replay, median over R replays, spread =
(p90 - p10) / median.  Copy ceiling: an SM copy kernel on 1 GiB; launch floor: an empty kernel.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KW = ROOT / ".kwork"
OURS_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "-Xcompiler", "-fPIC"]

# Variants of our kernels: name -> extra nvcc flags (defines).
VARIANTS = {
    "default": [],
    "fastmath": ["--use_fast_math"],
    "pdl0": ["-DASTRA_PDL=0"],
    "pdl1": ["-DASTRA_PDL=1"],
    "pdl3": ["-DASTRA_PDL=3"],
    "p2big": ["-DASTRA_P_BIG=2"],
    "cs1": ["-DASTRA_CS=1"],
    "cs2": ["-DASTRA_CS=2"],
    "t128": ["-DASTRA_THREADS=128"],
    "t512": ["-DASTRA_THREADS=512"],
    "precise": ["-DASTRA_PRECISE=1"],
    "kt1": ["-DASTRA_RMS_KT=1"],
    "kt4": ["-DASTRA_RMS_KT=4"],
    "wlate": ["-DASTRA_W_LATE=1"],
    "kt4wl": ["-DASTRA_RMS_KT=4", "-DASTRA_W_LATE=1"],
    "cl": ["-DASTRA_CLUSTER=1"],
    "pf0": ["-DASTRA_PF_MAX=0"],
    "pfbig": ["-DASTRA_PF_MAX=(64u<<20)"],
    "pfall": ["-DASTRA_PF_ALL=1", "-DASTRA_PF_MAX=(1u<<31)"],  # first wave prefetches at any size
    "pfold": ["-DASTRA_PF_ALL=0", "-DASTRA_PF_MAX=(8u<<20)"],  # silu/merge before call 4: single-wave grids <= 8 MB
    "old": [],  # the source in .kwork/old/<op>.cu (e.g. the last committed kernel), same flags
    "k4all": ["-DASTRA_K4_MIN=512"],
    "k4none": ["-DASTRA_K4_MIN=4096"],
}
# which variants make sense per op
_SM = ("silu_and_mul", "merge_state")
_RN = ("fused_add_rmsnorm",)
VARIANT_OPS = {"p2big": _SM, "cs1": _SM, "cs2": _SM, "t128": _SM, "t512": _SM, "precise": ("merge_state",),
               "kt1": _RN, "kt4": _RN, "wlate": _RN, "kt4wl": _RN, "cl": _RN, "pfold": _SM,
               "k4all": _RN, "k4none": _RN}

UTIL_CU = r"""
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;  // one 16-byte vector per thread
  if (i < n) b[i] = __ldg(a + i);
}
__global__ void empty_kernel(int x) {}
__global__ void empty_pdl_kernel(int x) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
extern "C" int util_empty_pdl(cudaStream_t st) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1); cfg.blockDim = dim3(32); cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&cfg, empty_pdl_kernel, 0);
}
extern "C" int util_copy(const void* a, void* b, size_t bytes, int sms, cudaStream_t st) {
  size_t n = bytes / 16;
  copy_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>((const uint4*)a, (uint4*)b, n);
  return (int)cudaGetLastError();
}
extern "C" int util_empty(cudaStream_t st) { empty_kernel<<<1, 32, 0, st>>>(0); return (int)cudaGetLastError(); }
"""

# Dev-only baseline: FlashInfer MergeState behind the astra ABI (base-2 LSE; the harness converts).
MERGE_FI_CU = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>
#include "flashinfer/attention/cascade.cuh"
// FlashInfer MergeState (cascade.cuh) behind the astra ABI. NOTE: lse in base 2 (caller converts).
template <typename T>
static cudaError_t run(const void* va, const void* sa, const void* vb, const void* sb, void* vo, void* so,
                       int64_t n, int64_t h, int64_t d, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  return flashinfer::MergeState<T, T>((T*)va, (float*)sa, (T*)vb, (float*)sb, (T*)vo, (float*)so, (uint32_t)n,
                                      (uint32_t)h, (uint32_t)d, st);
}
extern "C" cudaError_t astra_merge_state(const void* va, const void* sa, const void* vb, const void* sb, void* vo,
                                         void* so, int64_t n, int64_t h, int64_t d, int dtype, cudaStream_t st) {
  try {
    switch (dtype) {
      case 0: return run<float>(va, sa, vb, sb, vo, so, n, h, d, st);
      case 1: return run<half>(va, sa, vb, sb, vo, so, n, h, d, st);
      case 2: return run<__nv_bfloat16>(va, sa, vb, sb, vo, so, n, h, d, st);
    }
  } catch (...) { return cudaErrorInvalidValue; }
  return cudaErrorInvalidValue;
}
"""

DTYPE_CODE = {"fp32": 0, "fp16": 1, "bf16": 2}


# ----------------------------------------------------------------------------- build
def _manifest_cmd(ws: Path, out: Path, extra_inc=()):
    m = json.loads((ws / "manifest.json").read_text())
    inc = [f"-I{ws / i}" for i in m["include_dirs"]] + [f"-I{i}" for i in extra_inc]
    return ["nvcc", *m["flags"], *inc, "-shared", str(ws / "baseline.cu"), "-o", str(out)]


def build_all(ops, variants, bdir: Path, log):
    bdir.mkdir(parents=True, exist_ok=True)
    jobs = {}
    (bdir / "util.cu").write_text(UTIL_CU)
    jobs["util"] = ["nvcc", *OURS_FLAGS, "-shared", str(bdir / "util.cu"), "-o", str(bdir / "util.so")]
    extra = [KW / "extra_include"]
    if "silu_and_mul" in ops:
        jobs["silu_and_mul:base"] = _manifest_cmd(KW / "silu_and_mul", bdir / "silu_and_mul.base.so")
    if "fused_add_rmsnorm" in ops:
        jobs["fused_add_rmsnorm:base"] = _manifest_cmd(KW / "fused_add_rmsnorm", bdir / "fused_add_rmsnorm.base.so", extra)
    sgl = ROOT / ".gpu_ws" / "sgl_kernel" / "merge_state"  # sgl-kernel merge_attn_states (natural-log lse)
    if "merge_state" in ops and (sgl / "manifest.json").exists():
        jobs["merge_state:sgl"] = _manifest_cmd(sgl, bdir / "merge_state.sgl.so")
    if "merge_state" in ops:
        ws = KW / "merge_state"
        if (ws / "manifest.json").exists():
            jobs["merge_state:base"] = _manifest_cmd(ws, bdir / "merge_state.base.so", extra)
        src = bdir / "merge_fi.cu"
        src.write_text(MERGE_FI_CU)
        if not (ws / "manifest.json").exists():
            jobs["merge_state:fi"] = [
            "nvcc", *OURS_FLAGS, "-DNDEBUG", "--expt-relaxed-constexpr", "-use_fast_math",
            "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16", "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
            f"-I{KW / 'fi_include'}", *[f"-I{e}" for e in extra], "-shared", str(src), "-o", str(bdir / "merge_state.fi.so"),
        ]
        jobs["merge_state:v2cfg"] = [
            "nvcc", *OURS_FLAGS, "-use_fast_math", "-DASTRA_PDL=0", "-DASTRA_MAX_P=1", "-DASTRA_THREADS=128", "-shared",
            str(ROOT / "kernels/merge_state/kernel.cu"), "-o", str(bdir / "merge_state.v2cfg.so"),
        ]
    for op in ops:
        for v in variants:
            if v in VARIANT_OPS and op not in VARIANT_OPS[v]:
                continue
            src = KW / "old" / f"{op}.cu" if v == "old" else ROOT / f"kernels/{op}/kernel.cu"
            jobs[f"{op}:{v}"] = ["nvcc", *OURS_FLAGS, *VARIANTS[v], "-shared", str(src), "-o", str(bdir / f"{op}.{v}.so")]
    t0 = time.time()

    def run(item):
        name, cmd = item
        p = subprocess.run(cmd, capture_output=True, text=True)
        return name, p.returncode, p.stderr[-3000:]

    built = {}
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as ex:
        for name, rc, err in ex.map(run, jobs.items()):
            if rc != 0:
                log(f"BUILD FAIL {name}: {err}")
            else:
                built[name] = bdir / (name.replace(":", ".") + ".so") if name != "util" else bdir / "util.so"
    log(f"built {len(built)}/{len(jobs)} in {time.time() - t0:.1f}s")
    return built


# ----------------------------------------------------------------------------- ops
class Lib:
    def __init__(self, path, op):
        self.lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        self.fn = getattr(self.lib, f"astra_{op}")
        self.fn.restype = ctypes.c_int
        P, I, F, D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
        self.fn.argtypes = {
            "silu_and_mul": [P, P, I, I, D, P],
            "fused_add_rmsnorm": [P, P, P, I, I, F, D, P],
            "merge_state": [P, P, P, P, P, P, I, I, I, D, P],
        }[op]


def is_lse2(op, name):
    """FlashInfer MergeState builds take base-2 LSE (the harness converts at the boundary)."""
    if op != "merge_state":
        return False
    if name == "fi":
        return True
    if name == "base":
        m = KW / "merge_state" / "manifest.json"
        return m.exists() and float(json.loads(m.read_text()).get("attrs", {}).get("lse_base", 0)) == 2.0
    return False


def tdt(name):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def p(t):
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


class SiluOp:
    name = "silu_and_mul"
    eps = None

    @staticmethod
    def set_bytes(dims, dt):
        t, d = dims
        return 3 * t * d * dt.itemsize

    @staticmethod
    def make(dims, dt, gen, dist="normal", offset=0):
        import torch

        t, d = dims
        n = t * 2 * d + offset
        x = torch.randn(n, generator=gen, device="cuda", dtype=torch.float32)
        if dist == "large":
            x = x * 8
        elif dist == "uniform":
            x = torch.rand(n, generator=gen, device="cuda") * 20 - 10
        x = x.to(dt)[offset:].view(t, 2 * d)
        out = torch.empty(t * d + offset, device="cuda", dtype=dt)[offset:].view(t, d)
        return {"input": x, "out": out}

    @staticmethod
    def call(lib, s, dims, dtc, stream, lse2=False):
        t, d = dims
        return lib.fn(p(s["out"]), p(s["input"]), t, d, dtc, ctypes.c_void_p(stream))

    @staticmethod
    def poison(s):
        s["out"].fill_(float("nan"))

    @staticmethod
    def snapshot(s):
        return {}

    @staticmethod
    def outputs(s):
        return {"out": s["out"]}

    @staticmethod
    def reference(s, dims, snap):
        import torch

        x = s["input"].double()
        d = dims[1]
        return {"out": torch.nn.functional.silu(x[:, :d]) * x[:, d:]}


class FarnOp:
    name = "fused_add_rmsnorm"
    eps = 1e-6

    @staticmethod
    def set_bytes(dims, dt):
        t, h = dims
        return (4 * t * h + h) * dt.itemsize

    @staticmethod
    def make(dims, dt, gen, dist="normal", offset=0):
        import torch

        t, h = dims
        x = torch.randn(t * h + offset, generator=gen, device="cuda")
        r = torch.randn(t * h + offset, generator=gen, device="cuda")
        w = 1.0 + 0.25 * torch.randn(h + offset, generator=gen, device="cuda")
        if dist == "large":
            x, r = x * 64, r * 64
            r[:: max(1, 509)] = 2000.0
        elif dist == "uniform":
            x = torch.rand(t * h + offset, generator=gen, device="cuda") * 2 - 1
            r = torch.rand(t * h + offset, generator=gen, device="cuda") * 2 - 1
        return {
            "input": x.to(dt)[offset:].view(t, h),
            "residual": r.to(dt)[offset:].view(t, h),
            "weight": w.to(dt)[offset:],
        }

    @staticmethod
    def call(lib, s, dims, dtc, stream, lse2=False):
        t, h = dims
        return lib.fn(p(s["input"]), p(s["residual"]), p(s["weight"]), t, h, FarnOp.eps, dtc, ctypes.c_void_p(stream))

    @staticmethod
    def poison(s):
        pass  # in place: outputs are the inputs

    @staticmethod
    def snapshot(s):
        return {"input": s["input"].clone(), "residual": s["residual"].clone()}

    @staticmethod
    def restore(s, snap):
        s["input"].copy_(snap["input"])
        s["residual"].copy_(snap["residual"])

    @staticmethod
    def outputs(s):
        return {"input": s["input"], "residual": s["residual"]}

    @staticmethod
    def reference(s, dims, snap):
        import torch

        x = snap["input"].double()
        r = snap["residual"].double()
        w = s["weight"].double()
        y = x + r
        rms = torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + FarnOp.eps)
        return {"input": y * rms * w, "residual": y}


class MergeOp:
    name = "merge_state"
    eps = None

    @staticmethod
    def set_bytes(dims, dt):
        n, h, d = dims
        return 3 * n * h * d * dt.itemsize + 3 * n * h * 4

    @staticmethod
    def make(dims, dt, gen, dist="normal", offset=0):
        import torch

        n, h, d = dims
        va = torch.randn(n * h * d + offset, generator=gen, device="cuda")
        vb = torch.randn(n * h * d + offset, generator=gen, device="cuda")
        sa = torch.randn(n * h, generator=gen, device="cuda") * 4
        sb = torch.randn(n * h, generator=gen, device="cuda") * 4
        if dist == "large":
            sa, sb = sa * 25, sb * 25
            va, vb = va * 100, vb * 100
        elif dist == "special":
            # +-inf LSE: empty states. Some pairs get one side inf, a few both.
            m = torch.rand(n * h, generator=gen, device="cuda")
            sa[m < 0.1] = float("inf")
            sa[(m >= 0.1) & (m < 0.2)] = float("-inf")
            sb[(m >= 0.2) & (m < 0.3)] = float("inf")
            sb[(m >= 0.3) & (m < 0.4)] = float("-inf")
            both = (m >= 0.4) & (m < 0.43)
            sa[both] = float("-inf")
            sb[both] = float("inf")
        elif dist == "inf_lse":  # the spec's pattern: a empty, b empty, a +inf, both empty
            k = torch.randint(0, 8, (n * h,), generator=gen, device="cuda")
            sa[k == 1] = float("-inf")
            sb[k == 2] = float("-inf")
            sa[k == 3] = float("inf")
            sa[k == 4] = float("-inf")
            sb[k == 4] = float("-inf")
        return {
            "v_a": va.to(dt)[offset:].view(n, h, d),
            "s_a": sa.view(n, h).contiguous(),
            "v_b": vb.to(dt)[offset:].view(n, h, d),
            "s_b": sb.view(n, h).contiguous(),
            "v_out": torch.empty(n * h * d + offset, device="cuda", dtype=dt)[offset:].view(n, h, d),
            "s_out": torch.empty(n, h, device="cuda"),
        }

    @staticmethod
    def call(lib, s, dims, dtc, stream, lse2=False):
        n, h, d = dims
        if lse2:  # FlashInfer MergeState takes base-2 LSE
            return lib.fn(p(s["v_a"]), p(s["s_a2"]), p(s["v_b"]), p(s["s_b2"]), p(s["v_out"]), p(s["s_out"]), n, h, d,
                          dtc, ctypes.c_void_p(stream))
        return lib.fn(p(s["v_a"]), p(s["s_a"]), p(s["v_b"]), p(s["s_b"]), p(s["v_out"]), p(s["s_out"]), n, h, d, dtc,
                      ctypes.c_void_p(stream))

    @staticmethod
    def prep_lse2(s):
        s["s_a2"] = s["s_a"] * math.log2(math.e)
        s["s_b2"] = s["s_b"] * math.log2(math.e)

    @staticmethod
    def poison(s):
        s["v_out"].fill_(float("nan"))
        s["s_out"].fill_(float("nan"))

    @staticmethod
    def snapshot(s):
        return {}

    @staticmethod
    def outputs(s):
        return {"v_out": s["v_out"], "s_out": s["s_out"]}

    @staticmethod
    def reference(s, dims, snap):
        import torch

        a = s["s_a"].double()
        b = s["s_b"].double()
        ninf = torch.full_like(a, float("-inf"))
        a = torch.where(torch.isinf(a), ninf, a)
        b = torch.where(torch.isinf(b), ninf, b)
        m = torch.maximum(a, b)
        ea = torch.exp(a - m)
        eb = torch.exp(b - m)
        se = ea + eb
        v = s["v_a"].double() * (ea / se)[..., None] + s["v_b"].double() * (eb / se)[..., None]
        return {"v_out": v, "s_out": torch.log(se) + m}


OPS = {"silu_and_mul": SiluOp, "fused_add_rmsnorm": FarnOp, "merge_state": MergeOp}


def shapes_for(op, sel):
    """Shape lists: 'paper', 'corpus', 'edge', 'decode', or explicit 'AxB,...'; join with '+'."""
    if "+" in sel:
        out = []
        for part in sel.split("+"):
            for d in shapes_for(op, part):
                if d not in out:
                    out.append(d)
        return out
    if any(c.isdigit() for c in sel):
        return [tuple(int(v) for v in s.split("x")) for s in sel.split(",")]
    if op == "merge_state":
        try:
            sys.path.insert(0, str(ROOT))
            from kernels.merge_state.spec import SPEC  # type: ignore

            return [s.dims for s in SPEC.shapes(sel)]
        except Exception:
            pass
        paper = [(512, 40, 128), (768, 32, 256), (1, 32, 128), (16, 32, 128), (64, 32, 128), (256, 32, 128)]
        corpus = sorted({(t, h, 128) for t in (1, 16, 64, 256, 1024, 4096, 16384) for h in (8, 16, 32, 40, 64)})
        edge = [(1, 1, 128), (3, 5, 100), (7, 3, 33), (5, 2, 4), (2, 4, 256), (16384, 64, 128)]
        return {"paper": paper, "corpus": corpus + paper, "edge": edge, "decode": [s for s in corpus if s[0] <= 256]}[sel]
    sys.path.insert(0, str(ROOT))
    mod = __import__(f"kernels.{op}.spec", fromlist=["SPEC"])
    return [s.dims for s in mod.SPEC.shapes(sel)]


# ----------------------------------------------------------------------------- check
def rel_err(out, ref):
    import torch

    o = out.double()
    fin = torch.isfinite(ref)
    nan_mismatch = int((torch.isnan(o) != torch.isnan(ref)).sum().item())
    if fin.any():
        diff = (o[fin] - ref[fin]).norm().item()
        den = ref[fin].norm().item() or 1.0
        e = diff / den
        if not math.isfinite(e):
            e = float("inf")
    else:
        e = 0.0
    return e, nan_mismatch


FLOOR = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}


def check(op, libs, shapes, dtypes, dists, log, base_name="base", offsets=(0,)):
    """Run every lib on the same fresh inputs; err vs fp64 reference; ours must stay <= max(2*base, floor)."""
    import torch

    O = OPS[op]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(time.time()) & 0xFFFF)
    stream = torch.cuda.current_stream().cuda_stream
    fails = 0
    rows = []
    for dtype in dtypes:
        dt = tdt(dtype)
        for dims in shapes:
            for dist in dists:
                numel = 1
                for x in dims:
                    numel *= x
                for off in (offsets if numel < 10_000_000 else (0,)):
                    s = O.make(dims, dt, gen, dist, off)
                    if op == "merge_state":
                        O.prep_lse2(s)
                    snap = O.snapshot(s)
                    ref = O.reference(s, dims, snap)
                    errs = {}
                    for name, lib in libs.items():
                        if off and name in ("base", "fi", "v2cfg", "sgl"):
                            continue  # production kernels assume aligned tensors (torch's allocator)
                        if is_lse2(op, name) and (dtype == "fp32" or dims[2] not in (64, 128, 256, 512)):
                            continue
                        if op == "fused_add_rmsnorm":
                            O.restore(s, snap)
                        O.poison(s)
                        rc = O.call(lib, s, dims, DTYPE_CODE[dtype], stream, lse2=is_lse2(op, name))
                        torch.cuda.synchronize()
                        if rc != 0:
                            errs[name] = ("rc", rc)
                            continue
                        outs = O.outputs(s)
                        e = {}
                        for k, v in outs.items():
                            r = ref[k]
                            if is_lse2(op, name) and k == "s_out":
                                v = v * math.log(2)
                            e[k] = rel_err(v, r)
                        errs[name] = e
                    base = errs.get(base_name)
                    for name, e in errs.items():
                        if name in ("base", "fi", "v2cfg", "sgl"):
                            continue
                        if isinstance(base, dict):
                            base = {k: v for k, v in base.items() if math.isfinite(v[0])}
                        bad = []
                        if isinstance(e, tuple):
                            bad.append(f"rc={e[1]}")
                        else:
                            for k, (err, nanm) in e.items():
                                be = base[k][0] if isinstance(base, dict) and k in base else 0.0
                                lim = max(2.0 * be, FLOOR[dtype])
                                if k == "s_out":
                                    lim = max(2.0 * be, 1e-5)
                                if err > lim or nanm:
                                    bad.append(f"{k}: err {err:.2e} > {lim:.2e} (base {be:.2e}) nan_mismatch {nanm}")
                        tag = f"{op} {'x'.join(map(str, dims))} {dtype} {dist} off{off} {name}"
                        if bad:
                            fails += 1
                            log(f"CHECK FAIL {tag}: {'; '.join(bad)}")
                        rows.append({"op": op, "dims": dims, "dtype": dtype, "dist": dist, "offset": off, "impl": name,
                                     "errs": {k: v for k, v in (e.items() if isinstance(e, dict) else [])},
                                     "base": {k: v for k, v in (base.items() if isinstance(base, dict) else [])}})
                    del s, ref, snap
    return fails, rows


# ----------------------------------------------------------------------------- timing
def l2_bytes():
    import torch

    return torch.cuda.get_device_properties(0).L2_cache_size


def time_graphs(calls, n_calls, reps=15, warm=3):
    """calls: {name: fn(i)} each launching call i on the current stream. Returns {name: [us per call]}."""
    import torch

    graphs = {}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for name, fn in calls.items():
            for i in range(min(n_calls, 3)):
                fn(i)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for i in range(n_calls):
                    fn(i)
            graphs[name] = g
    torch.cuda.synchronize()
    for _ in range(warm):
        for g in graphs.values():
            g.replay()
    torch.cuda.synchronize()
    ev = {n: [] for n in graphs}
    for _ in range(reps):
        for n, g in graphs.items():
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            ev[n].append((a, b))
    torch.cuda.synchronize()
    return {n: [a.elapsed_time(b) * 1000.0 / n_calls for a, b in lst] for n, lst in ev.items()}


def med_spread(xs):
    xs = sorted(xs)
    m = statistics.median(xs)
    lo = xs[max(0, int(0.1 * (len(xs) - 1)))]
    hi = xs[min(len(xs) - 1, int(math.ceil(0.9 * (len(xs) - 1))))]
    return m, (hi - lo) / m if m else 0.0


def bench(op, libs, shapes, dtypes, log, copy_bw, reps=15, util=None):
    import torch

    O = OPS[op]
    L2 = l2_bytes()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    rows = []
    for dtype in dtypes:
        dt = tdt(dtype)
        for dims in shapes:
            sb = O.set_bytes(dims, dt)
            k = max(2, math.ceil(4 * L2 / sb))
            free = torch.cuda.mem_get_info()[0]
            if k * sb * 1.3 > free * 0.8:
                k = max(2, int(free * 0.8 / (sb * 1.3)))
            est_us = 2.0 + sb / 3.0e6
            n = max(k, min(2000, int(math.ceil(400.0 / est_us))))
            n = k * max(1, round(n / k))
            sets = [O.make(dims, dt, gen) for _ in range(k)]
            if op == "merge_state":
                for s in sets:
                    O.prep_lse2(s)
            calls = {}
            for name, lib in libs.items():
                if is_lse2(op, name) and (dtype == "fp32" or dims[2] not in (64, 128, 256, 512)):
                    continue
                stream_fn = lambda: torch.cuda.current_stream().cuda_stream

                def mk(lib=lib, name=name):
                    def f(i):
                        rc = O.call(lib, sets[i % k], dims, DTYPE_CODE[dtype], stream_fn(), lse2=is_lse2(op, name))
                        if rc != 0:
                            raise RuntimeError(f"{op} {name} rc={rc}")
                    return f

                calls[name] = mk()
            if util is not None:  # an SM copy of the same bytes (half read, half written), same rotation
                half = (sb // 2) // 16 * 16
                cbufs = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(2 * k)]
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                cfn = util.util_copy

                def cp(i, cbufs=cbufs, half=half, sms=sms):
                    cfn(cbufs[2 * (i % k)].data_ptr(), cbufs[2 * (i % k) + 1].data_ptr(), half, sms,
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))

                calls["copy"] = cp
            try:
                res = time_graphs(calls, n, reps=reps)
            except RuntimeError as e:
                log(f"BENCH FAIL {op} {dims} {dtype}: {e}")
                continue
            row = {"op": op, "dims": list(dims), "dtype": dtype, "bytes": sb, "n_calls": n, "sets": k, "impls": {}}
            for name, xs in res.items():
                m, spr = med_spread(xs)
                row["impls"][name] = {"us": m, "spread": spr, "pct_copy": 100.0 * sb / (m * 1e-6) / copy_bw}
            rows.append(row)
            del sets
            torch.cuda.empty_cache()
    return rows


def measure_floor_and_copy(util, log):
    import torch

    fn_copy = util.util_copy
    fn_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    fn_empty = util.util_empty
    fn_empty.argtypes = [ctypes.c_void_p]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nbytes = 1 << 30
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    st = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    res = time_graphs({"copy": lambda i: fn_copy(a.data_ptr(), b.data_ptr(), nbytes, sms, st()),
                       "torch_copy": lambda i: b.copy_(a)}, 10, reps=10)
    copy_us = statistics.median(res["copy"])
    copy_bw = 2 * nbytes / (copy_us * 1e-6)
    tc_bw = 2 * nbytes / (statistics.median(res["torch_copy"]) * 1e-6)
    del a, b
    fn_pdl = util.util_empty_pdl
    fn_pdl.argtypes = [ctypes.c_void_p]
    fl = time_graphs({"empty": lambda i: fn_empty(st()), "empty_pdl": lambda i: fn_pdl(st())}, 1000, reps=10)
    floor_us = statistics.median(fl["empty"])
    log(f"copy ceiling (SM kernel, 1 GiB): {copy_bw / 1e12:.3f} TB/s; torch copy_ in graph: {tc_bw / 1e12:.3f} TB/s; "
        f"graph launch floor (empty kernel): {floor_us:.3f} us; PDL-chained empty kernel (wait+trigger): "
        f"{statistics.median(fl['empty_pdl']):.3f} us")
    return copy_bw, floor_us


def print_table(rows, log, floor_us):
    if not rows:
        return
    names = []
    for r in rows:
        for n in r["impls"]:
            if n not in names:
                names.append(n)
    base = "sgl" if "sgl" in names else ("base" if "base" in names else names[0])
    hdr = f"{'op':<18}{'shape':<16}{'dt':<5}" + "".join(f"{n[:9]:>10}" for n in names) + "  spd(default)  %copy  x-floor copy/def"
    log(hdr)
    for r in rows:
        im = r["impls"]
        line = f"{r['op'][:17]:<18}{'x'.join(map(str, r['dims'])):<16}{r['dtype']:<5}"
        line += "".join(f"{im[n]['us']:>10.2f}" if n in im else f"{'-':>10}" for n in names)
        best = "default" if "default" in im else names[-1]
        if base in im and best in im:
            line += f"  {im[base]['us'] / im[best]['us']:>11.2f}x  {im[best]['pct_copy']:>5.0f}%  {im[best]['us'] / floor_us:>6.2f}"
            if "copy" in im:
                line += f"  {im['copy']['us'] / im[best]['us']:>6.2f}"
        log(line)


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="silu_and_mul,fused_add_rmsnorm,merge_state")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--shapes", default="paper", help="paper | corpus | edge | decode | AxB,... (per op: op=sel;op=sel)")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--check-shapes", default="edge")
    ap.add_argument("--check-dtypes", default="fp32,fp16,bf16")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--copy-ref", action="store_true", help="also time an SM copy of each shape's bytes")
    ap.add_argument("--tag", default="", help="suffix for the json file")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--build-dir", default="/tmp/astra_dev_build")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/astra_dev_out"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "bench_dev.log", "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    ops = [o for o in a.ops.split(",") if o]
    variants = [v for v in a.variants.split(",") if v]
    built = build_all(ops, variants, Path(a.build_dir), log)
    if a.build_only:
        return
    import torch

    log(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
        f"L2 {l2_bytes() / 2**20:.0f} MiB, SMs {torch.cuda.get_device_properties(0).multi_processor_count}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    util = ctypes.CDLL(str(built["util"]))
    copy_bw, floor_us = measure_floor_and_copy(util, log)

    def sel(spec, op):
        if "=" in spec:
            d = dict(x.split("=", 1) for x in spec.split(";"))
            return d.get(op, d.get("*", "paper"))
        return spec

    results = {"copy_bw": copy_bw, "floor_us": floor_us, "check": [], "bench": []}
    total_fail = 0
    for op in ops:
        libs = {}
        for key, path in built.items():
            if key.startswith(op + ":"):
                libs[key.split(":", 1)[1]] = Lib(path, op)
        if not a.no_check:
            shapes = shapes_for(op, sel(a.check_shapes, op))
            t0 = time.time()
            dists = {"silu_and_mul": ("normal", "large", "uniform"), "fused_add_rmsnorm": ("normal", "large", "uniform"),
                     "merge_state": ("normal", "large", "special", "inf_lse")}[op]
            base_name = ("sgl" if "sgl" in libs else "v2cfg") if op == "merge_state" else "base"
            f, rows = check(op, libs, shapes, a.check_dtypes.split(","), dists, log, base_name, offsets=(0, 1))
            total_fail += f
            results["check"] += rows
            log(f"check {op}: {len(shapes)} shapes, {f} failures ({time.time() - t0:.1f}s)")
        if not a.no_bench:
            shapes = shapes_for(op, sel(a.shapes, op))
            t0 = time.time()
            rows = bench(op, libs, shapes, a.dtypes.split(","), log, copy_bw, reps=a.reps,
                         util=util if a.copy_ref else None)
            results["bench"] += rows
            log(f"bench {op}: {len(rows)} rows ({time.time() - t0:.1f}s)")
            print_table(rows, log, floor_us)
            base = "sgl" if "sgl" in libs else ("base" if "base" in libs else "v2cfg")
            for v in list(libs) + ["copy"]:
                if v == base:
                    continue
                sp = [r["impls"][base]["us"] / r["impls"][v]["us"] for r in rows if base in r["impls"] and v in r["impls"]]
                if sp:
                    log(f"  geomean speedup {v} vs {base}: {geomean(sp):.3f}x  (min {min(sp):.3f}x over {len(sp)})")
        (out / f"bench_dev{a.tag}.json").write_text(json.dumps(results, indent=1))
    log(f"TOTAL CHECK FAILURES: {total_fail}")


if __name__ == "__main__":
    main()
