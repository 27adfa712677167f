"""One SGLang model in one process, driven over stdin: SGLang's one-batch benchmark path, kept alive.

    python -m astra_sglang.e2e.step_worker '<json spec>'

The spec: {"name", "model_path", "tokenizer_path", "ops" ("none" or a list), "counter_dir",
"server_args" [launch_server flags]}. With ops other than "none" the worker patches itself with
`astra_sglang.patch.apply_astra_kernels` BEFORE SGLang loads (the one-batch path loads no
plugins). It then loads the model exactly as `sglang.benchmark.one_batch` (0.5.17+;
`sglang.bench_one_batch` before) does: its load_model (ModelRunner, memory pool, attention
backends, CUDA graphs), and serves commands, one JSON object per line on stdin:

  {"cmd": "run", "batch_size", "input_len", "output_len", "seed"}
      one latency_test_run_once equivalent: prefill, then output_len - 1 decode steps, each timed
      between device synchronizations; returns every step's latency and the greedy token ids.
  {"cmd": "profile", "batch_size", "input_len", "steps", "warmup", "dir", "prefix", "shapes"}
      torch-profiler Chrome traces of the prefill (eager, record_shapes), of `steps` decode steps
      (CUDA graphs replayed as in serving), and, with shapes, of one eager decode step (graph runner
      set aside) whose cpu ops carry the kernels' input shapes.
  {"cmd": "quit"}

Replies go to stdout as lines starting with REPLY (SGLang prints there too).
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time
import traceback

REPLY = "@@astra-step "


def reply(obj: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _one_batch_module():
    import importlib

    for name in ("sglang.benchmark.one_batch", "sglang.bench_one_batch"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise RuntimeError("neither sglang.benchmark.one_batch nor sglang.bench_one_batch imports")


class Worker:
    def __init__(self, spec: dict):
        self.spec = spec
        ops = spec.get("ops", "none")
        self.patcher = None
        if ops not in ("none", None, []):
            from astra_sglang.patch import apply_astra_kernels

            self.patcher = apply_astra_kernels(ops=None if ops == "all" else list(ops),
                                               self_check=spec.get("self_check", "first"),
                                               counter_dir=spec.get("counter_dir"))
        import argparse

        import torch

        self.torch = torch
        mod = self.mod = _one_batch_module()
        parser = argparse.ArgumentParser()
        mod.ServerArgs.add_cli_args(parser)
        argv = ["--model-path", spec["model_path"], "--tokenizer-path", spec.get("tokenizer_path") or spec["model_path"],
                *spec.get("server_args", [])]
        server_args = mod.ServerArgs.from_cli_args(parser.parse_args(argv))
        max_bs = int(spec.get("max_bs", 0) or 0)
        phase = getattr(mod, "Phase", None)
        if max_bs and phase is not None and getattr(server_args, "cuda_graph_config", None) is not None:
            server_args.cuda_graph_config[phase.DECODE].max_bs = max_bs   # as one_batch.main does
        if hasattr(mod, "_set_envs_and_config"):
            mod._set_envs_and_config(server_args)
        port_args = mod.PortArgs.init_new(server_args)
        for init in ("initialize_moe_config", "initialize_fp8_gemm_config", "initialize_fp4_gemm_config"):
            if hasattr(mod, init):
                getattr(mod, init)(server_args)
        if hasattr(mod, "configure_logger"):
            mod.configure_logger(server_args, prefix=" TP0")
        t0 = time.monotonic()
        self.runner, _tok = mod.load_model(server_args, port_args, 0, 0)
        self.load_s = time.monotonic() - t0
        self.server_args = server_args

    # ------------------------------------------------------------------ helpers
    @property
    def model_runner(self):
        return getattr(self.runner, "torch_runner", self.runner)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def _reqs(self, bs: int, input_len: int, seed: int):
        import numpy as np

        vocab = int(getattr(self.model_runner.model_config, "vocab_size", 32000))
        ids = np.random.RandomState(seed).randint(0, min(vocab, 10000), (bs, input_len), dtype=np.int32)
        return self.mod.prepare_synthetic_inputs_for_latency_test(bs, input_len, ids.tolist())

    # ------------------------------------------------------------------ commands
    def run(self, batch_size: int, input_len: int, output_len: int, seed: int = 0, **_) -> dict:
        reqs = self._reqs(batch_size, input_len, seed)
        self.runner.clear()
        self.sync()
        tic = time.perf_counter()
        next_ids, _, batch = self.runner.extend(reqs)
        self.sync()
        prefill = time.perf_counter() - tic
        steps = [next_ids.tolist()]
        lat = []
        for _i in range(output_len - 1):
            self.sync()
            tic = time.perf_counter()
            next_ids, _ = self.runner.decode(next_ids, batch)
            self.sync()
            lat.append(time.perf_counter() - tic)
            steps.append(next_ids.tolist())
        self.runner.cleanup(batch)
        tokens = [[s[i] for s in steps] for i in range(batch_size)]
        return {"prefill_s": prefill, "decode_s": lat, "tokens": tokens}

    def _profiler(self, shapes: bool):
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=shapes)

    @staticmethod
    def _save(prof, path: str) -> str:
        raw = path[:-3] if path.endswith(".gz") else path
        prof.export_chrome_trace(raw)
        if path.endswith(".gz"):
            with open(raw, "rb") as f, gzip.open(path, "wb", compresslevel=3) as g:
                shutil.copyfileobj(f, g)
            os.unlink(raw)
        return os.path.basename(path)

    def profile(self, batch_size: int, input_len: int, steps: int = 20, warmup: int = 5, dir: str = ".",
                prefix: str = "A", shapes: bool = True, seed: int = 0, **_) -> dict:
        os.makedirs(dir, exist_ok=True)
        stem = os.path.join(dir, f"{prefix}-bs{batch_size}")
        reqs = self._reqs(batch_size, input_len, seed)
        self.runner.clear()
        self.sync()
        with self._profiler(True) as p:
            next_ids, _, batch = self.runner.extend(reqs)
            self.sync()
        caps = [{"stage": "prefill", "batch_size": batch_size, "tokens": batch_size * input_len, "steps": 1,
                 "trace": self._save(p, f"{stem}-prefill.trace.json.gz"), "arm": prefix}]
        for _ in range(warmup):
            next_ids, _ = self.runner.decode(next_ids, batch)
        self.sync()
        with self._profiler(False) as p:
            for _ in range(steps):
                next_ids, _ = self.runner.decode(next_ids, batch)
            self.sync()
        dec = {"stage": "decode", "batch_size": batch_size, "tokens": batch_size, "steps": steps,
               "trace": self._save(p, f"{stem}-decode.trace.json.gz"), "arm": prefix}
        if shapes:
            mr = self.model_runner
            saved = {a: getattr(mr, a) for a in ("decode_cuda_graph_runner", "graph_runner") if hasattr(mr, a)}
            try:
                for a in saved:
                    setattr(mr, a, None)
                with self._profiler(True) as p:
                    next_ids, _ = self.runner.decode(next_ids, batch)
                    self.sync()
                dec["shapes_trace"] = self._save(p, f"{stem}-decode-eager.trace.json.gz")
            except Exception as e:  # noqa: BLE001 - shapes are optional; the graph trace stands
                dec["extra"] = {"shapes_error": f"{type(e).__name__}: {e}"}
            finally:
                for a, v in saved.items():
                    setattr(mr, a, v)
        self.runner.cleanup(batch)
        return {"captures": caps + [dec]}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        w = Worker(spec)
    except BaseException as e:  # noqa: BLE001 - tell the driver, then die
        reply({"event": "fatal", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]})
        raise SystemExit(1)
    import torch

    reply({"event": "ready", "load_s": w.load_s, "gpu": torch.cuda.get_device_name(),
           "max_total_num_tokens": getattr(w.model_runner, "max_total_num_tokens", None),
           "patched": spec.get("ops", "none")})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("cmd") == "quit":
                reply({"event": "bye"})
                break
            fn = {"run": w.run, "profile": w.profile}[cmd["cmd"]]
            t0 = time.monotonic()
            out = fn(**{k: v for k, v in cmd.items() if k != "cmd"})
            reply({"event": "done", "cmd": cmd["cmd"], "seconds": time.monotonic() - t0, **out})
        except Exception as e:  # noqa: BLE001 - one failed command is reported, the worker lives on
            reply({"event": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]})
    sys.stdout.flush()
    os._exit(0)   # skip SGLang/NCCL teardown


if __name__ == "__main__":
    main()
