"""A streaming client for SGLang's native `/generate` endpoint with token-id prompts.

Standard library only (http.client + threads), so it runs beside any SGLang install and in CI
against a stand-in HTTP server. Closed-loop load: `concurrency` workers each send their next
prompt as soon as the previous one finished.

With `--skip-tokenizer-init` SGLang streams `data: {"output_ids": [...], "meta_info": {...}}`
lines, cumulative by default and incremental with `--incremental-streaming-output`; both are
handled.
"""
from __future__ import annotations

import http.client
import json
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from .stats import RequestResult, Run


@dataclass
class Workload:
    name: str
    num_prompts: int
    input_len: int
    output_len: int
    concurrency: int
    seed: int = 0

    def describe(self) -> str:
        return (f"{self.name}: {self.num_prompts} prompts, {self.input_len} input / {self.output_len} output "
                f"tokens, concurrency {self.concurrency}")


# Two workloads: many tokens generated per prompt token, and the reverse.
WORKLOADS = {
    "decode": Workload("decode", num_prompts=64, input_len=128, output_len=256, concurrency=32, seed=1),
    "prefill": Workload("prefill", num_prompts=32, input_len=3072, output_len=8, concurrency=8, seed=2),
}


def parse_workload(text: str) -> Workload:
    """`decode`, `prefill`, or `name:prompts:in:out:concurrency` (e.g. `long:16:8192:64:4`)."""
    if text in WORKLOADS:
        return WORKLOADS[text]
    parts = text.split(":")
    if len(parts) != 5:
        raise ValueError(f"workload {text!r}: give one of {', '.join(WORKLOADS)} or name:prompts:in:out:concurrency")
    name, n, i, o, c = parts
    return Workload(name, int(n), int(i), int(o), int(c), seed=sum(map(ord, name)))


def make_prompts(w: Workload, vocab_size: int, reserved: int = 1000) -> List[List[int]]:
    """Deterministic random token-id prompts (ids in [reserved, vocab_size)), same for both arms."""
    rng = random.Random(w.seed)
    hi = max(vocab_size - 1, reserved + 1)
    return [[rng.randrange(reserved, hi) for _ in range(w.input_len)] for _ in range(w.num_prompts)]


def _post(host: str, port: int, path: str, body: dict, timeout: float) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    data = json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    return conn.getresponse()


def generate_stream(host: str, port: int, input_ids: Sequence[int], max_new_tokens: int, prompt_id: int = 0,
                    timeout: float = 600.0, extra_sampling: Optional[dict] = None) -> RequestResult:
    """One greedy streamed request; every chunk's arrival time and token count recorded."""
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    sampling.update(extra_sampling or {})
    body = {"input_ids": list(input_ids), "sampling_params": sampling, "stream": True}
    t_start = time.perf_counter()
    times: List[float] = []
    counts: List[int] = []
    out: List[int] = []
    err = None
    try:
        resp = _post(host, port, "/generate", body, timeout)
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.perf_counter()
            msg = json.loads(payload)
            if "error" in msg:
                raise RuntimeError(f"server error: {str(msg['error'])[:300]}")
            ids = msg.get("output_ids") or []
            meta = msg.get("meta_info") or {}
            n = meta.get("completion_tokens")
            if n is None:
                n = len(out) + len(ids)
            # cumulative (default) when the chunk holds all tokens so far, else incremental
            if len(ids) == n and (not out or ids[:len(out)] == out):
                out = list(ids)
            else:
                out = out + list(ids)
            if counts and n <= counts[-1]:
                continue  # a chunk with no new tokens (e.g. the finish record) is not an arrival
            times.append(now)
            counts.append(n)
        resp.close()
    except Exception as e:  # a failed request is data, not a crash of the whole run
        err = f"{type(e).__name__}: {e}"
    t_end = time.perf_counter()
    return RequestResult(prompt_id=prompt_id, t_start=t_start, t_first=times[0] if times else None, t_end=t_end,
                         chunk_times=times, chunk_tokens=counts, output_ids=out, prompt_len=len(input_ids),
                         error=err)


def run_workload(host: str, port: int, w: Workload, prompts: Sequence[Sequence[int]], arm: str, round_: int,
                 timeout: float = 600.0, send: Callable = generate_stream) -> Run:
    """Closed loop: `w.concurrency` workers drain the prompt queue; returns one Run."""
    todo: "queue.Queue[int]" = queue.Queue()
    for i in range(len(prompts)):
        todo.put(i)
    results: List[RequestResult] = []
    lock = threading.Lock()

    def worker():
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            r = send(host, port, prompts[i], w.output_len, prompt_id=i, timeout=timeout)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(w.concurrency, len(prompts))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t1 = time.perf_counter()
    results.sort(key=lambda r: r.prompt_id)
    return Run(w.name, arm, round_, results, t0, t1)


def get_json(host: str, port: int, path: str, timeout: float = 5.0) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("GET", path)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {resp.status}")
    return json.loads(data) if data else {}


def wait_ready(host: str, port: int, timeout: float, alive: Callable[[], bool] = lambda: True,
               probe_ids: Sequence[int] = (1000, 1001, 1002, 1003)) -> float:
    """Until the server answers a 1-token generate; seconds waited. Raises on timeout / death."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        if not alive():
            raise RuntimeError(f"server on port {port} exited before it was ready ({last})")
        try:
            get_json(host, port, "/get_model_info", timeout=5)
            r = generate_stream(host, port, probe_ids, 1, timeout=60)
            if r.ok:
                return time.monotonic() - t0
            last = r.error or "empty answer"
        except Exception as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(1.0)
    raise RuntimeError(f"server on port {port} not ready after {timeout:.0f}s ({last})")
