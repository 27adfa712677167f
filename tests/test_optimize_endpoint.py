"""optimize against an OpenAI-compatible chat-completions endpoint: a local fake server that speaks
the protocol (no strict JSON-schema support), driven by the SDK's real OpenAIChatCompletionsModel;
and the one-line errors for an unreachable endpoint, a rejected key and an unserved model."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CPU = Path(__file__).parent / "optimize_fixtures" / "cpu"
KEY = "sk-local-fake-server-key-000111222333"
PLAN = {"change": "One fused fp32 pass with expf.", "rationale": "two passes and double tanh dominate",
        "expected_effect": "several x on every shape"}


@pytest.fixture(scope="module", autouse=True)
def _prereqs():
    for mod in ("agents", "torch"):
        try:
            __import__(mod)
        except ImportError as e:
            if os.environ.get("CI"):
                raise
            pytest.skip(f"needs {mod} ({e})")


class FakeLLM(ThreadingHTTPServer):
    """Answers like a small local model: knows which agent asks from its instructions."""

    def __init__(self, mode: str = "ok"):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.requests = []
        self.auth = set()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def _reply(body, text=None, tool=None):
    msg = {"role": "assistant", "content": text}
    if tool:
        msg["tool_calls"] = [{"id": f"call_{len(body['messages'])}", "type": "function",
                              "function": {"name": tool[0], "arguments": json.dumps(tool[1])}}]
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if tool else "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        srv = self.server
        srv.auth.add(self.headers.get("Authorization", ""))
        if srv.mode == "reject":
            # like OpenAI: the error echoes (part of) the key
            return self._send(401, {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid_request_error"}})
        if self.path.endswith("/models"):
            return self._send(200, {"object": "list", "data": [{"id": "fake-coder", "object": "model", "created": 0,
                                                                "owned_by": "test"}]})
        self._send(404, {"error": {"message": "no"}})

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.requests.append(body)
        srv.auth.add(self.headers.get("Authorization", ""))
        if srv.mode == "reject-chat":  # the key is revoked after the run started
            return self._send(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}})
        system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
        last = body["messages"][-1]
        if "CODING agent" in system and last["role"] != "tool":
            src = (CPU / "r4_faster.c").read_text()
            return self._send(200, _reply(body, tool=("write_candidate", {"source": src})))
        if "PLANNING agent" in system:
            return self._send(200, _reply(body, text="My plan:\n```json\n" + json.dumps(PLAN) + "\n```"))
        return self._send(200, _reply(body, text="Nothing to add; the suite covers it."))


def optimize(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "astra_sglang.cli", "optimize", "silu_and_mul", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_compatible_endpoint_without_strict_schema(tmp_path):
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("needs a C compiler")
    srv = FakeLLM()
    run = tmp_path / "run"
    try:
        res = optimize("--executor", "cpu", "--baseline", str(CPU / "baseline.c"), "--base-url", srv.url,
                       "--model", "fake-coder", "--rounds", "1", "--run-dir", str(run),
                       "--shapes", "4x4096", "--check-shapes", "1x4096,7x1001", "--final-shapes", "edge",
                       env_extra={"OPENAI_API_KEY": KEY})
    finally:
        srv.shutdown()
    assert res.returncode == 0, res.stderr[-4000:]
    assert srv.auth == {f"Bearer {KEY}"}  # the key went to the server ...
    for p in run.rglob("*"):  # ... and nowhere else
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p
    assert KEY not in res.stdout + res.stderr
    # no strict JSON schema asked of a server that may not support it: no response_format, no strict tools
    for body in srv.requests:
        assert "response_format" not in body
        for tool in body.get("tools", []):
            assert tool["function"].get("strict") in (None, False)
    planning = [b for b in srv.requests if "PLANNING agent" in b["messages"][0]["content"]]
    assert planning and '"expected_effect"' in planning[0]["messages"][0]["content"]  # the schema is in the prompt
    ev = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines()]
    assert ev[0]["provider"] == {"kind": "compatible", "model": "fake-coder", "strict_schema": False,
                                 "endpoint": srv.url}
    r1 = [e for e in ev if e["event"] == "round" and e["round"] == 1][0]
    assert r1["plan"] == {**PLAN, "valid": True}
    assert r1["status"] == "correct" and r1["geomean"] > 1.0
    assert r1["usage"]["input_tokens"] == 100 * r1["usage"]["requests"]
    assert ev[-1]["best_round"] == 1


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_endpoint_errors_are_one_line(tmp_path):
    base = ["--executor", "cpu", "--baseline", str(CPU / "baseline.c"), "--run-dir", str(tmp_path / "r")]
    res = optimize(*base)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: no model configured: pass --model")
    res = optimize(*base, "--model", "o4-mini")
    assert res.returncode == 2 and "error: no API key for OpenAI" in res.stderr
    url = f"http://127.0.0.1:{_free_port()}/v1"
    res = optimize(*base, "--model", "m", "--base-url", url)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: cannot reach the model endpoint {url}")
    srv = FakeLLM("reject")
    try:
        res = optimize(*base, "--model", "fake-coder", "--base-url", srv.url, env_extra={"OPENAI_API_KEY": KEY})
    finally:
        srv.shutdown()
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == f"error: the model endpoint {srv.url} rejected the API key (401)"
    assert KEY not in res.stderr + res.stdout
    srv = FakeLLM()
    try:
        res = optimize(*base, "--model", "not-served", "--base-url", srv.url)
    finally:
        srv.shutdown()
    assert res.returncode == 2
    assert "error: model 'not-served' is not served at" in res.stderr and "fake-coder" in res.stderr
    assert not (tmp_path / "r" / "log.jsonl").exists()  # nothing was started
    # a key rejected in the middle of a run: one line, the log kept, the key nowhere
    srv = FakeLLM("reject-chat")
    try:
        res = optimize(*base, "--model", "fake-coder", "--base-url", srv.url, env_extra={"OPENAI_API_KEY": KEY})
    finally:
        srv.shutdown()
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the model endpoint {srv.url} rejected the API key (401) (the log is kept")
    ev = [json.loads(l) for l in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert [e["event"] for e in ev][-2:] == ["stop", "final"] and "rejected the API key" in ev[-2]["reason"]
    assert KEY not in res.stderr + res.stdout + (tmp_path / "r" / "log.jsonl").read_text()
