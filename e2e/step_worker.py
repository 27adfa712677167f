"""One SGLang model in one process, driven over stdin: SGLang's one-batch benchmark path, kept alive.

    python -m astra_sglang.e2e.step_worker '<json spec>'

The spec: {"name", "model_path", "tokenizer_path", "ops" ("none" or a list), "counter_dir",
"server_args" [launch_server flags], "gpu_pad_us", "tp", "candidates" {op: .cu}}. With "tp" > 1 this process is rank 0 on
GPU 0: it spawns ranks 1..tp-1 (one process per GPU, as the one-batch benchmark does), forwards every
command to them over a pipe and runs it itself; the collectives of each forward keep the ranks in step.
Each rank patches itself and writes its own counters, under the process title
`sglang::astra_step_TP<r>` that names its rank there. With ops other than "none" the worker patches itself with
`astra_sglang.patch.apply_astra_kernels` BEFORE SGLang loads (the one-batch path loads no
plugins). It then loads the model exactly as `sglang.benchmark.one_batch` (0.5.17+;
`sglang.bench_one_batch` before) does: its load_model (ModelRunner, memory pool, attention
backends, CUDA graphs), and serves commands, one JSON object per line on stdin:

  {"cmd": "run", "batch_size", "input_len", "output_len", "seed"}
      one latency_test_run_once equivalent: prefill, then output_len - 1 decode steps back to back
      (no synchronization between steps, as a server runs them); each step's GPU time comes from
      CUDA events around its graph replay (GpuTimer). Returns the prefill latency, every step's
      GPU time, the decode loop's wall time and the greedy token ids.
  {"cmd": "profile", "batch_size", "input_len", "steps", "warmup", "dir", "prefix", "shapes"}
      torch-profiler Chrome traces of the prefill (eager, record_shapes), of `steps` decode steps
      (CUDA graphs replayed as in serving), and, with shapes, of one eager decode step (graph runner
      set aside) whose cpu ops carry the kernels' input shapes.
  {"cmd": "quit"}

Replies go to stdout as lines starting with REPLY (SGLang prints there too).
"""
from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

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


