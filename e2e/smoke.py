"""Smoke test: plain `python -m sglang.launch_server` (no astra code in it) with dummy weights and
token-id prompts answers a greedy request. Prints the output ids and timings; exit 0 on success.

    python e2e/smoke.py [--model-path e2e/configs/llama-small] [--port 30200] [-- extra server args]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=str(HERE / "configs" / "llama-small"), type=lambda p: str(Path(p).resolve()))
    ap.add_argument("--port", type=int, default=30200)
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--log", default="smoke-server.log")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    from astra_sglang.e2e.client import generate_stream, wait_ready

    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", a.model_path, "--load-format", "dummy",
           "--skip-tokenizer-init", "--attention-backend", "triton", "--sampling-backend", "pytorch",
           "--max-total-tokens", "16384", "--mem-fraction-static", "0.5", "--cuda-graph-max-bs-decode", "8",
           "--random-seed", "0", "--host", "127.0.0.1", "--port", str(a.port), *a.extra]
    print("$ " + " ".join(cmd), flush=True)
    log = open(a.log, "w")
    t0 = time.monotonic()
    # cwd outside the checkout: the astra-sglang plugin entry point (if installed) must import the
    # installed package, not the checkout's astra_sglang/ (which lacks the .patch mapping).
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=str(Path(a.log).resolve().parent))
    rc = 1
    try:
        wait_ready("127.0.0.1", a.port, a.timeout, lambda: proc.poll() is None)
        print(f"server ready after {time.monotonic() - t0:.1f}s", flush=True)
        prompt = list(range(1000, 1032))
        r = generate_stream("127.0.0.1", a.port, prompt, 16)
        print(json.dumps({"prompt_ids": prompt, "output_ids": r.output_ids, "ttft_ms": round(r.ttft * 1e3, 2)
                          if r.t_first else None, "latency_ms": round(r.latency * 1e3, 2), "error": r.error}))
        r2 = generate_stream("127.0.0.1", a.port, prompt, 16)
        same = r2.output_ids == r.output_ids
        print(f"repeat request identical (greedy): {same}")
        rc = 0 if r.ok and len(r.output_ids) == 16 else 1
    except Exception as e:  # noqa: BLE001
        print(f"SMOKE FAILED: {type(e).__name__}: {e}", flush=True)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except Exception:  # noqa: BLE001
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
        if rc:
            print("--- server log (tail) ---")
            print("\n".join(Path(a.log).read_text(errors="replace").splitlines()[-60:]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
