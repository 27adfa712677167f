"""optimize: the pieces, fast (no executor runs): plan parsing, redaction, prices and budgets,
provider resolution and error mapping, the scripted model under the SDK's real Runner, and the
best-candidate rule."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from astra_sglang.agents.budget import Budget, BudgetExhausted, Meter, Usage, price_for
from astra_sglang.agents.executor import Timing, parse_shape, shape_key
from astra_sglang.agents.providers import ProviderSpec, map_error, resolve
from astra_sglang.agents.roles import parse_plan
from astra_sglang.agents.runlog import Redactor, RunLog, iter_rounds, read_log
from astra_sglang.errors import AstraError

CPU = Path(__file__).parent / "optimize_fixtures" / "cpu"


def _sdk():
    try:
        import agents
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"needs the OpenAI Agents SDK ({e})")
    agents.set_tracing_disabled(True)


# -- plans -------------------------------------------------------------------------------------------
def test_parse_plan_accepts_bare_fenced_and_embedded_json():
    want = {"change": "a", "rationale": "b", "expected_effect": "c"}
    assert parse_plan(json.dumps(want)) == (want, "")
    assert parse_plan("```json\n" + json.dumps(want) + "\n```")[0] == want
    assert parse_plan("Here is my plan: " + json.dumps(want) + " Good luck.")[0] == want


def test_parse_plan_says_what_is_wrong():
    assert parse_plan("no json here") == (None, "no JSON object found")
    plan, why = parse_plan('{"change": "a", "rationale": ""}')
    assert plan is None and "rationale" in why and "expected_effect" in why
    plan, why = parse_plan('{"change": "a", "rationale": ')
    assert plan is None and why


# -- redaction, log --------------------------------------------------------------------------------
def test_redactor_hides_the_key_and_key_like_strings():
    r = Redactor()
    r.add("my-local-secret-token")
    text = ("key my-local-secret-token, Incorrect API key provided: sk-proj-abcdefghijklmnop, "
            "Authorization: Bearer abcdefghijklmnopqrstuv, url http://user:pw123@host:8000/v1, api_key=zzzzzzzzzz")
    out = r.text(text)
    for secret in ("my-local-secret-token", "sk-proj-abcdefghijklmnop", "abcdefghijklmnopqrstuv", "pw123", "zzzzzzzzzz"):
        assert secret not in out
    assert r.obj({"a": ["my-local-secret-token"]}) == {"a": ["***"]}


def test_run_log_appends_redacts_and_survives_a_torn_line(tmp_path):
    r = Redactor(["sekrit-value"])
    log = RunLog(tmp_path, r)
    log.append({"event": "start", "note": "uses sekrit-value"})
    log.append({"event": "round", "round": 0})
    log.append({"event": "round", "round": 0, "again": True})
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"event": "round", "rou')  # a crash mid-write
    ev = read_log(tmp_path / "log.jsonl")
    assert [e["event"] for e in ev] == ["start", "round", "round"]
    assert "sekrit-value" not in (tmp_path / "log.jsonl").read_text()
    assert iter_rounds(ev)[0]["again"] is True
    assert RunLog(tmp_path, r).elapsed_s >= ev[-1]["elapsed_s"]  # wall time carries over on resume


# -- prices, budgets -------------------------------------------------------------------------------
def test_prices():
    assert price_for("o4-mini") == (1.10, 4.40)
    assert price_for("o4-mini-2025-04-16") == (1.10, 4.40)
    assert price_for("gpt-4o-mini") == (0.15, 0.60)  # not gpt-4o's price
    assert price_for("my-local-model") is None
    assert price_for("my-local-model", (1.0, 2.0)) == (1.0, 2.0)


def test_meter_budgets():
    t = [0.0]
    m = Meter(Budget(5, max_wall_s=10, max_tokens=100, max_cost_usd=None), (1e6, 1e6), lambda: t[0])
    m.check()
    m.record(40, 20)
    assert m.total.total_tokens == 60 and m.total.cost_usd == pytest.approx(60.0)
    m.check()
    m.record(30, 10)
    with pytest.raises(BudgetExhausted, match="tokens 100 of 100"):
        m.check()
    m2 = Meter(Budget(5, max_wall_s=10), None, lambda: t[0])
    t[0] = 11
    with pytest.raises(BudgetExhausted, match="wall time"):
        m2.check()
    m3 = Meter(Budget(5, max_cost_usd=0.5), (1e6, 0), lambda: 0.0)
    m3.record(1, 0)
    with pytest.raises(BudgetExhausted, match=r"cost \$1.0000 of \$0.5000") as e:
        m3.check()
    assert e.value.exit_code == 3
    u = Usage.from_json(m.total.to_json())
    assert (u.input_tokens, u.output_tokens) == (70, 30)


# -- providers ---------------------------------------------------------------------------------------
def test_resolve_errors_and_defaults(monkeypatch, tmp_path):
    for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    r = Redactor()
    with pytest.raises(AstraError, match="no model configured"):
        resolve(None, None, None, None, r)
    with pytest.raises(AstraError, match="no API key for OpenAI"):
        resolve("o4-mini", None, None, None, r)
    with pytest.raises(AstraError, match="does not exist"):
        resolve(f"scripted:{tmp_path / 'nope.json'}", None, None, None, r)
    with pytest.raises(AstraError, match="not an http"):
        resolve("m", "localhost:30000", None, None, r)
    p = resolve("o4-mini", None, "sk-abcdefghijklmnopqr", None, r)
    assert (p.kind, p.strict_schema) == ("openai", True)
    assert "sk-abcdefghijklmnopqr" in r.secrets
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:30000/v1")
    p = resolve("qwen", None, None, None, r)
    assert (p.kind, p.strict_schema, p.endpoint) == ("compatible", False, "http://localhost:30000/v1")
    assert "api_key" not in json.dumps(p.public(r)) and p.public(r)["endpoint"] == "http://localhost:30000/v1"
    p = resolve(f"scripted:{CPU / 'script.json'}", None, None, None, r)
    assert p.kind == "scripted" and p.strict_schema is False


def test_map_error_one_line_per_failure():
    openai = pytest.importorskip("openai")
    try:
        import httpx2 as httpx  # openai 3's HTTP client
    except ImportError:
        httpx = pytest.importorskip("httpx")
    spec = ProviderSpec("compatible", "m", "http://127.0.0.1:9/v1", "k", False)
    req = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

    def status(cls, code, body=None):
        return cls("x", response=httpx.Response(code, request=req), body=body)

    assert "cannot reach the model endpoint http://127.0.0.1:9/v1" in str(map_error(openai.APIConnectionError(request=req), spec))
    assert "rejected the API key (401)" in str(map_error(status(openai.AuthenticationError, 401), spec))
    assert "(403)" in str(map_error(status(openai.PermissionDeniedError, 403), spec))
    assert "model 'm' not found" in str(map_error(status(openai.NotFoundError, 404), spec))
    assert "quota" in str(map_error(status(openai.RateLimitError, 429, {"error": {"message": "slow down"}}), spec))
    assert "answered 500: boom" in str(map_error(status(openai.InternalServerError, 500, {"error": {"message": "boom"}}), spec))
    assert map_error(ValueError("x"), spec) is None


# -- the scripted model through the SDK's Runner ----------------------------------------------------------
def test_scripted_model_replays_tool_calls_and_files(tmp_path):
    _sdk()
    from agents import Agent, Runner, function_tool

    from astra_sglang.agents.scripted import Script, ScriptedModel

    (tmp_path / "cand.cu").write_text("// the candidate\n")
    (tmp_path / "s.json").write_text(json.dumps({"rounds": {"2": {"coding": [
        {"tool_calls": [{"name": "write_candidate", "arguments": {"source_file": "cand.cu"}}],
         "usage": {"input_tokens": 7, "output_tokens": 3}},
        {"final": "done"}]}}}))
    got = []

    @function_tool
    def write_candidate(source: str) -> str:
        """Write it."""
        got.append(source)
        return "ok"

    script = Script(tmp_path / "s.json")
    script.set_round(2)
    agent = Agent(name="c", instructions="x", tools=[write_candidate], model=ScriptedModel(script, "coding"))
    res = asyncio.run(Runner.run(agent, "go"))
    assert res.final_output == "done" and got == ["// the candidate\n"]
    assert res.context_wrapper.usage.input_tokens >= 7
    # a dry queue answers with a final message; replaying the round starts it over
    res = asyncio.run(Runner.run(agent, "go"))
    assert "no more turns for coding in round 2" in res.final_output
    script.set_round(2)
    asyncio.run(Runner.run(agent, "go"))
    assert len(got) == 2
    # a tool the agent does not hold is a script error, said plainly
    other = Agent(name="p", instructions="x", tools=[], model=ScriptedModel(script, "coding"))
    script.set_round(2)
    with pytest.raises(AstraError, match="calls tool 'write_candidate', which that agent does not have"):
        asyncio.run(Runner.run(other, "go"))


def test_strict_plan_output_type_through_the_sdk(tmp_path):
    _sdk()
    from agents import Agent, Runner

    from astra_sglang.agents.roles import plan_model
    from astra_sglang.agents.scripted import Script, ScriptedModel

    Plan = plan_model()

    plan = {"change": "vectorize", "rationale": "16-byte loads", "expected_effect": "1.2x"}
    (tmp_path / "s.json").write_text(json.dumps({"rounds": {"1": {"planning": [{"final": plan}]}}}))
    script = Script(tmp_path / "s.json")
    script.set_round(1)
    agent = Agent(name="p", instructions="x", model=ScriptedModel(script, "planning"), output_type=Plan)
    res = asyncio.run(Runner.run(agent, "plan"))
    assert isinstance(res.final_output, Plan) and res.final_output.change == "vectorize"


# -- shapes and timings -------------------------------------------------------------------------------
def test_shapes_and_timing_json_roundtrip():
    assert parse_shape("16x4096") == (16, 4096) and parse_shape(" 3×1368 ") == (3, 1368)
    assert shape_key((7, 1001)) == "7x1001"
    t = Timing((16, 4096), "fp16", 2.0, 1.6, 0.01, 0.02, 40.0, 32.0)
    d = t.to_json()
    assert d["shape"] == "16x4096" and d["speedup"] == 1.25 and d["noise"] is False
    assert Timing.from_json(d) == t
    assert Timing((1, 1), "fp16", 1.0, 0.99, 0.02, 0.02).noise


def test_best_is_the_best_correct_not_the_last():
    from astra_sglang.agents.orchestrator import Optimizer

    opt = Optimizer.__new__(Optimizer)
    opt.records = {
        0: {"round": 0, "correct": True, "geomean": 1.0},
        1: {"round": 1, "correct": True, "geomean": 1.3},
        2: {"round": 2, "correct": False, "geomean": None},
        3: {"round": 3, "correct": True, "geomean": 0.8},
        4: {"round": 4, "correct": True, "geomean": 1.3},
    }
    assert opt.best()["round"] == 1  # ties go to the earlier round; the last (slower) one is never chosen
    opt.records[5] = {"round": 5, "correct": False, "geomean": 9.0}  # fast but wrong
    assert opt.best()["round"] == 1
