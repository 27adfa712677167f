"""The result of each stage, one type each: CheckResult (check), BenchRow and BenchReport (bench),
with their JSON, table and plot."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..figures import save_figure
from ..files import write_whole
from .stats import geomean, is_noise, median, paired_ci, paired_noise, pct_of_ceiling, spread


def write_json(path: Union[str, Path], data: Dict[str, Any]) -> Path:
    """`data` as JSON at `path`, replaced whole through a temporary beside it: bench rewrites its report after every
    row, and a run killed mid-write must leave the previous rows, not half a file."""
    return write_whole(path, json.dumps(data, indent=1, default=str) + "\n")


@dataclass
class CheckResult:
    ok: bool
    reason: str  # the first failure, one line ("" when ok)
    failures: List[str] = field(default_factory=list)
    # one row per (shape, dtype, distribution, run, output tensor)
    details: List[Dict[str, Any]] = field(default_factory=list)
    op: str = ""
    candidate: Optional[str] = None  # path of the candidate (None: the production baseline)
    candidate_sha256: str = ""
    variant: str = ""
    production: str = ""  # what production is: the extracted baseline or SGLang's installed callable
    stage: str = ""  # where it ended: static | build | run | sanitize | done
    static: List[Dict[str, Any]] = field(default_factory=list)  # static-check findings
    notes: List[str] = field(default_factory=list)
    shapes: List[str] = field(default_factory=list)
    dtypes: List[str] = field(default_factory=list)
    seed: int = 0
    device: str = ""
    seconds: float = 0.0
    worker_status: str = ""
    log_tail: str = ""

    def summary(self) -> str:
        who = self.candidate or "production baseline"
        if self.ok:
            n = len({(d["shape"], d["dtype"]) for d in self.details})
            missed = sum(1 for x in self.notes if "not checked" in x)
            skipped = sum(1 for x in self.notes if ": skipped (" in x)
            alone = len({(d["shape"], d["dtype"]) for d in self.details if d.get("ref_only")})
            extra = "".join([f", {skipped} skipped (production does not take them)" if skipped else "",
                             f", {alone} judged against the fp64 reference alone (production does not take them)"
                             if alone else "",
                             f", {missed} NOT CHECKED (harness out of memory)" if missed else ""])
            return (f"PASS {self.op} {who}: {n} shape×dtype cases, {len(self.details)} comparisons{extra} "
                    f"({self.seconds:.1f}s)")
        return f"FAIL {self.op} {who}: {self.reason}"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def to_json(self, path: Union[str, Path]) -> Path:
        return write_json(path, self.to_dict())

    def worst(self) -> List[Dict[str, Any]]:
        """Per output tensor and dtype, the detail row with the largest candidate error / tolerance.
        Rows without errors (the in-graph and stream cases: pass/fail only) are not comparisons."""
        best: Dict[Tuple[str, str], Dict[str, Any]] = {}
        for d in self.details:
            if d.get("prod_err") is None or d.get("tol") is None:
                continue
            k = (d.get("tensor", ""), d.get("dtype", ""))
            r = _ratio(d)
            if k not in best or r > _ratio(best[k]):
                best[k] = d
        return list(best.values())


def _ratio(d: Dict[str, Any]) -> float:
    tol = d.get("tol") or 0.0
    err = d.get("cand_err")
    if err is None:
        return 0.0
    return float("inf") if tol == 0 else err / tol


@dataclass
class BenchRow:
    shape: str
    dtype: str
    prod_us: float
    prod_spread: float
    cand_us: Optional[float] = None
    cand_spread: Optional[float] = None
    speedup: Optional[float] = None  # prod_us / cand_us
    noise: bool = False  # |difference| < measured spread
    bytes_moved: int = 0
    prod_pct_of_ceiling: Optional[float] = None
    cand_pct_of_ceiling: Optional[float] = None
    calls_per_replay: int = 0
    input_sets: int = 0
    replays: int = 0
    tags: List[str] = field(default_factory=list)
    note: str = ""
    prod_samples_us: List[float] = field(default_factory=list)
    cand_samples_us: List[float] = field(default_factory=list)
    # in context: the op between a producer GEMM (writes its inputs) and a consumer GEMM (reads its
    # outputs) in one graph; marginal µs per call = (neighbours + op) - (neighbours alone)
    chained_speedup: Optional[float] = None  # prod_us / cand_us (back-to-back calls)
    context_base_us: Optional[float] = None  # production's marginal time
    context_cand_us: Optional[float] = None
    context_spread_us: Optional[float] = None  # p90 - p10 of the marginal times (the larger of the two)
    context_speedup: Optional[float] = None  # context_base_us / context_cand_us
    # 95% CI of the median of production's minus the candidate's marginal time, paired by replay round (stats.paired_ci,
    # µs per call; > 0: the candidate is faster); in context it decides `noise` (records before 2026-12-01: absent)
    context_diff_ci_us: Optional[List[float]] = None
    context_neighbours_us: Optional[float] = None  # producer + consumer alone, per op call
    context_gemms: str = ""  # what ran as producer / consumer GEMM: "cuBLAS / cuBLAS", "linear / cuBLAS", ...
    # the touch kernel's marginal time in the same place (timer.py), the lower of a PDL and a plain launch: no kernel
    # there can take less
    context_floor_us: Optional[float] = None
    context_floor_spread_us: Optional[float] = None
    context_floor_launch: str = ""  # which touch gave the floor: "PDL" or "plain" ("" in records before 2026-11-28)
    # the GEMM pairs serving runs the row between (spec.context_sites), each with its own times; the context_* fields
    # above are their mean. [] where the row was timed between one pair (records before 2026-11-28: always)
    context_sites: List[Dict[str, Any]] = field(default_factory=list)
    timing_basis: str = "chained"  # what `speedup` uses: "in-context" (decode shapes) or "chained"
    failed: str = ""  # why this row's implementation was refused ("" = accepted)
    context_failed: str = ""  # the in-context graph's outputs did not match (a failure of its own)
    # --baseline installed: SGLang's installed callable, same harness
    installed_us: Optional[float] = None
    installed_spread: Optional[float] = None
    context_installed_us: Optional[float] = None
    installed_bitwise_equal: Optional[bool] = None  # extracted production == installed, bit for bit
    installed_mismatches: Dict[str, int] = field(default_factory=dict)  # per output: elements that differ
    # production is an installed callable that returns its outputs: the copies into the ABI buffers, or an extracted
    # launcher's work serving does not do at this row (spec.launcher_only), timed alone (µs per call), already taken
    # out of prod_us (chained) and context_base_us (in context)
    prod_binding_us: Optional[float] = None
    # why the patch leaves this shape to SGLang by design (the op's adapter: max_tokens, keeps); "" where the patch
    # takes it; None where the op has no adapter (or the bench predates this field)
    kept: Optional[str] = None

    @property
    def pct_of_ceiling(self) -> Optional[float]:
        return self.cand_pct_of_ceiling if self.cand_us is not None else self.prod_pct_of_ceiling

    @property
    def max_spread(self) -> float:
        return max(self.prod_spread, self.cand_spread or 0.0)

    @property
    def judged_ci_us(self) -> Optional[List[float]]:
        """context_diff_ci_us where it decides `noise` (in-context rows); chained rows keep theirs unused."""
        return self.context_diff_ci_us if self.timing_basis == "in-context" else None

    @classmethod
    def make(cls, shape: str, dtype: str, prod_samples: Sequence[float], cand_samples: Optional[Sequence[float]],
             bytes_moved: int, ceiling_gbps: float, **kw: Any) -> "BenchRow":
        pm, ps = median(prod_samples), spread(prod_samples)
        row = cls(shape, dtype, pm, ps, bytes_moved=bytes_moved,
                  prod_pct_of_ceiling=pct_of_ceiling(bytes_moved, pm, ceiling_gbps),
                  prod_samples_us=[round(x, 5) for x in prod_samples], **kw)
        if cand_samples:
            cm, cs = median(cand_samples), spread(cand_samples)
            row.cand_us, row.cand_spread = cm, cs
            row.speedup = row.chained_speedup = pm / cm if cm > 0 else None
            row.noise = is_noise(pm, ps, cm, cs)
            row.cand_pct_of_ceiling = pct_of_ceiling(bytes_moved, cm, ceiling_gbps)
            row.cand_samples_us = [round(x, 5) for x in cand_samples]
        return row

    def set_context(self, base: Dict[str, Any], cand: Optional[Dict[str, Any]], neighbours_us: float,
                    basis: str) -> None:
        """Record the in-context marginal times (stats.marginal dicts) and pick the basis of `speedup`."""
        self.context_base_us = base["median"]
        self.context_neighbours_us = neighbours_us
        self.context_spread_us = base["spread"]
        if cand is not None:
            self.context_cand_us = cand["median"]
            self.context_spread_us = max(base["spread"], cand["spread"])
            if cand["median"] > 0 and base["median"] > 0:
                self.context_speedup = base["median"] / cand["median"]
        self.timing_basis = basis
        ci = paired_ci(base.get("samples") or [], cand.get("samples") or []) if cand is not None else None
        self.context_diff_ci_us = [round(ci[0], 5), round(ci[1], 5)] if ci else None
        if basis == "in-context" and self.context_speedup is not None:
            self.speedup = self.context_speedup
            if ci:  # the rounds are paired: resolved once the interval excludes 0, which more replays can do
                self.noise = paired_noise(ci, self.context_speedup)
            else:
                self.noise = abs(self.context_cand_us - self.context_base_us) < self.context_spread_us
        elif basis == "in-context" and cand is not None:
            # a marginal time that is not positive (a hiccup far above the op's time) measures nothing: the row
            # keeps its chained speedup and says so, rather than showing it under the in-context basis
            self.timing_basis = "chained"

    def set_context_floor(self, floor: Dict[str, Any], launch: str = "PDL") -> None:
        """Record the touch kernel's in-context marginal time (a stats.marginal dict) and how it was launched."""
        self.context_floor_us = floor["median"]
        self.context_floor_spread_us = floor["spread"]
        self.context_floor_launch = launch

    @property
    def headroom(self) -> Optional[float]:
        """The most any kernel could gain over production in context: production's marginal time over the floor's.
        None where either is missing, or where the floor is within its own spread of zero (no bound then)."""
        base, floor = self.context_base_us, self.context_floor_us
        if base is None or floor is None or floor <= max(self.context_floor_spread_us or 0.0, 1e-3):
            return None
        return base / floor

    @property
    def over_floor(self) -> Optional[float]:
        """Production's in-context time above the floor over the candidate's: the kernels' own share, without the cost
        every kernel in that place pays (1.5-1.9 us on some shapes, H200, kernels/NOTES.md fourteenth session). None
        where a time is missing or either is within 0.05 us of the floor (no ratio then)."""
        base, cand, floor = self.context_base_us, self.context_cand_us, self.context_floor_us
        if base is None or cand is None or floor is None or min(base, cand) - floor < 0.05:
            return None
        return (base - floor) / (cand - floor)

    def set_installed(self, samples: Sequence[float], mismatches: Dict[str, int]) -> None:
        self.installed_us, self.installed_spread = median(samples), spread(samples)
        self.installed_mismatches = dict(mismatches)
        self.installed_bitwise_equal = not any(mismatches.values())

    @property
    def basis_us(self) -> Tuple[float, Optional[float]]:
        """(production, candidate) µs on the row's basis."""
        if self.timing_basis == "in-context" and self.context_base_us is not None:
            return self.context_base_us, self.context_cand_us
        return self.prod_us, self.cand_us


