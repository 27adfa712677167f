"""A stand-in for `python -m astra_sglang.cli patch --serve ... -- <launch_server args>` in CPU tests
of the e2e driver: serves SGLang's /generate streaming format for token-id prompts on --port.

Greedy "model": token i of the answer is (sum(prompt) + 7 * i) % 50000. With FAKE_DIVERGE=k in the
environment and --ops other than none, answers differ from token k on (a patched arm that
changed numerics). FAKE_INCREMENTAL=1 streams incremental chunks instead of cumulative ones.
"""
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv):
    port = int(argv[argv.index("--port") + 1])
    ops = argv[argv.index("--ops") + 1] if "--ops" in argv else "none"
    diverge = int(os.environ.get("FAKE_DIVERGE", "-1")) if ops != "none" else -1
    incremental = os.environ.get("FAKE_INCREMENTAL") == "1"
    tok_s = float(os.environ.get("FAKE_TOKEN_S", "0.0005"))

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

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
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
