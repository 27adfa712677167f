"""A CPU stand-in for the GPU executor, so the whole loop runs offline (CI, demos).

Candidates are C files exporting the op's astra ABI entry point (host pointers, fp32 only,
the stream argument ignored), compiled with the host C compiler. Correctness is the project's own
oracle (astra_sglang.harness.checkjob.run_check, in its worker process, device "cpu"): fp64 reference and
the C baseline as "production", poisoned outputs, guard regions, re-runs in the same buffers.
Timing runs in another subprocess (standin_worker.py), production and candidate interleaved. A
compile error, a crash, a hang or a wrong result is a failed candidate with its reason, never a
crash of the loop.

Like bench on the GPU, it measures references beside the timings (a launch floor: an empty function
behind the ABI; per shape a same-bytes memcpy) and refuses impossible numbers: a candidate faster
than the fastest empty call or the fastest copy of its bytes, by more than CPU_MARGIN, skipped
work, and the round fails with that reason.

What it is not: it says nothing about GPU speed. It exists to exercise the loop's logic with real
compile errors, real wrong answers and real (CPU) timings.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..errors import AstraError
from .executor import (
    BenchResult,
    CheckResult,
    CompileResult,
    Dims,
    Executor,
    ExecutorError,
    ExtraTests,
    Timing,
    numel,
    shape_key,
)
from .standin_worker import MARK

HEADER = """/* astra-sglang CPU stand-in: the CUDA names the ABI uses, for C candidates. */
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
typedef int cudaError_t;
typedef void* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
"""

COPY_C = """#include <string.h>
int astra_standin_copy(void* dst, const void* src, size_t n) { memcpy(dst, src, n); return 0; }
"""
# CPU timings jitter more than a CUDA graph's: how far under a reference a time must be to be refused.
CPU_MARGIN = 0.10

# Shapes the CPU checks and times in milliseconds each.
CHECK_MAX_ELEMS = 1 << 18
FULL_MAX_ELEMS = 1 << 20
BENCH_MAX_ELEMS = 1 << 18


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise AstraError("the CPU stand-in executor needs a C compiler (cc, gcc or clang) on PATH")
    return cc


class StandinExecutor(Executor):
    name = "cpu-standin"
    source_suffix = ".c"

    def __init__(self, spec, baseline: Path, work_dir: Path, bench_shapes: Optional[Sequence[Dims]] = None,
                 check_shapes: str = "check", final_shapes: str = "corpus+edge", timeout: float = 120.0,
                 reps: int = 5) -> None:
        super().__init__(spec)
        self.baseline = Path(baseline)
        if not self.baseline.exists():
            raise AstraError(f"stand-in baseline {self.baseline} does not exist")
        self.work_dir = Path(work_dir)
        self.build_dir = self.work_dir / "standin-build"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.build_dir / "astra_standin.h").write_text(HEADER)
        self.timeout = timeout
        self.reps = reps
        self._bench_shapes = [tuple(s) for s in bench_shapes] if bench_shapes else None
        from astra_sglang.harness.cases import select_shapes

        # the same selectors as the GPU executor, minus what the CPU cannot check quickly
        self._check_shapes = [s.dims for s in select_shapes(spec, check_shapes) if numel(s.dims) <= CHECK_MAX_ELEMS]
        self._final_shapes = [s.dims for s in select_shapes(spec, final_shapes) if numel(s.dims) <= FULL_MAX_ELEMS]
        self._baseline_lib: Optional[Path] = None
        self._helpers: Optional[Dict[str, str]] = None

    # -- facts -------------------------------------------------------------------------------
    def baseline_source(self) -> str:
        return self.baseline.read_text()

    def describe(self) -> Dict[str, Any]:
        return {"executor": self.name, "op": self.spec.name, "device": "CPU (stand-in)",
                "compiler": _cc(), "baseline": str(self.baseline)}

    def default_bench_shapes(self) -> List[Dims]:
        if self._bench_shapes:
            return list(self._bench_shapes)
        return [s.dims for s in self.spec.shapes("paper") if numel(s.dims) <= BENCH_MAX_ELEMS]

    def default_bench_dtypes(self) -> List[str]:
        return ["fp32"]

    def max_test_elems(self) -> int:
        return FULL_MAX_ELEMS

    def signature(self) -> str:
        return self.spec.c_signature().replace('extern "C" ', "")

    def mandatory_shapes(self, full: bool) -> List[Dims]:
        return list(self._final_shapes if full else self._check_shapes)

    def check_suite(self, full: bool) -> str:
        shapes = self.mandatory_shapes(full)
        return (f"{len(shapes)} shapes ({', '.join(shape_key(s) for s in shapes[:12])}"
                f"{', ...' if len(shapes) > 12 else ''}) x fp32 x distributions "
                f"{', '.join(self.spec.distributions)}; fresh random inputs; poisoned outputs and guard regions; "
                f"inputs must stay unchanged; error <= max({self.spec.tolerance.k:g} x production error, "
                f"{self.spec.tolerance.floor['fp32']:g})")

    def language_notes(self) -> str:
        sig = self.signature()
        return (
            "C11 compiled with `cc -O2 -shared -fPIC -include astra_standin.h` (stdint, math, stdlib, "
            "string are included; cudaError_t is int, cudaStream_t is void*, cudaSuccess is 0). The file "
            f"must define `{sig}` on host pointers; only dtype 0 (fp32) is exercised; return cudaSuccess."
        )

    # -- compile ---------------------------------------------------------------------------------
    def compile(self, source: Path) -> CompileResult:
        try:
            self._compile_lib(Path(source))
        except _CompileFailed as e:
            return CompileResult(False, e.first, e.log, e.seconds)
        return CompileResult(True)

    def _compile_lib(self, source: Path) -> Path:
        text = source.read_text(errors="replace")
        cc = _cc()
        flags = ["-O2", "-std=c11", "-shared", "-fPIC", "-Werror=implicit-function-declaration",
                 "-Wl,-z,defs", "-include", str(self.build_dir / "astra_standin.h")]
        key = hashlib.sha256((text + "\0" + " ".join([cc] + flags)).encode()).hexdigest()[:16]
        lib = self.build_dir / f"{source.stem}-{key}.so"
        if lib.exists():
            return lib
        tmp = self.build_dir / f".{lib.name}.{os.getpid()}.tmp"
        cmd = [cc, *flags, "-o", str(tmp), str(source), "-lm"]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise _CompileFailed("compiler timed out after 120s", "", 120.0)
        dt = time.perf_counter() - t0
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = next((ln.strip() for ln in log.splitlines() if re.search(r"\berror\b:", ln)),
                         (log.splitlines() or ["compile failed"])[0])
            raise _CompileFailed(first, log[-6000:], dt)
        os.replace(tmp, lib)
        return lib

    def _baseline(self) -> Path:
        if self._baseline_lib is None:
            try:
                self._baseline_lib = self._compile_lib(self.baseline)
            except _CompileFailed as e:
                raise AstraError(f"the stand-in baseline {self.baseline} does not compile: {e.first}")
        return self._baseline_lib

    def _helper_libs(self) -> Dict[str, str]:
        """The empty ABI function (launch floor) and memcpy (copy reference), built once."""
        if self._helpers is None:
            libs: Dict[str, str] = {}
            for name, text in (("empty", f"{self.signature()} {{ return cudaSuccess; }}\n"), ("copy", COPY_C)):
                src = self.build_dir / f"astra_standin_{name}.c"
                if not src.exists() or src.read_text() != text:
                    src.write_text(text)
                try:
                    libs[name] = str(self._compile_lib(src))
                except _CompileFailed as e:
                    raise AstraError(f"the stand-in's {name} helper does not compile: {e.first}")
            self._helpers = libs
        return self._helpers

    # -- check / bench -------------------------------------------------------------------------------
    def _impl(self, lib: Path) -> str:
        """A `py:` implementation reference for the project's check worker that calls `lib` with
        host pointers (stream 0)."""
        adapter = lib.with_suffix(".py")
        if not adapter.exists():
            adapter.write_text(
                "# generated by astra-sglang's CPU stand-in executor\n"
                "from astra_sglang.registry import get_op\n"
                "from astra_sglang.build.loader import KernelLib\n"
                f"_lib = KernelLib({str(lib)!r}, get_op({self.spec.name!r}))\n\n\n"
                "def call(tensors, dims, dtype, scalars):\n"
                "    return _lib(tensors, dims, dtype, scalars, stream=0)\n")
        return f"py:{adapter}:call"

    def _check(self, lib: Optional[Path], shapes: Sequence[Dims], seed: int) -> CheckResult:
        """The project's own oracle (astra_sglang.harness.checkjob.run_check) in its worker process, on the CPU."""
        from astra_sglang.harness.checkjob import run_check
        from ..spec import Shape

        prod = self._impl(self._baseline())
        cand = self._impl(lib) if lib is not None else None
        ok, reason, failures, details, notes, device, wr = run_check(
            self.spec, prod, cand, [Shape(tuple(s)) for s in shapes], ["fp32"], seed=seed, device="cpu",
            timeout=self.timeout, total_timeout=self.timeout * 4)
        if ok:
            reason = f"{len({(d['shape'], d['dist'], d['run']) for d in details})} cases passed"
        return CheckResult(ok, reason, len(details))

    def check(self, source: Path, extra: ExtraTests, seed: int, full: bool = False) -> CheckResult:
        try:
            lib = self._compile_lib(Path(source))
        except _CompileFailed as e:
            return CheckResult(False, f"does not compile: {e.first}")
        shapes = list(dict.fromkeys(self.mandatory_shapes(full) + [tuple(s) for s in extra.shapes]))
        return self._check(lib, shapes, seed)

    def check_tests_on_baseline(self, extra: ExtraTests, seed: int) -> CheckResult:
        return self._check(None, list(extra.shapes) or self.default_bench_shapes()[:1], seed)

    def bench(self, source: Path, shapes: Sequence[Dims], dtypes: Sequence[str]) -> BenchResult:
        if any(d != "fp32" for d in dtypes):
            return BenchResult(False, "the CPU stand-in times fp32 only")
        try:
            lib = self._compile_lib(Path(source))
        except _CompileFailed as e:
            return BenchResult(False, f"does not compile: {e.first}")
        job = {"op": self.spec.name, "lib": str(lib), "baseline": str(self._baseline()),
               "shapes": [list(s) for s in shapes], "reps": self.reps, **self._helper_libs()}
        out = self._bench_worker(job, self.timeout * 2)
        if not out.get("ok"):
            return BenchResult(False, out.get("reason", "bench failed"))

        def pct(copy_us: Optional[float], us: float) -> Optional[float]:
            return None if not copy_us or us <= 0 else round(100.0 * copy_us / us, 2)

        timings = [Timing(shape=tuple(t["shape"]), dtype="fp32", baseline_us=t["baseline_us"],
                          candidate_us=t["candidate_us"], baseline_spread=t["baseline_spread"],
                          candidate_spread=t["candidate_spread"], pct_ceiling=pct(t.get("copy_us"), t["candidate_us"]),
                          baseline_pct_ceiling=pct(t.get("copy_us"), t["baseline_us"])) for t in out["timings"]]
        floor = out.get("launch_floor_us")
        info = {"device": "CPU (stand-in)", "timer": "perf_counter, interleaved", "launch_floor_us": floor,
                "ceiling": "memcpy of each shape's bytes moved, per shape"}
        refused = impossible(out["timings"], out.get("launch_floor_min_us"))
        if refused:
            return BenchResult(False, "bench refused the timing: " + "; ".join(refused), timings, info, refused)
        return BenchResult(True, "", timings, info)

    def _bench_worker(self, job: Dict[str, Any], timeout: float) -> Dict[str, Any]:
        job_file = self.build_dir / f"bench-{os.getpid()}.json"
        job_file.write_text(json.dumps(job))
        cmd = [sys.executable, "-m", "astra_sglang.agents.standin_worker", str(job_file)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "reason": f"timing timed out after {timeout:.0f}s (a hang?)"}
        finally:
            job_file.unlink(missing_ok=True)
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        if proc.returncode < 0:
            try:
                how = signal.Signals(-proc.returncode).name
            except ValueError:
                how = f"signal {-proc.returncode}"
            return {"ok": False, "reason": f"the candidate crashed the timing worker ({how})"}
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "reason": f"the timing worker failed (exit {proc.returncode}): {tail}"}

    def ncu(self, source: Path, shape: Dims, dtype: str) -> Dict[str, Any]:
        raise ExecutorError("Nsight Compute is not available in the CPU stand-in executor")


def impossible(rows: Sequence[Dict[str, Any]], floor_min_us: Optional[float]) -> List[str]:
    """'SHAPE fp32: why' for every row whose candidate's median beat the fastest empty call (the
    launch floor) or the fastest copy of its bytes seen in the run by more than CPU_MARGIN: it
    cannot have done the op's work. The fastest, not the median, reference: load only adds time,
    and the candidate's own spread is no excuse (a kernel that skips work after its first calls is
    the one that jitters)."""
    out = []
    for t in rows:
        us, key = t["candidate_us"], f"{shape_key(t['shape'])} fp32"
        copy = t.get("copy_min_us")
        if floor_min_us and us < floor_min_us * (1 - CPU_MARGIN):
            out.append(f"{key}: {us:.3f} µs per call is under the launch floor ({floor_min_us:.3f} µs)")
        elif copy and us < copy * (1 - CPU_MARGIN):
            out.append(f"{key}: {us:.3f} µs per call is faster than copying its bytes ({copy:.3f} µs at best): "
                       "it skipped work")
    return out


class _CompileFailed(Exception):
    def __init__(self, first: str, log: str, seconds: float) -> None:
        super().__init__(first)
        self.first, self.log, self.seconds = first, log, seconds
