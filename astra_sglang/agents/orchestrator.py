"""The deterministic orchestrator: the Astra paper's Algorithm 1 with a few changes.

    round 0   the production kernel: compile, testing agent proposes extra tests, check, time,
              profiling agent explains it
    round r   start from the BEST correct kernel so far (not blindly the last one; with --beam N,
              the least-expanded of the N best); the planning agent reads each timed shape's
              regime (workload.py) and picks one change; coding agent writes the candidate (compile errors go
              back to it, at most --max-fixes times); testing agent may add tests aimed at the change;
              check (mandatory suite + added tests, fresh inputs) -> time (interleaved with
              production) -> re-check on fresh inputs; a timing bench refuses as impossible fails
              the round; the profiling agent explains a kernel when it first becomes the starting
              point of a round, again with Nsight Compute from --profile-from-round on
    end       the best candidate is re-verified on fresh inputs over the full corpus, then timed again
              for the report (table, plot, best kernel file)

Budgets (rounds, wall time, tokens, cost) are checked before every model request and between
steps; when one runs out the log and the best kernel so far are kept and reported. Everything is
in log.jsonl (round, parent, code hash and file, correctness with its reason, per-shape times, the
workload regimes the planner was shown, whether profiling was given, model usage); `resume=True`
rebuilds the state from it and continues with the first unfinished round.

The state the tools act on is a RoundContext (context.py) passed to the SDK's Runner; the
orchestrator imports the tools only through the agents it builds (roles.py).
"""
from __future__ import annotations

import hashlib
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import AstraError
from .budget import Budget, BudgetExhausted, Meter, Usage, price_for
from .context import OptimizeConfig, RoundContext, Run, best_of, choose_parent, ranked
from .executor import Executor, ExtraTests, parse_shape, shape_key
from .providers import Provider, ProviderSpec, map_error
from .report import outcome_text, roofline_table, timing_table, write_report
from .roles import build_agent, parse_plan, plan_model
from .runlog import Redactor, RunLog, iter_rounds
from .workload import regimes, summary, workload_table

LOG_VERSION = 1

__all__ = ["Interrupted", "OptimizeConfig", "Optimizer", "Outcome"]


