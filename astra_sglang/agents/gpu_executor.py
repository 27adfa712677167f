"""The real executor: candidates go through astra_sglang.harness.check (static checks, nvcc build,
fp64 + production oracle in a worker process), astra_sglang.harness.bench (L2-cold CUDA-graph timing
interleaved with production, chained and in context, re-check in the timed buffers, impossible
numbers refused) and astra_sglang.harness.ncu. Where flashinfer-python's CUTLASS/CuTe headers are found
(cute.py), every build of the run has them on its include path.

It needs the extracted workspace and, for check/bench/ncu, torch with a GPU; the orchestrator
itself never touches CUDA (everything runs in check/bench's worker processes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..build import query_gpu
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
    shape_key,
)


def _field(row: Any, name: str) -> Any:
    """A bench row field that may not exist yet (rows before in-context timing) or a dict key."""
    return row.get(name) if isinstance(row, dict) else getattr(row, name, None)


def timing_of(r: Any) -> Timing:
    """A bench row as a Timing: the chained times always, the in-context ones where bench has them."""
    return Timing(shape=tuple(int(x) for x in r.shape.split("x")), dtype=r.dtype, baseline_us=r.prod_us,
                  candidate_us=r.cand_us, baseline_spread=r.prod_spread, candidate_spread=r.cand_spread or 0.0,
                  pct_ceiling=r.cand_pct_of_ceiling, baseline_pct_ceiling=r.prod_pct_of_ceiling,
                  context_base_us=_field(r, "context_base_us"), context_cand_us=_field(r, "context_cand_us"),
                  context_spread_us=_field(r, "context_spread_us"),
                  timing_basis=_field(r, "timing_basis") or "chained",
                  context_headroom=_field(r, "headroom"), context_diff_ci_us=_field(r, "context_diff_ci_us"))


def refusals(rows: Sequence[Any]) -> List[str]:
    """'SHAPE DTYPE: reason' for every row bench refused: impossible numbers or a failed re-check of
    the timed graph (the row's `refused`, or `failed` as harness/results.py names it)."""
    out = []
    for r in rows:
        why = _field(r, "refused") or _field(r, "failed")
        if why:
            out.append(f"{_field(r, 'shape')} {_field(r, 'dtype')}: {why}")
    return out


def _gpu_name() -> str:
    return query_gpu("name") or "GPU (unknown)"


class GpuExecutor(Executor):
    name = "gpu"
    source_suffix = ".cu"
    bench_rechecks = True  # bench re-checks the candidate in the buffers it was timed on

    def __init__(self, spec, workspace, check_shapes: str = "check", final_shapes: str = "corpus+edge",
                 replays: int = 30, timeout: float = 60.0, progress=None, cute: bool = True) -> None:
        super().__init__(spec)
        from astra_sglang.harness.cases import select_shapes
        from .cute import find_include, with_includes

        self.cute_include = find_include(workspace.manifest) if cute else None
        self.ws = with_includes(workspace, [self.cute_include]) if self.cute_include else workspace
        self.replays = replays
        self.timeout = timeout
        self.progress = progress
        self._check_sel, self._final_sel = check_shapes, final_shapes
        self._check_shapes = select_shapes(spec, check_shapes)  # validates the selectors now
        self._final_shapes = select_shapes(spec, final_shapes)
        self._device: Optional[str] = None

    # -- facts -------------------------------------------------------------------------------
    def baseline_source(self) -> str:
        return self.ws.baseline.read_text()

    def describe(self) -> Dict[str, Any]:
        if self._device is None:
            self._device = _gpu_name()
        return {"executor": self.name, "op": self.spec.name, "device": self._device, "workspace": str(self.ws.path),
                "variant": self.ws.variant, "arch": self.ws.manifest.get("arch"),
                "versions": self.ws.manifest.get("versions"), **self._cute_facts(),
                "timer": "CUDA graph of back-to-back calls over rotating input sets > 4x L2 (every call L2-cold), "
                         f"production and candidate replayed interleaved, {self.replays} replays, median; where bench "
                         "also times a shape in context (between a producer and a consumer GEMM, decode shapes) its "
                         "speedup uses that time"}

    def _cute_facts(self) -> Dict[str, Any]:
        from .cute import cutlass_version

        if not self.cute_include:
            return {"cute_include": None}
        return {"cute_include": str(self.cute_include), "cutlass_version": cutlass_version(self.cute_include)}

    def default_bench_dtypes(self) -> List[str]:
        from astra_sglang.harness.cases import workspace_dtypes

        return [d for d in ("fp16", "bf16") if d in workspace_dtypes(self.spec, self.ws.manifest)]

    def mandatory_shapes(self, full: bool) -> List[Dims]:
        return [s.dims for s in (self._final_shapes if full else self._check_shapes)]

    def check_suite(self, full: bool) -> str:
        shapes = self.mandatory_shapes(full)
        sel = self._final_sel if full else self._check_sel
        from astra_sglang.harness.cases import workspace_dtypes

        return (f"'{sel}' shapes ({len(shapes)}: {', '.join(shape_key(s) for s in shapes[:10])}"
                f"{', ...' if len(shapes) > 10 else ''}) x {', '.join(workspace_dtypes(self.spec, self.ws.manifest))} x "
                f"distributions {', '.join(self.spec.distributions)}; fresh random inputs; error vs fp64 <= "
                f"max({self.spec.tolerance.k:g} x the production kernel's error, dtype floor); outputs poisoned, guard "
                "regions around every buffer, inputs must stay unchanged, a re-run in the same buffers")

    def language_notes(self) -> str:
        flags = " ".join(self.ws.flags)
        return (
            f"CUDA C++ (.cu), compiled with nvcc {flags} -shared and the workspace's include dirs (the production "
            "headers may be included, e.g. read_source('csrc/elementwise/activation.cuh')). Static checks reject: "
            "torch/ATen, stream or event creation, host synchronization, synchronous memcpy/memset, allocation in "
            "the call, file/process/network calls. Launch only on the stream passed in and return the launch's "
            "cudaError_t (cudaGetLastError()). dtype 0 fp32, 1 fp16, 2 bf16: all must work, for every size "
            "(hidden need not be a multiple of the vector width; one token)." + self._cute_note()
        )

    def _cute_note(self) -> str:
        from .cute import COMPILE_NOTE, cutlass_version

        if not self.cute_include:
            return " CuTe/CUTLASS headers are not on the include path here (no flashinfer-python found)."
        return (f" CuTe is available: CUTLASS {cutlass_version(self.cute_include)} headers are on the include path "
                "(#include <cute/tensor.hpp>; namespace cute; read_source('cute/tensor.hpp') reads them); "
                f"{COMPILE_NOTE}; a compile is bounded by the build timeout.")

    def read_include(self, rel: str) -> str:
        rel = rel.strip().lstrip("/")
        for d in self.ws.include_dirs:
            p = (d / rel).resolve()
            try:
                p.relative_to(d.resolve())
            except ValueError:
                continue
            if p.is_file():
                text = p.read_text(errors="replace")
                return text
        def shown(d: Path) -> str:
            try:
                return str(d.relative_to(self.ws.path))
            except ValueError:  # the CuTe dir lies outside the workspace
                return str(d)

        raise ExecutorError(f"no include {rel!r} in the workspace (include dirs: "
                            f"{', '.join(shown(d) for d in self.ws.include_dirs)})")

    # -- operations ----------------------------------------------------------------------------
    def compile(self, source: Path) -> CompileResult:
        from ..build import first_error_line
        from ..static_checks import errors, scan_file, summarize

        findings = scan_file(Path(source), self.ws.include_dirs)
        if errors(findings):
            lines = "\n".join(f.one_line() for f in errors(findings))
            return CompileResult(False, summarize(findings) or "static check failed", lines)
        res = self.ws.build(Path(source))
        if not res.ok:
            return CompileResult(False, first_error_line(res.log), res.log[-6000:], res.seconds)
        return CompileResult(True, seconds=res.seconds)

    def _shapes(self, base, extra: Sequence[Dims]):
        from ..spec import Shape

        seen = {s.dims for s in base}
        out = list(base)
        for d in extra:
            if tuple(d) not in seen:
                out.append(Shape(tuple(d), ("agent",), "added by the testing agent"))
                seen.add(tuple(d))
        return out

    def _check(self, source: Optional[Path], shapes, seed: int) -> CheckResult:
        from astra_sglang.harness.check import check_candidate

        r = check_candidate(self.spec.name, self.ws, source, shapes=shapes, seed=seed, timeout=self.timeout,
                            progress=self.progress)
        if r.ok:
            cases = len({(d["shape"], d["dtype"]) for d in r.details})
            reason = f"{cases} shape×dtype cases, {len(r.details)} comparisons passed ({r.seconds:.1f}s)"
        else:
            reason = r.reason
        return CheckResult(r.ok, reason, len(r.details), {"stage": r.stage, "notes": r.notes[:5]})

    def check(self, source: Path, extra: ExtraTests, seed: int, full: bool = False) -> CheckResult:
        base = self._final_shapes if full else self._check_shapes
        return self._check(Path(source), self._shapes(base, extra.shapes), seed)

    def check_tests_on_baseline(self, extra: ExtraTests, seed: int) -> CheckResult:
        return self._check(None, self._shapes([], extra.shapes), seed)

    def bench(self, source: Path, shapes: Sequence[Dims], dtypes: Sequence[str]) -> BenchResult:
        from astra_sglang.harness.bench import bench
        from ..spec import Shape

        rep = bench(self.spec.name, self.ws, Path(source), shapes=[Shape(tuple(d)) for d in shapes],
                    dtypes=list(dtypes), replays=self.replays, timeout=max(120.0, self.timeout), progress=self.progress)
        timings = [timing_of(r) for r in rep.rows if r.cand_us]
        info = {"device": rep.device, "ceiling_gbps": rep.ceiling_gbps, "launch_floor_us": rep.launch_floor_us,
                "replays": rep.replays, "recheck": (rep.recheck or {}).get("ok"), "software": rep.software}
        if rep.device:
            self._device = rep.device
        refused = refusals(rep.rows)
        if refused:  # impossible numbers: a failed candidate whatever else the report says
            return BenchResult(False, "bench refused the timing: " + "; ".join(refused), timings, info, refused)
        if not rep.ok:
            return BenchResult(False, rep.reason, timings, info)
        if len(timings) < len(rep.rows) or not timings:
            return BenchResult(False, "some shapes were not timed: " + "; ".join(rep.notes[:3]), timings, info)
        return BenchResult(True, "", timings, info)

    def ncu(self, source: Path, shape: Dims, dtype: str) -> Dict[str, Any]:
        from astra_sglang.harness.ncu import ProfilerUnavailable, format_profile, profile

        try:
            p = profile(self.spec.name, self.ws, Path(source), tuple(shape), dtype, progress=self.progress)
        except ProfilerUnavailable as e:
            raise ExecutorError(str(e)) from None
        except AstraError as e:
            raise ExecutorError(f"ncu failed: {e}") from None
        return {"summary": format_profile(p),
                "kernels": {who: res.get("kernels", []) for who, res in p.get("impls", {}).items()},
                "resource_usage": {who: res.get("resource_usage", []) for who, res in p.get("impls", {}).items()}}
