"""The four agents of the Astra paper (testing, profiling, planning, coding) and the single-agent
ablation: their instructions, their tools, and the planner's output contract.

The planner answers with a JSON plan. With strict-schema providers (OpenAI) the SDK enforces it as
the agent's output type; with servers that lack strict JSON-schema support the schema is in the
prompt and the answer is parsed and validated here (one retry, then the raw text is kept as the
plan and the log says it was not valid).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Dict, Optional, Tuple

from .tools import sdk_tools, tools_for
from .workload import STRATEGIES

PLAN_FIELDS = {
    "change": "the one change to make, concretely (what code, how)",
    "rationale": "why, citing the log, the roofline gap or the profiler's numbers",
    "expected_effect": "which shapes should get faster and by about how much",
}
PLAN_SCHEMA = {
    "type": "object",
    "properties": {k: {"type": "string", "description": v} for k, v in PLAN_FIELDS.items()},
    "required": list(PLAN_FIELDS),
    "additionalProperties": False,
}


@lru_cache(maxsize=None)
def plan_model():
    """The plan as a pydantic model: the SDK's strict output type (pydantic comes with the SDK). A
    BaseModel, not a dataclass, so the SDK does not wrap it in {"response": ...}."""
    from pydantic import BaseModel, ConfigDict, Field

    class Plan(BaseModel):
        model_config = ConfigDict(extra="forbid")
        change: str = Field(description=PLAN_FIELDS["change"])
        rationale: str = Field(description=PLAN_FIELDS["rationale"])
        expected_effect: str = Field(description=PLAN_FIELDS["expected_effect"])

    return Plan


def parse_plan(text: str) -> Tuple[Optional[Dict[str, str]], str]:
    """(plan, "") or (None, what is wrong). Accepts the object bare or inside a ``` fence."""
    candidates = re.findall(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        candidates.append(text[start:end + 1])
    if not candidates:
        return None, "no JSON object found"
    err = ""
    for c in candidates:
        try:
            obj = json.loads(c)
        except json.JSONDecodeError as e:
            err = f"invalid JSON: {e}"
            continue
        if not isinstance(obj, dict):
            err = "the JSON is not an object"
            continue
        missing = [k for k in PLAN_FIELDS if not isinstance(obj.get(k), str) or not obj.get(k).strip()]
        if missing:
            err = f"missing or empty string fields: {', '.join(missing)}"
            continue
        return {k: obj[k].strip() for k in PLAN_FIELDS}, ""
    return None, err


def _common(ctx: Dict[str, Any]) -> str:
    return (
        f"You are part of Astra, a multi-agent system that optimizes one GPU kernel taken from SGLang's "
        f"production code: {ctx['op']} ({ctx['summary']}).\n"
        f"Kernel ABI (every candidate is one self-contained source file): {ctx['signature']}\n"
        f"Candidate language and rules: {ctx['language']}\n"
        f"Speed: geometric-mean speedup over the production kernel on the timing suite "
        f"({ctx['bench_shapes']} x {ctx['bench_dtypes']}), {ctx['timer']}.\n"
        f"Correctness oracle: {ctx['check_suite']}\n"
        f"Shapes are written {ctx['dims']} (e.g. {ctx['example_shape']}).\n"
    )


INSTRUCTIONS = {
    "testing": (
        "You are the TESTING agent. Propose extra tests (shapes and value distributions) that would expose "
        "bugs an optimized variant of this kernel is likely to have: tails when a size is not a multiple of "
        "the vector width or block size, a single token, odd sizes, the largest sizes, value ranges that "
        "overflow exp. Tests are added to the mandatory suite, never replace it; each is first run on the "
        "production kernel and rejected if that fails. Use list_tests to see what is covered and add_tests "
        "to add (at most {max_tests} shapes per round, no duplicates of the suite). Finish with two or three "
        "sentences on what you added and which bug each would catch."
    ),
    "profiling": (
        "You are the PROFILING agent. Explain where the kernel under study loses time, with numbers: use "
        "bench (interleaved with production), roofline (bytes moved, achieved bandwidth, % of the copy "
        "ceiling){ncu_clause}. Answer in at most ten lines: the bottleneck per shape class (small/decode vs "
        "large/prefill), the evidence, and where the headroom is. Facts only; no code."
    ),
    "planning": (
        "You are the PLANNING agent. Choose the ONE next change to make to the current kernel, using "
        "the log of what was tried (do not repeat a change that failed unless you say how its failure is "
        "avoided; a timing bench refused is a failed change), the workload table (each timed shape's regime, "
        "its in-context and chained times), the roofline gap and the profiler's facts. Prefer the change with "
        "the largest expected gain on the shapes with the most headroom, of a kind that fits their regime; "
        "correctness first.\n{strategies}"
    ),
    "coding": (
        "You are the CODING agent. Apply the given plan to the given kernel source and write the COMPLETE new "
        "file with write_candidate (the whole file, never a diff). Keep the ABI entry point's name and "
        "signature exactly; support every dtype the ABI takes; keep all sizes correct (tails, one token). If "
        "you are given compiler errors, fix them and write the whole file again. Finish with one line saying "
        "what you changed."
    ),
    "single": (
        "You are the only agent: you design tests, profile, plan and code. In each round: read the log and the "
        "current kernel, optionally add tests (add_tests) and profile (bench, roofline{ncu_name}), decide ONE "
        "change that fits the regime of the shapes with the most headroom (see the workload table), and write "
        "the COMPLETE new candidate file with write_candidate (never a diff; keep the ABI entry point exactly; "
        "keep all sizes correct). The orchestrator compiles, checks and times it after you finish. Finish with "
        "one line saying what you changed and why.\n{strategies}"
    ),
}


def instructions(role: str, facts: Dict[str, Any], profiling: bool) -> str:
    """The role's instructions; `profiling` says whether Nsight Compute metrics are given this round."""
    if profiling:
        ncu_clause = " and ncu (DRAM throughput, occupancy, registers, spills, stall reasons) when available"
    else:
        ncu_clause = (f"; Nsight Compute metrics are not given before round {facts['profile_from_round']} "
                      "(the kernel's structure settles first): work from the timings")
    return _common(facts) + "\n" + INSTRUCTIONS[role].format(
        max_tests=facts["max_tests"], ncu_clause=ncu_clause, ncu_name=", ncu" if profiling else "",
        strategies=STRATEGIES)


def plan_prompt_suffix() -> str:
    return ("\nAnswer with ONLY a JSON object (no prose before or after) matching this JSON schema:\n"
            + json.dumps(PLAN_SCHEMA, indent=1))


def build_agent(role: str, facts: Dict[str, Any], model, strict: bool, profiling: bool):
    """One SDK Agent for `role`: its instructions, its tools (the profiler's only when `profiling`),
    `model` (the provider's metered model). Its tools act on the RoundContext the run passes."""
    from agents import Agent

    text = instructions(role, facts, profiling)
    kwargs: Dict[str, Any] = {}
    if role == "planning":
        if strict:
            kwargs["output_type"] = plan_model()
        else:
            text += plan_prompt_suffix()
    tools = sdk_tools(tools_for(role, profiling), strict)
    return Agent(name=f"astra-{role}", instructions=text, tools=tools, model=model, **kwargs)