class GpuTimer:
    """GPU time of each decode step: CUDA events around the decode graph's replay.

    The host-timed step (2026-11-23) carried ~0.5 ms of host work (batch prep, launch, sampling,
    the synchronizing read of the ids) that differed persistently between processes; the graph
    replay's GPU time does not see it. Before each start event a spin kernel of `pad_us` is
    queued, so that even when the GPU queue has run dry the start event fires only after the host
    has finished launching the graph: launch latency stays outside the interval.

    Hooked on the decode graph runner's backend.replay (SGLang 0.5.17 and 0.5.23), else on
    torch.cuda.CUDAGraph.replay; a step with no replay (eager decode) is timed whole.

    `align` (tensor parallel: `rank_aligner`) is queued before the pad on every rank: the ranks' GPUs leave it
    together, so each rank's timed replay starts after the same pad, and a rank's first collective does not wait
    for another rank's late launch inside the timed interval."""

    def __init__(self, torch, pad_us: float = 100.0, align: Optional[Callable[[], None]] = None):
        self.torch = torch
        self.cur: Optional[List[Tuple[object, object]]] = None
        self.depth = 0
        self.hook = "none"
        self.align = align
        self.pad_cycles = int(pad_us * self.cycles_per_us()) if pad_us > 0 else 0

    def cycles_per_us(self) -> float:
        t = self.torch
        t.cuda._sleep(1000)
        s, e = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        s.record()
        t.cuda._sleep(2_000_000)
        e.record()
        e.synchronize()
        return 2_000_000 / max(s.elapsed_time(e) * 1e3, 1e-3)

    def pad(self) -> None:
        if self.align is not None:
            self.align()
        if self.pad_cycles:
            self.torch.cuda._sleep(self.pad_cycles)

    def event(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def wrap(self, fn):
        timer = self

        @functools.wraps(fn)
        def timed(*a, **k):
            if timer.cur is None or timer.depth:
                return fn(*a, **k)
            timer.depth += 1
            try:
                timer.pad()
                s = timer.event()
                out = fn(*a, **k)
                timer.cur.append((s, timer.event()))
            finally:
                timer.depth -= 1
            return out
        timed.__astra_timer__ = True
        return timed

    def install(self, model_runner) -> str:
        gr = None
        for a in ("decode_cuda_graph_runner", "cuda_graph_runner", "graph_runner"):
            gr = getattr(model_runner, a, None)
            if gr is not None:
                break
        be = getattr(gr, "backend", None)
        if be is not None and callable(getattr(be, "replay", None)):
            be.replay = self.wrap(be.replay)      # instance attribute: this runner only
            self.hook = f"{type(be).__name__}.replay"
        else:
            g = self.torch.cuda.CUDAGraph
            if not getattr(g.replay, "__astra_timer__", False):
                g.replay = self.wrap(g.replay)
            self.hook = "torch.cuda.CUDAGraph.replay"
        return self.hook

    def step(self, fn, whole: bool):
        """Run one decode step; returns (its result, [(start, end) events], timed whole?)."""
        self.cur = []
        try:
            if whole:
                self.pad()
            s = self.event()
            out = fn()
            e = self.event()
        finally:
            evs, self.cur = self.cur, None
        return out, (evs or [(s, e)]), not evs

    @staticmethod
    def seconds(evs) -> float:
        return sum(s.elapsed_time(e) for s, e in evs) / 1e3


ALIGN_ENV = "ASTRA_STEP_ALIGN_RANKS"  # 0 / false / off / no: time TP ranks unaligned (as before 2026-12-01)


def rank_aligner(torch, tp: int, group_of=None) -> Tuple[Optional[Callable[[], None]], str]:
    """(align, what it is) for GpuTimer at TP > 1: a one-element all-reduce over SGLang's TP group (its NCCL device
    group), queued on the current stream before each timed replay. Why: a TP-2 MoE step at batch 1 read 913 µs a step
    of "tp communication" in one process and 199 in the other (2× H200, results/2026-12-01-h200x2/session35/ §2): the
    ranks launch their replays at different host times and the first collective waits for the late one inside the
    timed interval (an A/B ±13% wide). (None, why not) at TP 1, when switched off, or where the group is not found."""
    from astra_sglang.patch.adapters import env_switch

    if tp <= 1:
        return None, "TP 1"
    if not env_switch(ALIGN_ENV, True):
        return None, f"off ({ALIGN_ENV})"
    if group_of is None:
        def group_of():
            from sglang.srt.distributed.parallel_state import get_tp_group

            return get_tp_group().device_group
    try:
        group = group_of()
    except Exception as e:  # noqa: BLE001 - time unaligned rather than fail the run
        return None, f"no TP group ({type(e).__name__}: {e})"
    if group is None:
        return None, "no TP group (SGLang's device group is None)"
    buf = torch.zeros(1, device="cuda")

    def align() -> None:
        torch.distributed.all_reduce(buf, group=group)

    return align, "an all-reduce over the TP group before each timed replay"


def ops_to_patch(ops) -> List[str]:
    """"all" means what `patch --serve --ops all` patches: every patchable op except those whose adapter
    keeps them off by default (DEFAULT_OFF: slower in context, or not yet measured there); ["all", OP] adds OP."""
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.config import default_ops, parse_ops

    known = patchable_ops()
    return parse_ops(ops if isinstance(ops, str) else ",".join(ops), known, default_ops(known))  # "all,OP" too


def publish_runtime(mod, server_args, rank: int) -> None:
    """What one_batch does in a rank before load_model. 0.5.23 publishes the process's runtime context (its device and
    ranks, which load_model reads through get_device()) and sets the process-global kernel configs in one call;
    0.5.17 has no context and only the per-config initializers."""
    if hasattr(mod, "publish"):
        ranks = mod.SpawnRanks(world_rank=mod.spawn_world_rank(server_args, tp_rank=rank, pp_rank=0), gpu_id=rank)
        mod.publish(server_args, role="scheduler", ranks=ranks)
    if hasattr(mod, "_init_process_global_configs"):
        mod._init_process_global_configs()
        return
    for init in ("initialize_moe_config", "initialize_fp8_gemm_config", "initialize_fp4_gemm_config"):
        if hasattr(mod, init):
            getattr(mod, init)(server_args)


class Worker:
    def __init__(self, spec: dict, rank: int = 0):
        self.spec = spec
        self.rank = rank
        ops = spec.get("ops", "none")
        self.patcher = None
        if ops not in ("none", None, []):
            from astra_sglang.patch import apply_astra_kernels

            self.patcher = apply_astra_kernels(ops=ops_to_patch(ops), candidates=spec.get("candidates") or None,
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
        # 0.5.23 resolves its args once (the decode graph sizes come from --cuda-graph-max-bs-decode); 0.5.17's
        # one_batch.main sets the decode max_bs on the parsed config
        resolves = hasattr(server_args, "resolve_once")
        graphs = getattr(server_args, "cuda_graph_config", None)
        if max_bs and phase is not None and graphs is not None and not resolves:
            graphs[phase.DECODE].max_bs = max_bs
        if resolves:
            server_args.resolve_once()
        if hasattr(mod, "_set_envs_and_config"):
            mod._set_envs_and_config(server_args)
        port_args = mod.PortArgs.init_new(server_args)
        publish_runtime(mod, server_args, rank)
        if hasattr(mod, "configure_logger"):
            mod.configure_logger(server_args, prefix=f" TP{rank}")
        t0 = time.monotonic()
        self.runner, _tok = mod.load_model(server_args, port_args, rank, rank)   # gpu_id = tp_rank
        self.load_s = time.monotonic() - t0
        self.server_args = server_args
        align, self.align_note = rank_aligner(torch, int(spec.get("tp", 1) or 1))
        self.timer = GpuTimer(torch, float(spec.get("gpu_pad_us", 100.0)), align)
        self.timer.install(self.model_runner)

    # ------------------------------------------------------------------ helpers
    @property
    def gpu_name(self) -> str:
        return self.torch.cuda.get_device_name(self.rank)

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
        ids = [next_ids.clone()]
        steps = []
        whole = False
        tic = time.perf_counter()
        for i in range(output_len - 1):
            # no sync between steps: the GPU stays busy as in serving, and the ids are read at the end
            (next_ids, _), evs, timed_whole = self.timer.step(lambda: self.runner.decode(next_ids, batch), whole)
            whole = whole or (i == 0 and timed_whole)    # no graph replay: time whole steps from now on
            steps.append(evs)
            ids.append(next_ids.clone())
        self.sync()
        wall = time.perf_counter() - tic
        gpu = [self.timer.seconds(e) for e in steps]
        rows = self.torch.stack([x.reshape(-1)[:batch_size] for x in ids]).tolist()
        self.runner.cleanup(batch)
        tokens = [[s[i] for s in rows] for i in range(batch_size)]
        return {"prefill_s": prefill, "gpu_step_s": gpu, "decode_wall_s": wall, "decode_steps": len(gpu),
                "timer": "whole step" if whole else self.timer.hook,
                "replays_per_step": max((len(e) for e in steps), default=0), "tokens": tokens}

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

    def warm_prefill(self, batch_size: int, input_len: int, seed: int) -> None:
        """One prefill of this size, unprofiled, its KV slots freed after. A patched op's first call of a shape class
        runs its self-check (patch/ops.py: SGLang's own kernels beside astra's, on copies): without this the profiled
        prefill was that check's (one call of SGLang's q/k norm, rope and KV store beside 36 of qknorm_rope_store in
        Qwen3-8B's, 2026-12-01), not serving's."""
        self.runner.clear()
        self.sync()
        _, _, batch = self.runner.extend(self._reqs(batch_size, input_len, seed))
        self.sync()
        self.runner.cleanup(batch)
        self.runner.clear()
        self.sync()

    def profile(self, batch_size: int, input_len: int, steps: int = 20, warmup: int = 5, dir: str = ".",
                prefix: str = "A", shapes: bool = True, seed: int = 0, **_) -> dict:
        os.makedirs(dir, exist_ok=True)
        stem = os.path.join(dir, f"{prefix}-bs{batch_size}")
        self.warm_prefill(batch_size, input_len, seed)
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

    def execute(self, cmd: dict) -> dict:
        fn = {"run": self.run, "profile": self.profile}[cmd["cmd"]]
        args = {k: v for k, v in cmd.items() if k != "cmd"}
        if self.rank and cmd["cmd"] == "profile":
            args["prefix"] = f"{args.get('prefix', 'A')}-TP{self.rank}"   # its own trace files
        return fn(**args)


# ---------------------------------------------------------------------- tensor parallel ranks
def _set_title(rank: int) -> None:
    """Name the rank in the process title, as SGLang's schedulers do (`sglang::scheduler_TP1`): the
    patch's counters read the rank from there."""
    try:
        import setproctitle

        setproctitle.setproctitle(f"sglang::astra_step_TP{rank}")
    except ImportError:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """A rank > 0 must not outlive rank 0 (which the driver may kill): PR_SET_PDEATHSIG."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def _rank_main(spec: dict, rank: int, conn) -> None:
    """Rank `rank` > 0: the same Worker, fed rank 0's commands over `conn`; replies go back on it."""
    _die_with_parent()
    _set_title(rank)
    try:
        w = Worker(spec, rank)
    except BaseException as e:  # noqa: BLE001
        conn.send({"event": "fatal", "rank": rank, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-4000:]})
        os._exit(1)
    conn.send({"event": "ready", "rank": rank, "load_s": w.load_s})
    while True:
        cmd = conn.recv()
        if cmd.get("cmd") == "quit":
            break
        try:
            conn.send({"event": "done", "rank": rank, **w.execute(cmd)})
        except Exception as e:  # noqa: BLE001
            conn.send({"event": "error", "rank": rank, "error": f"{type(e).__name__}: {e}"})
    os._exit(0)


class Ranks:
    """Ranks 1..tp-1 of a tensor-parallel worker, as child processes on GPUs 1..tp-1."""

    def __init__(self, spec: dict, tp: int):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")   # no CUDA state is inherited
        self.conns = []
        for r in range(1, tp):
            parent, child = ctx.Pipe()
            ctx.Process(target=_rank_main, args=(spec, r, child), daemon=True).start()
            self.conns.append((r, parent))

    def collect(self, timeout: float = 3600.0) -> Dict[int, dict]:
        out = {}
        for r, conn in self.conns:
            if not conn.poll(timeout):
                raise RuntimeError(f"TP rank {r} sent nothing for {timeout:.0f}s")
            msg = conn.recv()
            if msg.get("event") in ("fatal", "error"):
                raise RuntimeError(f"TP rank {r}: {msg.get('error')}")
            out[r] = msg
        return out

    def send(self, cmd: dict) -> None:
        for _, conn in self.conns:
            conn.send(cmd)


def _rank_summary(cmd: str, out0: dict, replies: Dict[int, dict]) -> dict:
    """What rank 0's reply carries of the other ranks: their step times, whether they sampled the
    same ids (every rank samples the full vocabulary after the all-gather), their trace files."""
    if cmd == "run":
        return {"gpu_step_s_by_rank": {str(r): m.get("gpu_step_s") for r, m in replies.items()},
                "tokens_match_by_rank": {str(r): m.get("tokens") == out0.get("tokens") for r, m in replies.items()}}
    return {"rank_captures": [c for m in replies.values() for c in m.get("captures", [])]}


def main() -> None:
    spec = json.loads(sys.argv[1])
    tp = int(spec.get("tp", 1) or 1)
    ranks = None
    try:
        if tp > 1:
            # every rank joins one NCCL group: they must agree on its port
            spec = {**spec, "server_args": [*spec.get("server_args", []), "--nccl-port", str(_free_port())]}
            _set_title(0)
            ranks = Ranks(spec, tp)
        w = Worker(spec)
        if ranks:
            ranks.collect(timeout=float(spec.get("rank_timeout", 1800)))
    except BaseException as e:  # noqa: BLE001 - tell the driver, then die
        reply({"event": "fatal", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]})
        sys.stdout.flush()
        os._exit(1)
    reply({"event": "ready", "load_s": w.load_s, "gpu": w.gpu_name, "timer": w.timer.hook,
           "pad_cycles": w.timer.pad_cycles, "tp": tp, "ranks_aligned": w.align_note,
           "max_total_num_tokens": getattr(w.model_runner, "max_total_num_tokens", None),
           "patched": spec.get("ops", "none")})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("cmd") == "quit":
                if ranks:
                    ranks.send(cmd)
                reply({"event": "bye"})
                break
            if cmd.get("cmd") not in ("run", "profile"):
                raise KeyError(cmd.get("cmd"))
            t0 = time.monotonic()
            if ranks:
                ranks.send(cmd)
            out = w.execute(cmd)
            if ranks:
                out.update(_rank_summary(cmd["cmd"], out, ranks.collect()))
            reply({"event": "done", "cmd": cmd["cmd"], "seconds": time.monotonic() - t0, **out})
        except Exception as e:  # noqa: BLE001 - one failed command is reported, the worker lives on
            reply({"event": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]})
    sys.stdout.flush()
    os._exit(0)   # skip SGLang/NCCL teardown


if __name__ == "__main__":
    main()