class Interrupted(AstraError):
    exit_code = 130


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
    if rec.get("refused"):
        return "refused"
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
        self.records: Dict[int, Dict[str, Any]] = {}
        # subject round -> (the profiling agent's text, whether Nsight Compute was given)
        self.profiles: Dict[int, Tuple[str, bool]] = {}
        self.round_usage = Usage()
        self._agents: Dict[Tuple[str, bool], Any] = {}
        self._open()
        self.ctx = RoundContext(self.state, 0)

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
        self.state = Run(self.spec, self.executor, self.cfg, self.run_dir, self.log, self.say, self.records)
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
        self.state.run_id = start["run_id"]
        # The objective must stay comparable across sessions: the timing suite comes from the log.
        self.cfg.bench_shapes = [parse_shape(s) for s in start["bench_shapes"]]
        self.cfg.bench_dtypes = list(start["bench_dtypes"])
        for e in events:
            kind = e.get("event")
            if kind == "tests_added":
                self.state.extra = self.state.extra.merged([parse_shape(s) for s in e.get("shapes", [])])
            elif kind == "profile":
                self.profiles[int(e["subject_round"])] = (e.get("text", ""), bool(e.get("profiling", True)))
            elif kind == "agent":
                self.meter.total.add(Usage.from_json(e.get("usage")))
        for rec in iter_rounds(events):
            self.records[int(rec["round"])] = rec

    def say(self, msg: str) -> None:
        self._progress(self.redactor.text(msg))

    # -- state queries --------------------------------------------------------------------------------
    @property
    def extra(self) -> ExtraTests:
        return self.state.extra

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def cand_path(self, r: int, suffix: str = "") -> Path:
        return self.state.candidate_path(r, suffix)

    def record_of(self, r: Optional[int]) -> Optional[Dict[str, Any]]:
        return None if r is None else self.records.get(int(r))

    def best(self) -> Dict[str, Any]:
        """The best correct kernel so far: highest geomean speedup; round 0 (production) is 1.0;
        ties go to the earlier round."""
        return best_of(self.records)

    def log_table(self) -> str:
        return self.state.log_table()

    # -- agents ---------------------------------------------------------------------------------------
    def _facts(self) -> Dict[str, Any]:
        """What every agent's instructions say about the op, the candidate language and the objective."""
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
            "profile_from_round": self.cfg.profile_from_round,
        }

    def _agent(self, role: str):
        key = (role, self.ctx.profiling)
        if key not in self._agents:
            self._agents[key] = build_agent(role, self._facts(), self.provider.model(role),
                                            self.provider_spec.strict_schema, self.ctx.profiling)
        return self._agents[key]

    def _run_agent(self, role: str, purpose: str, text: str):
        """Run one agent to its final answer on this round's context. Returns (final_output, error or None)."""
        from agents import RunConfig, Runner
        from agents.exceptions import AgentsException

        self.ctx.role = role
        self.meter.current = Usage()
        self.say(f"  · {role}: {purpose}")
        final, error, calls = None, None, []
        try:
            result = self.provider.loop.run_until_complete(Runner.run(
                self._agent(role), text, context=self.ctx, max_turns=self.cfg.max_turns,
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
        ev = {"event": "agent", "round": self.ctx.round, "role": role, "purpose": purpose,
              "tool_calls": calls, "usage": usage.to_json(), "output": out, "profiling": self.ctx.profiling}
        if error:
            ev["error"] = error
        self.log.append(ev)

    # -- steps ---------------------------------------------------------------------------------------
    def _testing(self, r: int, path: Path, parent: Optional[Dict[str, Any]] = None,
                 plan: Optional[Dict[str, str]] = None) -> None:
        self.ctx.study(path, r)  # read_source("current") is the kernel under test
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
        """The profiling agent explains `rec` once, and once more when Nsight Compute becomes available."""
        k = rec["round"]
        have = self.profiles.get(k)
        if have is not None and (have[1] or not self.ctx.profiling):
            return
        self.ctx.study(self.run_dir / rec["file"], k)
        text = (f"Kernel under study: round {k} ({'the production kernel' if k == 0 else 'a candidate'}; geomean "
                f"speedup over production {rec['geomean']:.3f}x).\nIts timing (interleaved with production):\n"
                f"{timing_table(rec['timings'])}\nRoofline:\n{roofline_table(self.spec, rec['timings'])}\n"
                f"Workload:\n{workload_table(self._regimes(rec), f'round {k}')}\n"
                f"Its source:\n{_fence((self.run_dir / rec['file']).read_text())}")
        final, _ = self._run_agent("profiling", f"explains round {k}" + (" with Nsight Compute" if have else ""), text)
        self.profiles[k] = (str(final or ""), self.ctx.profiling)
        self.log.append({"event": "profile", "round": self.ctx.round, "subject_round": k,
                         "profiling": self.ctx.profiling, "text": self.profiles[k][0]})

    def _regimes(self, rec: Dict[str, Any]):
        """Each timed shape's regime, from `rec`'s timings and the launch floor of its bench run (or
        round 0's)."""
        info = rec.get("bench_info") or {}
        if not info.get("launch_floor_us") and 0 in self.records:
            info = self.records[0].get("bench_info") or {}
        return regimes(rec.get("timings") or [], info)

    def _refusals(self) -> str:
        """What the planner must know about rounds whose timing bench refused."""
        lines = [f"- round {rec['round']}: {'; '.join(rec['refused'])}" for rec in
                 (self.records[k] for k in sorted(self.records)) if rec.get("refused")]
        if not lines:
            return ""
        return ("\n\nTimings bench REFUSED as impossible (faster than the copy ceiling allows or under the launch "
                "floor: the kernel skipped work or fooled the timer, e.g. caching by pointer or ignoring the stream; "
                "these rounds failed, do not build on them):\n" + "\n".join(lines))

    def _state_text(self, r: int, parent: Dict[str, Any]) -> str:
        k = parent["round"]
        beam = ""
        if self.cfg.beam > 1:
            top = ranked(self.records)[:self.cfg.beam]
            beam = (f" With --beam {self.cfg.beam} this round starts from round {k}, one of the "
                    f"{len(top)} best correct kernels (rounds {', '.join(str(x['round']) for x in top)}); "
                    f"the best is round {top[0]['round']} ({top[0]['geomean']:.3f}x).")
        profile = self.profiles.get(k, ("", False))[0]
        return (f"Round {r} of {self.cfg.rounds}. The current kernel is round {k} "
                f"(geomean speedup over production {parent['geomean']:.3f}x).{beam}\n\nLog so far:\n{self.log_table()}"
                f"{self._refusals()}\n\n"
                f"Workload (each timed shape's regime, measured in this run):\n"
                f"{workload_table(self._regimes(parent), f'round {k}')}\n\n"
                f"Timing of the current kernel (interleaved with production):\n{timing_table(parent['timings'])}\n\n"
                f"Roofline of the current kernel:\n{roofline_table(self.spec, parent['timings'])}\n\n"
                f"Profiler's facts about the current kernel"
                f"{'' if self.ctx.profiling else ' (timings only: Nsight Compute metrics come from round ' + str(self.cfg.profile_from_round) + ' on)'}"
                f":\n{profile or '(none yet)'}\n\n"
                f"Source of the current kernel (round {k}):\n{_fence((self.run_dir / parent['file']).read_text())}")

    def _plan(self, r: int, parent: Dict[str, Any]) -> Dict[str, Any]:
        self.ctx.study(self.run_dir / parent["file"], parent["round"])
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
        self.ctx.study(None, None)
        self.ctx.write_to(path)
        text = (f"Plan for round {r}:\nchange: {plan['change']}\nrationale: {plan.get('rationale', '')}\n"
                f"expected effect: {plan.get('expected_effect', '')}\n\nStart from this kernel (round "
                f"{parent['round']}):\n{_fence((self.run_dir / parent['file']).read_text())}\n\n"
                "Write the complete new file with write_candidate.")
        self._run_agent("coding", "writes the candidate", text)

    def _single(self, r: int, parent: Dict[str, Any], path: Path) -> None:
        self.ctx.study(self.run_dir / parent["file"], parent["round"])
        self.ctx.write_to(path)
        text = self._state_text(r, parent) + (f"\n\nTests added so far: {', '.join(shape_key(s) for s in self.extra.shapes) or 'none'}."
                                              f"\nDo round {r}: end by writing the complete candidate with write_candidate.")
        self._run_agent("single", "does the round", text)

    def _fix(self, r: int, path: Path, comp, attempt: int) -> None:
        role = "single" if self.cfg.mode == "single" else "coding"
        self.ctx.write_to(path)
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
        rec["profiling"] = self.ctx.profiling
        ev = self.log.append({"event": "round", **rec})
        self.records[rec["round"]] = ev
        best = self.best()
        self.say(f"  = round {ev['round']}: {outcome_text(ev)}   (best so far: round {best['round']}, "
                 f"{best['geomean']:.3f}x; tokens {self.meter.total.total_tokens})")
        return ev

    def _begin(self, r: int, parent: Optional[int] = None) -> float:
        self.ctx = RoundContext(self.state, r, parent=parent, profiling=r >= self.cfg.profile_from_round)
        self.provider.set_round(r)
        self.round_usage = Usage()
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
        chk = self.executor.check(path, self.state.suite(), self.state.seed(0, 1))
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
        parent = choose_parent(self.records, self.cfg.beam)
        t0 = self._begin(r, parent["round"])
        self.say(f"round {r}/{self.cfg.rounds}: starting from round {parent['round']} ({parent['geomean']:.3f}x)"
                 + ("" if self.ctx.profiling else "; timings only (no Nsight Compute before round "
                    f"{self.cfg.profile_from_round})"))
        path = self.cand_path(r)
        for stale in self.cand_dir.glob(f"r{r:02d}.*"):  # an interrupted earlier try of this round
            stale.unlink()
        base: Dict[str, Any] = {"round": r, "parent": parent["round"], "file": str(path.relative_to(self.run_dir)),
                                "workload": summary(self._regimes(parent))}
        if self.cfg.beam > 1:
            base["beam"] = [x["round"] for x in ranked(self.records)[:self.cfg.beam]]
        plan = None
        if self.cfg.mode == "multi":
            self._ensure_profile(parent)
            plan = self._plan(r, parent)
            self.say(f"    plan: {plan['change'][:160]}")
            self._code(r, parent, plan, path)
        else:
            self._single(r, parent, path)
        base["plan"] = plan
        if not self.ctx.written or not path.exists():
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
            if not self.ctx.written:
                break
            comp = self.executor.compile(path)
        compile_info = {"ok": comp.ok, "attempts": attempts, "seconds": round(comp.seconds, 2)}
        if not comp.ok:
            compile_info["error"] = comp.error
            self._record({**base, "compile": compile_info, "correct": None, "reason": f"compile error: {comp.error}"}, t0)
            return
        if self.cfg.mode == "multi":
            self._testing(r, path, parent, plan)
        chk = self.executor.check(path, self.state.suite(), self.state.seed(r, 1))
        if not chk.ok:
            self._record({**base, "compile": compile_info, "correct": False, "reason": chk.reason,
                          "check_cases": chk.cases}, t0)
            return
        self.say(f"  · check: {chk.reason}")
        res = self.executor.bench(path, self.cfg.bench_shapes, self.cfg.bench_dtypes)
        if res.refused:  # impossible numbers: the round failed, and the planner is told why
            self._record({**base, "compile": compile_info, "correct": False, "refused": list(res.refused),
                          "reason": f"bench refused the timing: {'; '.join(res.refused)}", "check_cases": chk.cases,
                          "timings": [t.to_json() for t in res.timings], "bench_info": res.info}, t0)
            return
        if not res.ok:
            self._record({**base, "compile": compile_info, "correct": False, "reason": f"failed in timing or its re-check: {res.reason}",
                          "check_cases": chk.cases}, t0)
            return
        timings = [t.to_json() for t in res.timings]
        cases = chk.cases
        if not self.executor.bench_rechecks:  # the executor's bench did not re-check: do it here
            re = self.executor.check(path, self.state.suite(), self.state.seed(r, 2))
            if not re.ok:
                self._record({**base, "compile": compile_info, "correct": False, "timings": timings,
                              "reason": f"failed the re-check on fresh inputs after timing: {re.reason}"}, t0)
                return
            cases += re.cases
        self._record({**base, "compile": compile_info, "correct": True, "reason": chk.reason,
                      "check_cases": cases, "timings": timings, "geomean": round(res.geomean, 4),
                      "median_spread": round(res.median_spread, 4), "bench_info": res.info}, t0)

    @property
    def cand_dir(self) -> Path:
        return self.run_dir / "candidates"

    # -- the run -------------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        self.provider = Provider(self.provider_spec, self.meter, self.redactor)
        try:
            self.provider.preflight()
            if not self.log.events:
                self.state.run_id = secrets.token_hex(8)
                self.log.append({
                    "event": "start", "version": LOG_VERSION, "run_id": self.run_id, "op": self.spec.name,
                    "mode": self.cfg.mode, "provider": self.provider_spec.public(self.redactor),
                    "budget": self.budget.to_json(), "executor": self.executor.describe(),
                    "bench_shapes": [shape_key(s) for s in self.cfg.bench_shapes],
                    "bench_dtypes": list(self.cfg.bench_dtypes), "max_fix_attempts": self.cfg.max_fix_attempts,
                    "profile_from_round": self.cfg.profile_from_round, "beam": self.cfg.beam,
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
            self.log.append({"event": "stop", "reason": f"interrupted in round {self.ctx.round}"})
            raise Interrupted(f"interrupted in round {self.ctx.round}: the log is kept in {self.run_dir}; "
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
                chk = self.executor.check(path, self.state.suite(), secrets.randbits(31), full=True)
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
