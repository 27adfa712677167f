"""The deterministic orchestrator: the Astra paper's Algorithm 1 with a few changes.

    round 0   the production kernel: compile, testing agent proposes extra tests, check, time,
              profiling agent explains it
    round r   start from the BEST correct kernel so far (not blindly the last one);
              planning agent picks one change; coding agent writes the candidate (compile errors go
              back to it, at most --max-fixes times); testing agent may add tests aimed at the change;
              check (mandatory suite + added tests, fresh inputs) -> time (interleaved with
              production) -> re-check on fresh inputs; the profiling agent explains a kernel when it
              first becomes the starting point of a round
    end       the best candidate is re-verified on fresh inputs over the full corpus, then timed again
              for the report (table, plot, best kernel file)

Budgets (rounds, wall time, tokens, cost) are checked before every model request and between
steps; when one runs out the log and the best kernel so far are kept and reported. Everything is
in log.jsonl (round, code hash and file, correctness with its reason, per-shape times, model
usage); `resume=True` rebuilds the state from it and continues with the first unfinished round.
"""
from __future__ import annotations

import hashlib
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..errors import AstraError
from .budget import Budget, BudgetExhausted, Meter, Usage, price_for
from .executor import Dims, Executor, ExtraTests, numel, parse_shape, shape_key
from .providers import Provider, ProviderSpec, map_error
from .report import outcome_text, roofline_table, rounds_table, timing_table, write_report
from .roles import build_agent, parse_plan, plan_model
from .runlog import Redactor, RunLog, iter_rounds
from .tools import ToolBox

LOG_VERSION = 1


class Interrupted(AstraError):
    exit_code = 130


@dataclass
class OptimizeConfig:
    rounds: int
    mode: str = "multi"  # "multi" | "single"
    bench_shapes: List[Dims] = field(default_factory=list)
    bench_dtypes: List[str] = field(default_factory=list)
    max_fix_attempts: int = 2
    max_tests_per_round: int = 8
    max_turns: int = 12
    trace: bool = False
    price: Optional[tuple] = None


@dataclass
class Outcome:
    run_dir: Path
    stop: str
    best_round: Optional[int]
    best_file: Optional[Path]
    report: Dict[str, str]
    records: List[Dict[str, Any]]
    final: Dict[str, Any]
    error: Optional[AstraError] = None


def _status(rec: Dict[str, Any]) -> str:
    if rec["round"] == 0:
        return "production"
    comp = rec.get("compile") or {}
    if not comp.get("attempts"):
        return "no-candidate"
    if not comp.get("ok"):
        return "compile-error"
    return "correct" if rec.get("correct") else "wrong"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fence(text: str, limit: int = 60000) -> str:
    if len(text) > limit:
        text = text[:limit] + "\n/* ... cut ... */"
    return "```\n" + text.rstrip("\n") + "\n```"


