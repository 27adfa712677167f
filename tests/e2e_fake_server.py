"""A stand-in for `python -m astra_sglang.cli patch --serve ... -- <launch_server args>` in CPU tests
of the e2e driver: serves SGLang's /generate streaming format for token-id prompts on --port.

Greedy "model": token i of the answer is (sum(prompt) + 7 * i) % 50000. With FAKE_DIVERGE=k in the
environment and --ops other than none, answers differ from token k on (a patched arm that
changed numerics). FAKE_INCREMENTAL=1 streams incremental chunks instead of cumulative ones.
POST /start_profile then /stop_profile writes a Chrome trace of decode graph replays (`profile_trace`) into the
requested output_dir: the patched arm's replays are shorter and its steps longer (GPU idle).
"""
import gzip
import json
import os
import sys
import time
from pathlib import Path


def profile_trace(patched: bool, replays: int = 5) -> dict:
    """Decode steps as SGLang's profiler records them: a cudaGraphLaunch per step, its kernels carrying the
    launch's correlation id; a sampling kernel outside the graph after each replay. Unpatched: replay 60 µs
    (gemm 50 + norm 10), period 100 µs; patched: replay 56 µs (gemm 50 + astra norm 6), period 150 µs."""
    ev, period = [], (150.0 if patched else 100.0)
    norm = ("astra_rmsnorm_kernel", 6.0) if patched else ("flashinfer_rmsnorm", 10.0)
    for i in range(replays):
        t, corr = 1000.0 + i * period, 100 + i
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t - 20, "dur": 15,
                   "pid": 1, "tid": 1, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": t, "dur": 50.0, "pid": 0, "tid": 7,
                   "args": {"correlation": corr, "stream": 7, "device": 0}})
        ev.append({"ph": "X", "cat": "kernel", "name": norm[0], "ts": t + 50, "dur": norm[1], "pid": 0, "tid": 7,
                   "args": {"correlation": corr, "stream": 7, "device": 0}})
        ev.append({"ph": "X", "cat": "kernel", "name": "argmax", "ts": t + 70, "dur": 4.0, "pid": 0, "tid": 7,
                   "args": {"correlation": 900 + i, "stream": 7, "device": 0}})
    return {"traceEvents": ev}
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv):
    port = int(argv[argv.index("--port") + 1])
    ops = argv[argv.index("--ops") + 1] if "--ops" in argv else "none"
    diverge = int(os.environ.get("FAKE_DIVERGE", "-1")) if ops != "none" else -1
    incremental = os.environ.get("FAKE_INCREMENTAL") == "1"
    tok_s = float(os.environ.get("FAKE_TOKEN_S", "0.0005"))
    profile = {}
    if ops in os.environ.get("FAKE_FAIL_OPS", "").split(","):  # a patched server that dies at start-up
        print(f"fake server: failing on purpose with ops={ops}", flush=True)
        sys.exit(1)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"model_path": "fake", "ops": ops}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _ok(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/start_profile"):
                profile["dir"] = json.loads(raw)["output_dir"]
                return self._ok()
            if self.path.startswith("/stop_profile"):
                if profile.get("dir"):
                    out = Path(profile.pop("dir")) / "fake-TP-0.trace.json.gz"
                    with gzip.open(out, "wt") as f:
                        json.dump(profile_trace(ops != "none"), f)
                return self._ok()
            req = json.loads(raw)
            ids, sp = req["input_ids"], req["sampling_params"]
            n = sp["max_new_tokens"]
            base = sum(ids)
            out = []
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            time.sleep(tok_s * (1 + len(ids) / 256))  # "prefill"
            for i in range(n):
                t = (base + 7 * i + (1 if 0 <= diverge <= i else 0)) % 50000
                out.append(t)
                chunk = {"output_ids": [t] if incremental else list(out),
                         "meta_info": {"completion_tokens": i + 1, "prompt_tokens": len(ids)}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if i + 1 < n:
                    time.sleep(tok_s)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    srv.daemon_threads = True
    print(f"fake server on {port}, ops={ops}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