@dataclass
class BenchReport:
    op: str
    variant: str = ""
    candidate: Optional[str] = None
    candidate_sha256: str = ""
    device: str = ""
    date: str = ""
    command: str = ""
    l2: str = "cold"
    replays: int = 0
    ceiling_gbps: float = 0.0
    read_ceiling_gbps: Optional[float] = None  # a pure read stream's (judges read-only kernels: rules.py)
    ceiling_source: str = ""  # "measured" | "cached"
    launch_floor_us: float = 0.0
    l2_bytes: int = 0
    sm_count: int = 0
    installed: str = ""  # --baseline installed: the SGLang callable timed beside the extracted baseline
    production: str = ""  # what production is: the extracted baseline or SGLang's installed callable
    context_consumer_width: int = 0  # output width of the in-context consumer GEMM (0: not timed in context)
    context_producer_k: int = 0  # inner size of the in-context producer GEMM (0: not timed in context, or older)
    context_neighbours: str = ""  # "cublas" or "astra" (bench --neighbours); "" not timed in context, or older
    context_site_rule: str = ""  # "serving" (bench --sites: the op's GEMM pairs where it has them) or "generic"
    rows: List[BenchRow] = field(default_factory=list)
    ok: bool = True  # timing completed and the re-check after timing passed
    reason: str = ""
    recheck: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0
    software: Dict[str, str] = field(default_factory=dict)

    @property
    def geomean(self) -> Optional[float]:
        return geomean(r.speedup for r in self.rows if r.speedup)

    @property
    def max_spread(self) -> float:
        return max((r.max_spread for r in self.rows), default=0.0)

    @property
    def headroom_geomean(self) -> Optional[float]:
        """Geomean of the rows' headroom: the most a kernel in context could reach over the rows that have one."""
        return geomean(r.headroom for r in self.rows if r.headroom)

    def headroom_line(self, goal: float = 1.3) -> str:
        """The in-context floor's verdict: the attainable geomean, and the rows where even a kernel that did nothing
        would fall short of `goal` (then no standalone kernel meets it there: only removing the launch does)."""
        rows = [r for r in self.rows if r.headroom]
        if not rows:
            return ""
        short = [r for r in rows if r.headroom < goal]
        named = ", ".join(f"{r.shape} {r.headroom:.2f}x" for r in sorted(short, key=lambda r: r.headroom)[:4])
        return (f"attainable in context (production over the floor): geomean {self.headroom_geomean:.3f}x over "
                f"{len(rows)} rows; {len(short)} rows below {goal:.2f}x" + (f" ({named}{', ...' * (len(short) > 4)})"
                                                                             if short else ""))

    # --- serialization -------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["geomean"] = self.geomean
        d["max_spread"] = self.max_spread
        d["headroom_geomean"] = self.headroom_geomean
        d["served_geomean"] = self.served_geomean
        for r, rd in zip(self.rows, d["rows"]):
            rd["pct_of_ceiling"] = r.pct_of_ceiling
            rd["headroom"] = r.headroom
            rd["over_floor"] = r.over_floor
        return d

    def to_json(self, path: Union[str, Path]) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BenchReport":
        names = {f.name for f in fields(cls)}
        rnames = {f.name for f in fields(BenchRow)}
        kw = {k: v for k, v in d.items() if k in names and k != "rows"}
        rep = cls(**kw)
        rep.rows = [BenchRow(**{k: v for k, v in r.items() if k in rnames}) for r in d.get("rows", [])]
        return rep

    @classmethod
    def from_json(cls, path: Union[str, Path]) -> "BenchReport":
        return cls.from_dict(json.loads(Path(path).read_text()))

    # --- rendering -----------------------------------------------------------------------
    def verdict_line(self) -> str:
        """How many rows are faster, within noise (chained: |difference| < the replays' spread; in context: the paired
        95% CI of the difference contains 0) or measurably slower, naming the slower ones, and the minimum: "every row
        >= 1.00x" is judged on this, since a row at 0.95x within its noise is no measured loss."""
        sp = [r for r in self.rows if r.speedup]
        slower = [r for r in sp if r.speedup < 1 and not r.noise]
        low = min(sp, key=lambda r: r.speedup)
        named = ", ".join(f"{r.shape} {r.dtype} {r.speedup:.3f}x" for r in slower[:4]) + (", ..." * (len(slower) > 4))
        return (f"rows: {sum(1 for r in sp if not r.noise and r.speedup >= 1)} faster, {sum(1 for r in sp if r.noise)} "
                f"within noise, {len(slower)} slower" + (f" ({named})" if slower else "")
                + f"; min {low.speedup:.3f}x ({low.shape} {low.dtype})")

    @property
    def served_geomean(self) -> Optional[float]:
        """Geomean over the rows the patch takes (the adapter's rule), where the bench marked them."""
        return geomean(r.speedup for r in self.rows if r.speedup and r.kept == "")

    def gemms_said(self) -> str:
        """What the in-context GEMMs were, for the footer."""
        if self.context_neighbours != "astra":
            return "F.linear, cuBLAS via torch, as SGLang's linear layers"
        rows = [r for r in self.rows if r.context_gemms]
        n_p = sum(1 for r in rows if r.context_gemms.startswith("linear"))
        n_c = sum(1 for r in rows if r.context_gemms.endswith("linear"))
        return (f"--neighbours astra: astra's linear where its adapter takes the GEMM, as a patched server runs it, "
                f"else cuBLAS; producer astra's on {n_p} of {len(rows)} rows, consumer on {n_c}")

    def served_line(self) -> str:
        """The rows serving sees: where the adapter leaves some corpus rows to SGLang by design (linear's 8-token and
        wide-output rows), the geomean and minimum over the rows it takes; "" where every row is taken or unmarked."""
        marked = [r for r in self.rows if r.speedup and r.kept is not None]
        if not any(r.kept for r in marked):
            return ""
        taken = [r for r in marked if not r.kept]
        if not taken:
            return f"served: none of the {len(marked)} rows (the adapter leaves every one to SGLang)"
        low = min(taken, key=lambda r: r.speedup)
        return (f"served: geomean {self.served_geomean:.3f}x over the {len(taken)} of {len(marked)} rows the patch "
                f"takes (the adapter leaves the rest to SGLang); min {low.speedup:.3f}x ({low.shape} {low.dtype})")

    def table(self) -> str:
        has_c = any(r.cand_us is not None for r in self.rows)
        has_ctx = any(r.context_base_us is not None for r in self.rows)
        head = ["shape", "dtype", "prod µs", "±%"]
        if has_c:
            head += ["cand µs", "±%", "chained"]
        has_f = any(r.context_floor_us is not None for r in self.rows)
        has_d = any(r.judged_ci_us for r in self.rows)
        if has_ctx:
            head += ["ctx prod µs", "ctx cand µs" if has_c else "", "±µs"] + (["in-context"] if has_c else [])
            if has_d:
                head += ["saved µs, 95% CI"]
            if has_f:
                head += ["floor µs", "attainable"]
        if has_c:
            head += ["speedup", "basis", ""]
        has_i = any(r.installed_us is not None for r in self.rows)
        if has_i:
            head += ["inst µs", "ctx inst µs", "bits"]
        head += ["% ceil" + (" (cand)" if has_c else "")]
        lines: List[List[str]] = [head]
        for r in self.rows:
            row = [r.shape, r.dtype, f"{r.prod_us:.2f}", f"{100 * r.prod_spread:.1f}"]
            if has_c:
                if r.cand_us is None:
                    row += ["—", "", ""]
                else:
                    row += [f"{r.cand_us:.2f}", f"{100 * (r.cand_spread or 0):.1f}",
                            f"{r.chained_speedup:.3f}x" if r.chained_speedup else "—"]
            if has_ctx:
                row += [f"{r.context_base_us:.2f}" if r.context_base_us is not None else "—",
                        f"{r.context_cand_us:.2f}" if r.context_cand_us is not None else ("—" if has_c else ""),
                        f"{r.context_spread_us:.2f}" if r.context_spread_us is not None else "—"]
                if has_c:
                    row += [f"{r.context_speedup:.3f}x" if r.context_speedup else "—"]
                if has_d:
                    ci = r.judged_ci_us
                    row += [f"{ci[0]:+.2f} .. {ci[1]:+.2f}" if ci else "—"]
                if has_f:
                    row += [f"{r.context_floor_us:.2f}" if r.context_floor_us is not None else "—",
                            f"{r.headroom:.2f}x" if r.headroom else "—"]
            if has_c:
                if r.cand_us is None:
                    row += ["", "", r.note[:30]]
                else:
                    row += [f"{r.speedup:.3f}x" if r.speedup else "—", r.timing_basis,
                            "FAILED" if r.failed else ("noise" if r.noise else "")]
            if has_i:
                row += [f"{r.installed_us:.2f}" if r.installed_us is not None else "—",
                        f"{r.context_installed_us:.2f}" if r.context_installed_us is not None else "—",
                        "—" if r.installed_bitwise_equal is None else
                        ("equal" if r.installed_bitwise_equal else f"{sum(r.installed_mismatches.values())} differ")]
            pct = r.pct_of_ceiling
            row += [f"{pct:.1f}" if pct is not None else "—"]
            lines.append(row)
        widths = [max(len(str(l[i])) for l in lines) for i in range(len(head))]
        out = []
        for i, l in enumerate(lines):
            out.append("  ".join(str(c).rjust(w) if j >= 2 else str(c).ljust(w) for j, (c, w) in enumerate(zip(l, widths))).rstrip())
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        foot = [f"{self.op} [{self.variant}] on {self.device}, L2-{self.l2}, {self.replays} replays; "
                f"copy ceiling {self.ceiling_gbps:.0f} GB/s"
                + (f", read ceiling {self.read_ceiling_gbps:.0f} GB/s" if self.read_ceiling_gbps else "")
                + f" ({self.ceiling_source}), graph launch floor "
                f"{self.launch_floor_us:.2f} µs"]
        if has_c:
            g = self.geomean
            bases = sorted({r.timing_basis for r in self.rows if r.speedup})
            foot.append(f"geomean speedup {g:.3f}x over {sum(1 for r in self.rows if r.speedup)} shapes "
                        f"(basis per row: {' / '.join(bases)}; decode shapes <= 256 tokens use in-context)"
                        if g else "geomean speedup: —")
            gc = geomean(r.chained_speedup for r in self.rows if r.chained_speedup)
            gx = geomean(r.context_speedup for r in self.rows if r.context_speedup)
            gh = self.headroom_geomean
            if has_ctx and gc and gx:
                # one line, so gpu_run.sh's summary (the first geomean lines) carries the attainable bound too
                foot.append(f"geomean chained {gc:.3f}x, in-context {gx:.3f}x"
                            + (f", attainable in context {gh:.3f}x" if gh else ""))
            if g:
                foot.append(self.verdict_line())
                sl = self.served_line()
                if sl:
                    foot.append(sl)
        if has_ctx:
            width = f" of output width {self.context_consumer_width}" if self.context_consumer_width else ""
            inner = f" of inner size {self.context_producer_k}" if self.context_producer_k else ""
            foot.append(f"in context: the op between a producer GEMM{inner} writing its inputs and a consumer GEMM"
                        f"{width} reading its outputs ({self.gemms_said()}), one CUDA "
                        "graph; marginal µs = with op - neighbours alone; where the op's inputs or outputs are integers, "
                        "the GEMMs write and read bf16 activations of its rows instead")
            paired = [r for r in self.rows if r.judged_ci_us]
            if paired:
                foot.append(f"noise in context ({len(paired)} rows): the 95% confidence interval of the median of "
                            "production's minus the candidate's marginal time, paired by replay round, contains 0 "
                            f"(distribution-free; {self.replays} replays"
                            + (": more replays narrow it, e.g. --replays 48)" if self.replays < 48 else ")"))
            sited = [r for r in self.rows if r.context_sites]
            if sited:
                foot.append(f"sites: {len(sited)} of {len(self.rows)} rows were timed between each GEMM pair serving "
                            f"runs them between instead (e.g. {', '.join(s['site'] for s in sited[0].context_sites)}: "
                            "producer inner size, consumer width from the model), the mean of the pairs; each pair's "
                            "times are the row's context_sites")
            if has_f:
                plain = sum(r.context_floor_launch == "plain" for r in self.rows)
                floors = sum(r.context_floor_us is not None for r in self.rows)
                foot.append("floor: the touch kernel in the same place (waits for the producer, reads one byte), the "
                            "lower of a PDL and a plain launch: no kernel there takes less; attainable = ctx prod / "
                            "floor, the most any kernel could gain"
                            + (f"; the plain launch was lower on {plain} of {floors} rows" if plain else ""))
                hl = self.headroom_line()
                if hl:
                    foot.append(hl)
                of = [r.over_floor for r in self.rows if r.over_floor]
                if of and has_c:
                    high = [r for r in self.rows if r.context_speedup and r.context_floor_us is not None
                            and r.context_floor_us >= 1.0]
                    foot.append(f"over the floor ((ctx prod - floor) / (ctx cand - floor), the kernels' own share): "
                                f"geomean {geomean(of):.3f}x over {len(of)} rows"
                                + (f"; {len(high)} rows have a floor >= 1 us, in context there "
                                   f"{geomean(r.context_speedup for r in high):.3f}x" if high else ""))
        b = [r.prod_binding_us for r in self.rows if r.prod_binding_us is not None]
        if self.production.startswith("installed"):
            foot.append(f"production: {self.production}"
                        + (f"; its returned outputs are copied into the ABI buffers: those copies, timed alone "
                           f"({min(b):.2f}-{max(b):.2f} µs), are taken out of the prod columns" if b else ""))
        elif b:
            foot.append(f"production's launcher does work serving does not at {len(b)} of {len(self.rows)} rows "
                        f"(the op's spec.launcher_only): timed alone ({min(b):.2f}-{max(b):.2f} µs), it is taken out "
                        f"of the prod columns there")
        if has_i:
            foot.append(f"installed baseline: {self.installed} (SGLang's callable through torch, same graphs); "
                        f"bits: extracted production vs installed on the same inputs")
            foot += self.installed_summary()
        if self.installed:  # said in the footer: a row without the installed columns is not a row where it won
            untimed = [n for n in self.notes if ": installed could not be captured/run" in n]
            if untimed:
                foot.append(f"INSTALLED NOT TIMED on {len(untimed)} of {len(self.rows)} rows, first: {untimed[0]}")
        foot.append(f"max spread {100 * self.max_spread:.1f}%")
        foot += [n for n in self.notes if n.startswith("NOT SERVING'S DTYPE")]
        # said in the footer, not only in -v notes: moe_align's whole first corpus fell back to chained this way
        unmeasured = [n for n in self.notes if "in-context timing not measured" in n]
        if unmeasured:
            foot.append(f"IN CONTEXT NOT MEASURED on {len(unmeasured)} of {len(self.rows)} rows (their speedup is the "
                        f"chained one), first: {unmeasured[0]}")
        for r in self.rows:
            if r.failed:
                foot.append(f"REFUSED {r.shape} {r.dtype}: {r.failed}")
        if self.recheck:
            foot.append("re-check after timing: " + ("passed" if self.recheck.get("ok") else
                                                      f"FAILED: {self.recheck.get('reason', '')}"))
        if not self.ok and self.reason and self.reason != self.recheck.get("reason"):
            foot.append(f"FAILED: {self.reason}")
        return "\n".join(out + [""] + foot)

    def installed_summary(self) -> List[str]:
        """The candidate over the installed callable (what SGLang runs, e.g. a torch.compile'd route the extracted
        baseline stands in for), on the rows where both were timed: chained, and in context where measured."""
        out = []
        for label, pairs in (("chained", [(r.installed_us, r.cand_us) for r in self.rows]),
                             ("in context", [(r.context_installed_us, r.context_cand_us) for r in self.rows])):
            ratios = [i / c for i, c in pairs if i is not None and c]
            if ratios:
                out.append(f"over the installed baseline, {label}: geomean {geomean(ratios):.3f}x over "
                           f"{len(ratios)} rows, min {min(ratios):.3f}x")
        return out

    def plot(self, path: Union[str, Path]) -> Optional[Path]:
        """Per-shape speedup and % of the copy ceiling, beside the JSON. None without matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        rows = self.rows
        labels = [f"{r.shape}\n{r.dtype}" + ("\nctx" if r.timing_basis == "in-context" else "") for r in rows]
        has_c = any(r.cand_us is not None for r in rows)
        nplots = 2 if has_c else 1
        fig, axes = plt.subplots(nplots, 1, figsize=(max(6.0, 0.6 * len(rows) + 2), 3.2 * nplots), squeeze=False)
        x = list(range(len(rows)))
        ax = axes[0][0]
        if has_c:
            sp = [r.speedup or 0 for r in rows]
            colors = ["#999999" if r.noise else ("#2a9d8f" if (r.speedup or 0) >= 1 else "#e76f51") for r in rows]
            err = [(r.speedup or 0) * r.max_spread / 2 for r in rows]
            ax.bar(x, sp, color=colors, yerr=err, capsize=2)
            hx = [(i, r.headroom) for i, r in zip(x, rows) if r.headroom]
            # marks far above the bars (a 30 µs GEMV over a 1 µs floor: 20-80x) would flatten them: those go on the
            # top edge as arrows with their value
            top = max(sp + [1.0]) * 1.6
            inside, above = [(i, h) for i, h in hx if h <= top], [(i, h) for i, h in hx if h > top]
            if inside:  # the in-context floor: no kernel in that place can reach above its mark
                ax.scatter([i for i, _ in inside], [h for _, h in inside], marker="_", s=160, color="black",
                           label="attainable (ctx prod / floor)")
            if above:
                ax.set_ylim(0, top)
                ax.scatter([i for i, _ in above], [top * 0.97] * len(above), marker="^", s=30, color="black",
                           label="attainable, above the axis")
                for i, h in above:
                    ax.annotate(f"{h:.0f}x", (i, top * 0.97), textcoords="offset points", xytext=(0, -10),
                                ha="center", fontsize=5)
            ax.axhline(1.0, color="black", lw=0.8)
            g = self.geomean
            if g:
                ax.axhline(g, color="#264653", lw=1, ls="--", label=f"geomean {g:.3f}x")
                ax.legend(loc="best", fontsize=8)
            ax.set_ylabel("speedup vs production\n(in-context for decode rows)")
            ax.set_title(f"{self.op} speedup vs production, {self.device}, L2-{self.l2} (grey: within noise)",
                         fontsize=8)
            ax.set_xticks(x)
            ax.set_xticklabels(labels, fontsize=7, rotation=0)
            ax = axes[1][0]
        w = 0.4 if has_c else 0.7
        ax.bar([i - (w / 2 if has_c else 0) for i in x], [r.prod_pct_of_ceiling or 0 for r in rows], width=w,
               label="production", color="#8d99ae")
        if has_c:
            ax.bar([i + w / 2 for i in x], [r.cand_pct_of_ceiling or 0 for r in rows], width=w, label="candidate",
                   color="#2a9d8f")
        ax.axhline(100, color="black", lw=0.8)
        ax.set_ylabel(f"% of copy ceiling ({self.ceiling_gbps:.0f} GB/s)")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend(loc="best", fontsize=8)
        if not has_c:
            ax.set_title(f"{self.op} production ({self.device}, L2-{self.l2})", fontsize=9)
        fig.tight_layout()
        save_figure(fig, p)
        plt.close(fig)
        return p


def format_check(result: Any, verbose: bool = False) -> str:
    """Human-readable lines for a CheckResult."""
    lines = [result.summary()]
    if getattr(result, "production", ""):
        lines.append(f"  production: {result.production}")
    if not result.ok and len(result.failures) > 1:
        for f in result.failures[1:6]:
            lines.append(f"  also: {f}")
    for f in result.static:
        if f.get("severity") == "warning":
            lines.append(f"  warning: {Path(f['file']).name}:{f['line']}: {f['rule']}: {f['reason']}")
    same = [d for d in result.details if d.get("identical") is not None]
    if same:
        least = min(same, key=lambda d: d["identical"])
        whole = sum(d["identical"] == 1.0 for d in same)
        lines.append(f"  bit-identical to production: {whole} of {len(same)} output comparisons"
                     + ("" if whole == len(same) else
                        f"; the least {least['tensor']} {least['dtype']} {least['shape']}: "
                        f"{100 * least['identical']:.2f}% of its elements"))
    worst = result.worst()
    if worst:
        normwise = any(d.get("metric") == "norm" for d in worst)
        lines.append("  worst error / tolerance per output and dtype" + (" (normwise errors)" if normwise else "") + ":")
        for d in sorted(worst, key=lambda d: (d["tensor"], d["dtype"])):
            ce = d.get("cand_err")
            lines.append(
                f"    {d['tensor']:12s} {d['dtype']:5s} {d['shape']:>14s} {d['dist']:8s} "
                + (f"cand {ce:.3g}  " if ce is not None else "")
                + f"prod {d['prod_err']:.3g}  tol {d['tol']:.3g}")
    if verbose:
        for n in result.notes:
            lines.append(f"  note: {n}")
    return "\n".join(lines)
