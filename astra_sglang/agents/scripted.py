"""A scripted model: replays a JSON script of tool calls and final answers through the SDK's own
Runner (it implements the SDK's Model interface), for tests and demos without an LLM.

Script format (paths relative to the script file):

    {"description": "...",
     "rounds": {
       "0": {"testing": [TURN, ...], "profiling": [TURN, ...]},
       "1": {"planning": [...], "coding": [...], "testing": [...], "profiling": [...]},
       ...}}

Each model request of agent ROLE in round R consumes the next TURN of rounds[R][ROLE]:

    {"tool_calls": [{"name": "write_candidate", "arguments": {"source_file": "r1.cu"}}]}
    {"final": "text"}  or  {"final": {...}}  (an object is sent as JSON: the planner's plan)
    {"interrupt": "why"}  raises KeyboardInterrupt (tests of --resume)
    optional on any turn: "usage": {"input_tokens": N, "output_tokens": M}

An argument "source_file": F is replaced by "source": <the text of F>. When a queue runs dry the
model answers with a final message saying so. Usage is estimated as characters / 4 unless given.

With a top-level "record_requests": FILE, every request is appended to FILE as one JSON line
(round, role, instructions, input, tool names), so a test can read what each agent was told.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from ..errors import AstraError


class Script:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise AstraError(f"script {self.path} does not exist")
        except json.JSONDecodeError as e:
            raise AstraError(f"script {self.path} is not valid JSON: {e}")
        if not isinstance(data, dict) or not isinstance(data.get("rounds"), dict):
            raise AstraError(f"script {self.path} has no \"rounds\" object")
        self.rounds: Dict[str, Dict[str, List[Dict[str, Any]]]] = data["rounds"]
        rec = data.get("record_requests")
        self.record_to: Optional[Path] = self.path.parent / rec if rec else None
        self.round = 0
        self._cursor: Dict[Tuple[int, str], int] = {}

    def set_round(self, r: int) -> None:
        """Start round r's queues from their beginning (a resumed round is replayed whole)."""
        self.round = r
        for key in [k for k in self._cursor if k[0] == r]:
            del self._cursor[key]

    def next_turn(self, role: str) -> Optional[Dict[str, Any]]:
        queue = self.rounds.get(str(self.round), {}).get(role, [])
        i = self._cursor.get((self.round, role), 0)
        self._cursor[(self.round, role)] = i + 1
        return queue[i] if i < len(queue) else None

    def record(self, role: str, instructions: Optional[str], input: Any, tools: List[str]) -> None:
        if self.record_to is None:
            return
        if not isinstance(input, str):  # a list of SDK items: keep their text
            input = json.dumps(input, default=str)
        line = {"round": self.round, "role": role, "instructions": instructions or "", "input": input, "tools": tools}
        with open(self.record_to, "a") as f:
            f.write(json.dumps(line) + "\n")

    def resolve_args(self, args: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(args)
        if "source_file" in out:
            f = self.path.parent / out.pop("source_file")
            if not f.exists():
                raise AstraError(f"script {self.path}: candidate file {f} does not exist")
            out["source"] = f.read_text()
        return out


def _chars(o: Any) -> int:
    try:
        return len(json.dumps(o, default=str))
    except Exception:
        return len(str(o))


class ScriptedModel(Model):
    def __init__(self, script: Script, role: str) -> None:
        self.script = script
        self.role = role
        self._n = 0

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *args, **kwargs) -> ModelResponse:
        self.script.record(self.role, system_instructions, input, sorted(t.name for t in tools))
        turn = self.script.next_turn(self.role)
        r = self.script.round
        if turn is None:
            turn = {"final": f"(scripted: no more turns for {self.role} in round {r})"}
        if "interrupt" in turn:
            raise KeyboardInterrupt(str(turn["interrupt"]))
        out: List[Any] = []
        names = {t.name for t in tools}
        for j, call in enumerate(turn.get("tool_calls", [])):
            if call["name"] not in names:
                raise AstraError(f"script {self.script.path}: round {r} {self.role} calls tool {call['name']!r}, "
                                 f"which that agent does not have (it has: {', '.join(sorted(names))})")
            self._n += 1
            cid = f"call_{self.role}_{r}_{self._n}_{j}"
            out.append(ResponseFunctionToolCall(
                id=f"fc_{cid}", call_id=cid, name=call["name"], type="function_call", status="completed",
                arguments=json.dumps(self.script.resolve_args(call.get("arguments", {})))))
        if "final" in turn or not out:
            final = turn.get("final", "")
            text = final if isinstance(final, str) else json.dumps(final)
            self._n += 1
            out.append(ResponseOutputMessage(
                id=f"msg_{self.role}_{r}_{self._n}", role="assistant", status="completed", type="message",
                content=[ResponseOutputText(text=text, type="output_text", annotations=[])]))
        u = turn.get("usage") or {}
        inp = int(u.get("input_tokens", (len(system_instructions or "") + _chars(input)) // 4))
        outp = int(u.get("output_tokens", sum(_chars(o.model_dump()) for o in out) // 4))
        return ModelResponse(output=out, usage=Usage(requests=1, input_tokens=inp, output_tokens=outp,
                                                     total_tokens=inp + outp), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the optimize loop does not stream")