class Optimizer:
    def __init__(self, spec, executor: Executor, provider_spec: ProviderSpec, budget: Budget, run_dir: Path,
                 cfg: OptimizeConfig, redactor: Redactor, resume: bool = False,
                 progress: Callable[[str], None] = print, command: Optional[str] = None) -> None:
        self.spec = spec
        self.executor = executor
        self.provider_spec = provider_spec
        self.budget = budget
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.redactor = redactor
        self.resume = resume
        self._progress = progress
        self.command = command
        self.cand_dir = self.run_dir / "candidates"
        self.records: Dict[int, Dict[str, Any]] = {}
        self.extra = ExtraTests()
        self.profiles: Dict[int, str] = {}
        self.run_id = ""
        self.box = ToolBox(self)
        self.round_usage = Usage()
        self.current_round = 0
        self._agents: Dict[str, Any] = {}
        self._open()

    # -- setup / resume ------------------------------------------------------------------------------
    def _open(self) -> None:
        from .runlog import LOG_NAME, read_log

        existing = read_log(self.run_dir / LOG_NAME)
        if existing and not self.resume:
            done = len(iter_rounds(existing))
            raise AstraError(f"a run already exists in {self.run_dir} ({done} round(s) logged): pass --resume to "
                             "continue it, or --run-dir for a new one")
        if self.resume and not existing:
            raise AstraError(f"nothing to resume: no {LOG_NAME} in {self.run_dir}")
        self.log = RunLog(self.run_dir, self.redactor)
        self.meter = Meter(self.budget, price_for(self.provider_spec.model, self.cfg.price), lambda: self.log.elapsed_s)
        if self.budget.max_cost_usd is not None and self.meter.price is None:
            raise AstraError(f"--max-cost needs a price for model {self.provider_spec.model!r}: pass --price IN,OUT "
                             "(USD per 1M input and output tokens)")
        if existing:
            self._restore(existing)

    def _restore(self, events: List[Dict[str, Any]]) -> None:
        start = next((e for e in events if e.get("event") == "start"), None)
        if start is None:
            raise AstraError(f"{self.log.path} has no start event: not a run log")
        if start["op"] != self.spec.name:
            raise AstraError(f"the run in {self.run_dir} optimizes {start['op']}, not {self.spec.name}")
        if start["mode"] != self.cfg.mode:
            flag = "with" if start["mode"] == "single" else "without"
            raise AstraError(f"the run in {self.run_dir} was started in {start['mode']}-agent mode: resume it {flag} "
                             "--single-agent")
        self.run_id = start["run_id"]
        # The objective must stay comparable across sessions: the timing suite comes from the log.
        self.cfg.bench_shapes = [parse_shape(s) for s in start["bench_shapes"]]
        self.cfg.bench_dtypes = list(start["bench_dtypes"])
        for e in events:
            kind = e.get("event")
            if kind == "tests_added":
                self.extra = self.extra.merged([parse_shape(s) for s in e.get("shapes", [])])
            elif kind == "profile":
                self.profiles[int(e["subject_round"])] = e.get("text", "")
            elif kind == "agent":
                self.meter.total.add(Usage.from_json(e.get("usage")))
        for rec in iter_rounds(events):
            self.records[int(rec["round"])] = rec

    def say(self, msg: str) -> None:
        self._progress(self.redactor.text(msg))

    # -- state queries --------------------------------------------------------------------------------
    def cand_path(self, r: int, suffix: str = "") -> Path:
        return self.cand_dir / f"r{r:02d}{suffix}{self.executor.source_suffix}"

    def record_of(self, r: Optional[int]) -> Optional[Dict[str, Any]]:
        return None if r is None else self.records.get(int(r))

    def best(self) -> Dict[str, Any]:
        """The best correct kernel so far: highest geomean speedup; round 0 (production) is 1.0;
        ties go to the earlier round."""
        ok = [r for r in self.records.values() if r.get("correct") and r.get("geomean") is not None]
        return max(ok, key=lambda r: (r["geomean"], -r["round"]))

    def log_table(self) -> str:
        recs = [self.records[k] for k in sorted(self.records)]
        best = self.best()["round"] if 0 in self.records else None
        return rounds_table(recs, best) if recs else "no rounds yet"

    def read_source(self, which: str, box: ToolBox) -> str:
        w = (which or "current").strip()
        path: Optional[Path] = None
        if w == "current":
            path = box.subject or (self.run_dir / self.records[self._parent]["file"] if self._parent is not None else None)
        elif w == "candidate":
            path = box.target if box.target and box.target.exists() else None
            if path is None:
                return "no candidate has been written in this round yet"
        elif w == "baseline":
            path = self.run_dir / self.records[0]["file"] if 0 in self.records else self.cand_path(0)
        elif w == "best":
            path = self.run_dir / self.best()["file"]
        elif w.startswith("round:"):
            rec = self.record_of(int(w.split(":", 1)[1]))
            if rec is None:
                return f"no round {w.split(':', 1)[1]} in the log"
            path = self.run_dir / rec["file"]
        else:
            return self.executor.read_include(w)
        if path is None or not path.exists():
            return f"no source for {w!r}"
        return path.read_text()

    def add_tests(self, shapes: List[str], distributions: List[str], reason: str, box: ToolBox) -> str:
        spec, ex = self.spec, self.executor
        notes: List[str] = []
        room = self.cfg.max_tests_per_round - box.added_this_round
        mandatory = set(ex.mandatory_shapes(False)) | set(self._suite().shapes)
        new_shapes: List[Dims] = []
        for s in shapes:
            try:
                dims = parse_shape(s)
            except ValueError:
                notes.append(f"rejected {s!r}: not a shape like {shape_key(self.cfg.bench_shapes[0])}")
                continue
            if len(dims) != len(spec.dim_names) or min(dims) <= 0:
                notes.append(f"rejected {s!r}: a shape is {' x '.join(spec.dim_names)}, all positive")
            elif dims in mandatory or dims in new_shapes:
                notes.append(f"skipped {shape_key(dims)}: already in the suite")
            elif numel(dims) > ex.max_test_elems():
                notes.append(f"rejected {shape_key(dims)}: larger than the largest shape the oracle checks")
            elif len(new_shapes) >= room:
                notes.append(f"rejected {shape_key(dims)}: at most {self.cfg.max_tests_per_round} shapes per round")
            else:
                new_shapes.append(dims)
        for d in distributions:  # the oracle runs every distribution the spec knows on every shape
            notes.append(f"distribution {d!r}: " + ("already run on every shape" if d in spec.distributions else
                                                     f"unknown (every shape runs {', '.join(spec.distributions)})"))
        if not new_shapes:
            return "nothing added. " + "; ".join(notes)
        # A test the production kernel fails is not a valid test.
        seed = self._seed(self.current_round, 100 + box.added_this_round)
        if not ex.check_tests_on_baseline(ExtraTests(new_shapes), seed).ok:
            keep: List[Dims] = []
            for dims in new_shapes:
                one = ex.check_tests_on_baseline(ExtraTests([dims]), seed)
                if one.ok:
                    keep.append(dims)
                else:
                    notes.append(f"rejected {shape_key(dims)}: the production kernel fails it ({one.reason})")
            new_shapes = keep
        if new_shapes:
            self.extra = self.extra.merged(new_shapes)
            box.added_this_round += len(new_shapes)
            self.log.append({"event": "tests_added", "round": self.current_round, "role": box.role,
                             "shapes": [shape_key(s) for s in new_shapes], "reason": reason})
            self.say(f"    tests + {', '.join(shape_key(s) for s in new_shapes)}")
        added = ", ".join(shape_key(s) for s in new_shapes) or "nothing"
        return f"added: {added}." + (" " + "; ".join(notes) if notes else "")

    def _suite(self) -> ExtraTests:
        """What a check adds to the executor's mandatory suite: the timed shapes and the agents' tests."""
        return ExtraTests(list(self.cfg.bench_shapes)).merged(self.extra.shapes)

    def _seed(self, r: int, k: int) -> int:
        return int(hashlib.sha256(f"{self.run_id}:{r}:{k}".encode()).hexdigest()[:8], 16)

    # -- agents ---------------------------------------------------------------------------------------
    def _ctx(self) -> Dict[str, Any]:
        ex, spec = self.executor, self.spec
        desc = ex.describe()
        return {
            "op": spec.name, "summary": spec.summary,
            "signature": ex.signature(),
            "language": ex.language_notes(),
            "bench_shapes": ", ".join(shape_key(s) for s in self.cfg.bench_shapes),
            "bench_dtypes": ", ".join(self.cfg.bench_dtypes),
            "timer": desc.get("timer", "production and candidate timed interleaved"),
            "check_suite": ex.check_suite(False),
            "dims": " x ".join(spec.dim_names),
            "example_shape": shape_key(self.cfg.bench_shapes[0]),
            "max_tests": self.cfg.max_tests_per_round,
        }

    def _agent(self, role: str):
        if role not in self._agents:
            self._agents[role] = build_agent(role, self._ctx(), self.provider, self.box,
                                             self.provider_spec.strict_schema)
        return self._agents[role]

    def _run_agent(self, role: str, purpose: str, text: str):
        """Run one agent to its final answer. Returns (final_output, error or None)."""
        from agents import RunConfig, Runner
        from agents.exceptions import AgentsException

        self.box.role = role
        self.meter.current = Usage()
        self.say(f"  · {role}: {purpose}")
        final, error, calls = None, None, []
        try:
            result = self.provider.loop.run_until_complete(Runner.run(
                self._agent(role), text, max_turns=self.cfg.max_turns,
                run_config=RunConfig(tracing_disabled=not self.cfg.trace)))
            final = result.final_output
            calls = [getattr(getattr(it, "raw_item", None), "name", "?") for it in result.new_items
                     if getattr(it, "type", "") == "tool_call_item"]
        except (BudgetExhausted, KeyboardInterrupt):
            self._log_agent(role, purpose, None, [], "stopped")
            raise
        except AstraError as e:
            self._log_agent(role, purpose, None, [], str(e))
            raise
        except AgentsException as e:  # max turns, a malformed tool call: this step failed, the run goes on
            error = f"{type(e).__name__}: {e}"
        except Exception as e:
            mapped = map_error(e, self.provider_spec)
            self._log_agent(role, purpose, None, [], str(mapped or e))
            if mapped:
                raise mapped from None
            raise AstraError(f"the {role} agent failed: {type(e).__name__}: {e}") from e
        self._log_agent(role, purpose, final, calls, error)
        if error:
            self.say(f"    {role} agent: {error}")
        return final, error

    def _log_agent(self, role: str, purpose: str, final: Any, calls: List[str], error: Optional[str]) -> None:
        usage = self.meter.take_current()
        self.round_usage.add(usage)
        out = final if isinstance(final, str) or final is None else (
            final.model_dump() if hasattr(final, "model_dump") else str(final))
        if isinstance(out, str) and len(out) > 4000:
            out = out[:4000] + " ..."
        ev = {"event": "agent", "round": self.current_round, "role": role, "purpose": purpose,
              "tool_calls": calls, "usage": usage.to_json(), "output": out}
        if error:
            ev["error"] = error
        self.log.append(ev)

    # -- steps ---------------------------------------------------------------------------------------
    def _testing(self, r: int, path: Path, parent: Optional[Dict[str, Any]] = None,
                 plan: Optional[Dict[str, str]] = None) -> None:
        self.box.subject, self.box.subject_round, self.box.target = path, r, None  # read_source("current")
        src = _fence(path.read_text())
        if r == 0:
            text = (f"Propose the initial extra tests for {self.spec.name}. The production kernel:\n{src}")
        else:
            text = (f"Round {r} candidate, changed from round {parent['round']} by: "
                    f"{(plan or {}).get('change', '(see source)')}\nIts source:\n{src}\n"
                    "Add tests aimed at the code paths this change touches if the suite does not cover them yet; "
                    "otherwise add nothing.")
        self._run_agent("testing", "proposes tests" if r == 0 else "tests aimed at the change", text)

    def _ensure_profile(self, rec: Dict[str, Any]) -> None:
        k = rec["round"]
        if k in self.profiles:
            return
        self.box.subject, self.box.subject_round, self.box.target = self.run_dir / rec["file"], k, None
        text = (f"Kernel under study: round {k} ({'the production kernel' if k == 0 else 'a candidate'}; geomean "
                f"speedup over production {rec['geomean']:.3f}x).\nIts timing (interleaved with production):\n"
                f"{timing_table(rec['timings'])}\nRoofline:\n{roofline_table(self.spec, rec['timings'])}\n"
                f"Its source:\n{_fence((self.run_dir / rec['file']).read_text())}")
        final, _ = self._run_agent("profiling", f"explains round {k}", text)
        self.profiles[k] = str(final or "")
        self.log.append({"event": "profile", "round": self.current_round, "subject_round": k,
                         "text": self.profiles[k]})

    def _state_text(self, r: int, parent: Dict[str, Any]) -> str:
        k = parent["round"]
        return (f"Round {r} of {self.cfg.rounds}. The current best kernel is round {k} "
                f"(geomean speedup over production {parent['geomean']:.3f}x).\n\nLog so far:\n{self.log_table()}\n\n"
                f"Timing of the current best (interleaved with production):\n{timing_table(parent['timings'])}\n\n"
                f"Roofline of the current best:\n{roofline_table(self.spec, parent['timings'])}\n\n"
                f"Profiler's facts about the current best:\n{self.profiles.get(k) or '(none yet)'}\n\n"
                f"Source of the current best (round {k}):\n{_fence((self.run_dir / parent['file']).read_text())}")

    def _plan(self, r: int, parent: Dict[str, Any]) -> Dict[str, Any]:
        self.box.subject, self.box.subject_round, self.box.target = self.run_dir / parent["file"], parent["round"], None
        text = self._state_text(r, parent) + "\n\nChoose the one change for this round."
        final, error = self._run_agent("planning", "chooses the change", text)
        if final is not None and isinstance(final, plan_model()):
            return {**final.model_dump(), "valid": True}
        plan, why = parse_plan(str(final or ""))
        if plan is None and not error:
            retry = (f"Your answer was not a valid plan ({why}). Answer again with ONLY the JSON object "
                     f"(keys: change, rationale, expected_effect), nothing else.\n\nYour answer was:\n{final}")
            final2, _ = self._run_agent("planning", "re-asked for a valid plan", text + "\n\n" + retry)
            plan, why = parse_plan(str(final2 or ""))
            final = final2 if plan is None else final
        if plan is None:
            self.say(f"    planning: no valid plan ({why or error}); the raw answer is the plan")
            return {"change": str(final or "")[:2000], "rationale": "", "expected_effect": "", "valid": False,
                    "invalid_reason": why or error}
        return {**plan, "valid": True}

    def _code(self, r: int, parent: Dict[str, Any], plan: Dict[str, Any], path: Path) -> None:
        self.box.subject, self.box.subject_round, self.box.target, self.box.written = None, None, path, False
        text = (f"Plan for round {r}:\nchange: {plan['change']}\nrationale: {plan.get('rationale', '')}\n"
                f"expected effect: {plan.get('expected_effect', '')}\n\nStart from this kernel (round "
                f"{parent['round']}, the current best):\n{_fence((self.run_dir / parent['file']).read_text())}\n\n"
                "Write the complete new file with write_candidate.")
        self._run_agent("coding", "writes the candidate", text)

    def _single(self, r: int, parent: Dict[str, Any], path: Path) -> None:
        self.box.subject, self.box.subject_round, self.box.target, self.box.written = (
            self.run_dir / parent["file"], parent["round"], path, False)
        text = self._state_text(r, parent) + (f"\n\nTests added so far: {', '.join(shape_key(s) for s in self.extra.shapes) or 'none'}."
                                              f"\nDo round {r}: end by writing the complete candidate with write_candidate.")
        self._run_agent("single", "does the round", text)

    def _fix(self, r: int, path: Path, comp, attempt: int) -> None:
        role = "single" if self.cfg.mode == "single" else "coding"
        self.box.target, self.box.written = path, False
        text = (f"Your candidate for round {r} does not compile (fix {attempt} of {self.cfg.max_fix_attempts}). "
                f"Compiler output:\n{_fence(comp.log[-5000:] or comp.error)}\n\nThe candidate:\n{_fence(path.read_text())}\n\n"
                "Fix the errors and write the complete file again with write_candidate.")
        self._run_agent(role, f"fixes compile errors ({attempt}/{self.cfg.max_fix_attempts})", text)

    # -- rounds ----------------------------------------------------------------------------------------
    def _record(self, rec: Dict[str, Any], t0: float) -> Dict[str, Any]:
        path = self.run_dir / rec["file"] if rec.get("file") else None
        if path is not None and path.exists():
            rec.setdefault("code_sha256", _sha(path))
            rec.setdefault("lines", path.read_text().count("\n"))
        rec["status"] = _status(rec)
        rec["usage"] = self.round_usage.to_json()
        rec["wall_s"] = round(self.log.elapsed_s - t0, 3)
        rec["extra_tests"] = [shape_key(s) for s in self.extra.shapes]
        ev = self.log.append({"event": "round", **rec})
        self.records[rec["round"]] = ev
        best = self.best()
        self.say(f"  = round {ev['round']}: {outcome_text(ev)}   (best so far: round {best['round']}, "
                 f"{best['geomean']:.3f}x; tokens {self.meter.total.total_tokens})")
        return ev

    def _begin(self, r: int) -> float:
        self.current_round = r
        self.provider.set_round(r)
        self.round_usage = Usage()
        self.box.added_this_round = 0
        self.box.subject = self.box.target = None
        return self.log.elapsed_s

    def _round0(self) -> None:
        t0 = self._begin(0)
        self.say("round 0: the production kernel")
        path = self.cand_path(0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.executor.baseline_source())
        comp = self.executor.compile(path)
        if not comp.ok:
            raise AstraError(f"the production kernel does not compile: {comp.error}")
        if self.cfg.mode == "multi":
            self._testing(0, path)
        chk = self.executor.check(path, self._suite(), self._seed(0, 1))
        if not chk.ok:
            raise AstraError(f"the production kernel fails its own check ({chk.reason}): the oracle or the workspace "
                             "is broken")
        self.say(f"  · check: {chk.reason}")
        res = self.executor.bench(path, self.cfg.bench_shapes, self.cfg.bench_dtypes)
        if not res.ok:
            raise AstraError(f"timing the production kernel failed: {res.reason}")
        rec = self._record({"round": 0, "parent": None, "plan": None, "file": str(path.relative_to(self.run_dir)),
                            "compile": {"ok": True, "attempts": 1}, "correct": True, "reason": chk.reason,
                            "check_cases": chk.cases, "timings": [t.to_json() for t in res.timings],
                            "geomean": 1.0, "self_geomean": round(res.geomean, 4),
                            "median_spread": round(res.median_spread, 4), "bench_info": res.info}, t0)
        if self.cfg.mode == "multi":
            self._ensure_profile(rec)

    def _round(self, r: int) -> None:
        t0 = self._begin(r)
        parent = self.best()
        self._parent = parent["round"]
        self.say(f"round {r}/{self.cfg.rounds}: starting from round {parent['round']} ({parent['geomean']:.3f}x)")
        path = self.cand_path(r)
        for stale in self.cand_dir.glob(f"r{r:02d}.*"):  # an interrupted earlier try of this round
            stale.unlink()
        base = {"round": r, "parent": parent["round"], "file": str(path.relative_to(self.run_dir))}
        plan = None
        if self.cfg.mode == "multi":
            self._ensure_profile(parent)
            plan = self._plan(r, parent)
            self.say(f"    plan: {plan['change'][:160]}")
            self._code(r, parent, plan, path)
        else:
            self._single(r, parent, path)
        base["plan"] = plan
        if not self.box.written or not path.exists():
            self._record({**base, "file": None, "compile": {"ok": False, "attempts": 0, "error": "no candidate written"},
                          "correct": None, "reason": "the agent wrote no candidate"}, t0)
            return
        comp = self.executor.compile(path)
        attempts = 1
        while not comp.ok and attempts <= self.cfg.max_fix_attempts:
            self.say(f"    compile error: {comp.error}")
            shutil.copy(path, self.cand_path(r, f".fail{attempts}"))
            self._fix(r, path, comp, attempts)
            attempts += 1
            if not self.box.written:
                break
            comp = self.executor.compile(path)
        compile_info = {"ok": comp.ok, "attempts": attempts, "seconds": round(comp.seconds, 2)}
        if not comp.ok:
            compile_info["error"] = comp.error
            self._record({**base, "compile": compile_info, "correct": None, "reason": f"compile error: {comp.error}"}, t0)
            return
        if self.cfg.mode == "multi":
            self._testing(r, path, parent, plan)
        chk = self.executor.check(path, self._suite(), self._seed(r, 1))
        if not chk.ok:
            self._record({**base, "compile": compile_info, "correct": False, "reason": chk.reason,
                          "check_cases": chk.cases}, t0)
            return
        self.say(f"  · check: {chk.reason}")
        res = self.executor.bench(path, self.cfg.bench_shapes, self.cfg.bench_dtypes)
        if not res.ok:
            self._record({**base, "compile": compile_info, "correct": False, "reason": f"failed in timing or its re-check: {res.reason}",
                          "check_cases": chk.cases}, t0)
            return
        timings = [t.to_json() for t in res.timings]
        cases = chk.cases
        if not self.executor.bench_rechecks:  # the executor's bench did not re-check: do it here
            re = self.executor.check(path, self._suite(), self._seed(r, 2))
            if not re.ok:
                self._record({**base, "compile": compile_info, "correct": False, "timings": timings,
                              "reason": f"failed the re-check on fresh inputs after timing: {re.reason}"}, t0)
                return
            cases += re.cases
        self._record({**base, "compile": compile_info, "correct": True, "reason": chk.reason,
                      "check_cases": cases, "timings": timings, "geomean": round(res.geomean, 4),
                      "median_spread": round(res.median_spread, 4), "bench_info": res.info}, t0)

    # -- the run -------------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self._parent: Optional[int] = None
        self.provider = Provider(self.provider_spec, self.meter, self.redactor)
        try:
            self.provider.preflight()
            if not self.log.events:
                self.run_id = secrets.token_hex(8)
                self.log.append({
                    "event": "start", "version": LOG_VERSION, "run_id": self.run_id, "op": self.spec.name,
                    "mode": self.cfg.mode, "provider": self.provider_spec.public(self.redactor),
                    "budget": self.budget.to_json(), "executor": self.executor.describe(),
                    "bench_shapes": [shape_key(s) for s in self.cfg.bench_shapes],
                    "bench_dtypes": list(self.cfg.bench_dtypes), "max_fix_attempts": self.cfg.max_fix_attempts,
                    "command": self.command})
            else:
                self.log.append({"event": "resume", "rounds_logged": sorted(self.records),
                                 "provider": self.provider_spec.public(self.redactor), "budget": self.budget.to_json(),
                                 "command": self.command})
                self.say(f"resuming {self.run_dir}: rounds {sorted(self.records)} are done")
            stop, error = self._loop()
            self.log.append({"event": "stop", "reason": stop})
            final = self._finalize()
        finally:
            self.provider.close()
            close = getattr(self.executor, "close", None)
            if close:
                close()
        best = final.get("best_round")
        best_file = Path(final["best_file"]) if final.get("best_file") else None
        return Outcome(self.run_dir, stop, best, best_file, final.get("report", {}),
                       [self.records[k] for k in sorted(self.records)], final, error)

    def _loop(self):
        try:
            if 0 not in self.records:
                self.meter.check()
                self._round0()
            while True:
                r = max(self.records) + 1
                if r > self.cfg.rounds:
                    return f"all {self.cfg.rounds} rounds done", None
                self.meter.check()
                self._round(r)
        except BudgetExhausted as e:
            self.say(f"stop: {e}")
            return str(e), e
        except KeyboardInterrupt:
            self.log.append({"event": "stop", "reason": f"interrupted in round {self.current_round}"})
            raise Interrupted(f"interrupted in round {self.current_round}: the log is kept in {self.run_dir}; "
                              "continue with --resume") from None
        except AstraError as e:
            self.say(f"stop: {e}")
            return f"error: {e}", e

    def _finalize(self) -> Dict[str, Any]:
        """Re-verify the best candidate on fresh inputs over the full corpus, time it for the report,
        write the report and the best kernel file."""
        recs = [self.records[k] for k in sorted(self.records)]
        final: Dict[str, Any] = {"rejected": []}
        if 0 not in self.records:
            final["verdict"] = "No round finished: nothing was measured."
        else:
            ranked = sorted((r for r in recs if r["round"] > 0 and r.get("correct") and (r.get("geomean") or 0) > 1.0),
                            key=lambda r: (-r["geomean"], r["round"]))
            chosen = None
            for rec in ranked:
                path = self.run_dir / rec["file"]
                self.say(f"final: re-verifying round {rec['round']} on fresh inputs over the full corpus")
                chk = self.executor.check(path, self._suite(), secrets.randbits(31), full=True)
                if not chk.ok:
                    final["rejected"].append({"round": rec["round"], "reason": chk.reason})
                    self.log.append({"event": "final_reject", "round": rec["round"], "reason": chk.reason})
                    self.say(f"  round {rec['round']} rejected: {chk.reason}")
                    continue
                res = self.executor.bench(path, self.cfg.bench_shapes, self.cfg.bench_dtypes)
                if not res.ok:
                    final["rejected"].append({"round": rec["round"], "reason": f"timing failed: {res.reason}"})
                    continue
                chosen = (rec, chk, res)
                break
            if chosen:
                rec, chk, res = chosen
                src = self.run_dir / rec["file"]
                best_file = self.run_dir / f"best{self.executor.source_suffix}"
                shutil.copy(src, best_file)
                final.update({
                    "best_round": rec["round"], "best_file": str(best_file), "code_sha256": _sha(best_file),
                    "reverify": f"{chk.reason} ({self.executor.check_suite(True)})",
                    "timings": [t.to_json() for t in res.timings], "geomean": round(res.geomean, 4),
                    "verdict": (f"Round {rec['round']} ({(rec.get('plan') or {}).get('change', '')[:200]}) is the best "
                                f"kernel: {res.geomean:.3f}x geometric-mean speedup over production on the timing suite "
                                f"in the report run ({rec['geomean']:.3f}x in its round). Kept as {best_file.name}."),
                    "timing_note": "production and best kernel interleaved, a fresh run after re-verification"})
            else:
                final.update({"best_round": 0, "best_file": None,
                              "verdict": "No candidate beat the production kernel and passed re-verification: the "
                                         "production kernel stays the best."})
        head = {"op": self.spec.name, "date": time.strftime("%Y-%m-%d %H:%M"), "device": self.executor.describe().get("device"),
                "mode": self.cfg.mode, "model": self.provider_spec.model, "rounds_done": max(self.records) if self.records else None,
                "stop": next((e["reason"] for e in reversed(self.log.events) if e.get("event") == "stop"), None),
                "usage": self.meter.total.to_json(), "command": self.command}
        final["report"] = write_report(self.run_dir, self.redactor.obj(head), recs, self.redactor.obj(final))
        self.log.append({"event": "final", **{k: v for k, v in final.items() if k != "timings"}})
        return final
