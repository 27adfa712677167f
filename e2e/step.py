"""`astra-sglang e2e --step`: SGLang's one-batch decode step, baseline vs patched, ABBA rounds.

Each arm runs in --procs worker processes (e2e/step_worker.py), each loading the model the way
`sglang.benchmark.one_batch` does. The processes of a wave (all of them, or --procs-at-once per
arm when the GPU holds fewer) are loaded side by side (the KV pool of each capped by
--max-total-tokens) and driven one at a time in ABBA order over processes and rounds
(e2e/step_stats.py: process_schedule), so rounds interleave without reloading. The patched arm
patches itself (the one-batch path loads no plugins). Per round, process and batch size: one
prefill + (output_len - 1) decode steps back to back; each step's GPU time comes from CUDA events
around its graph replay. Statistics treat the process as a random effect (step_stats). After
every timed round, the first process of the base arm and of each patched arm are profiled at
each batch size; the profile predicts the Δ (e2e/profile.py).

Outputs in --out: results.json (every run: GPU step times, greedy ids), summary.json, report.md,
step.png, profile/ (traces, profile.md/json/png, shapes.json), worker-<proc>.log, counters.json.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from astra_sglang.e2e.attention import named_in
from astra_sglang.errors import AstraError
from astra_sglang.files import write_whole
from astra_sglang.patch.counters import fresh_counter_dir

from .step_worker import REPLY

WORKER_MODULE = "astra_sglang.e2e.step_worker"


def _say(msg: str) -> None:
    print(f"  · {msg}", file=sys.stderr, flush=True)


class WorkerProc:
    """A step worker: JSON commands on its stdin, replies on its stdout, everything else to a log."""

    def __init__(self, name: str, spec: dict, python: str, module: str, log: Path, env: dict, cwd: Path):
        self.name, self.log_path = name, log
        launcher = [python, module] if module.endswith(".py") else [python, "-m", module]
        self.log = open(log, "w")
        self.replies: "queue.Queue[dict]" = queue.Queue()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(launcher + [json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, env=env, cwd=str(cwd),
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                try:
                    self.replies.put(json.loads(line[len(REPLY):]))
                    continue
                except ValueError:
                    pass
            self.log.write(line)
            self.log.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_reply(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while True:
            try:
                return self.replies.get(timeout=1.0)
            except queue.Empty:
                if not self.alive() and self.replies.empty():
                    time.sleep(0.5)   # let the reader drain
                    if self.replies.empty():
                        raise AstraError(f"worker {self.name} exited ({self.proc.returncode})\n{self.tail()}")
                if time.monotonic() > end:
                    raise AstraError(f"worker {self.name}: no reply in {timeout:.0f}s\n{self.tail()}")

    def ready(self, timeout: float) -> dict:
        r = self.wait_reply(timeout)
        if r.get("event") != "ready":
            raise AstraError(f"worker {self.name} failed to start: {r.get('error')}\n{r.get('traceback', '')}")
        return r

    def call(self, cmd: dict, timeout: float) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        r = self.wait_reply(timeout)
        if r.get("event") != "done":
            raise AstraError(f"worker {self.name}: {cmd['cmd']} failed: {r.get('error')}\n{r.get('traceback', '')}")
        return r

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        if self.alive():
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                break
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        self._reader.join(5)
        self.log.close()
        return self.proc.returncode

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def worker_server_args(max_bs: int, batch_sizes: Sequence[int], max_total_tokens: int, mem_fraction: float,
                       port: int, prefill_graph: bool, extra: Sequence[str]) -> List[str]:
    """launch_server flags of every arm (only the port differs)."""
    # the attention backend comes in `extra` (e2e/attention.py)
    args = ["--load-format", "dummy", "--sampling-backend", "pytorch",
            # the per-phase spellings: 0.5.17 also took --cuda-graph-max-bs / --cuda-graph-bs, 0.5.23 refuses them
            "--cuda-graph-max-bs-decode", str(max_bs),
            "--cuda-graph-bs-decode", *[str(b) for b in sorted(set(batch_sizes))],
            "--max-total-tokens", str(max_total_tokens), "--mem-fraction-static", str(mem_fraction),
            "--random-seed", "0", "--port", str(port), "--log-level", "warning"]
    if not prefill_graph:
        args.append("--disable-prefill-cuda-graph")   # prefill runs eager (start-up time); decode graphs stay
    return args + list(extra)


def kv_tokens_needed(batch_sizes: Sequence[int], input_len: int, output_len: int, profile_steps: int) -> int:
    per_req = input_len + max(output_len, 5 + profile_steps + 2) + 8
    need = max(batch_sizes) * per_req
    return int(-(-need * 1.1 // 1024) * 1024)


def parse_sizes(text: str, what: str) -> List[int]:
    try:
        out = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        raise AstraError(f"{what} {text!r}: give comma-separated positive integers (e.g. 1,8,32,64)") from None
    if not out or any(x < 1 for x in out):
        raise AstraError(f"{what} {text!r}: give comma-separated positive integers (e.g. 1,8,32,64)")
    return out


class Session:
    """The worker processes of one wave, started together and always stopped.
    procs: process name ("A-p1") -> (arm, ops)."""

    def __init__(self, procs: Dict[str, Tuple[str, object]], model_dir: Path, tokenizer: str, out: Path, python: str,
                 module: str, server_args: Callable[[int], List[str]], max_bs: int, self_check: str = "first",
                 gpu_pad_us: float = 100.0, port_base: int = 0, tp: int = 1,
                 candidates: Optional[Dict[str, Path]] = None, arm_env: Optional[Dict[str, Dict[str, str]]] = None):
        self.out = out
        self.arm_of = {name: arm for name, (arm, _) in procs.items()}
        self.workers: Dict[str, WorkerProc] = {}
        self.ready: Dict[str, dict] = {}
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        cwd = out / "run"       # outside any source checkout (see e2e/README.md)
        cwd.mkdir(parents=True, exist_ok=True)
        for i, (name, (arm, ops)) in enumerate(procs.items()):
            spec = {"name": name, "model_path": str(model_dir), "tokenizer_path": tokenizer, "ops": ops,
                    "counter_dir": str(out / f"counters-{arm}"), "server_args": server_args(port_base + i),
                    "max_bs": max_bs, "self_check": self_check, "gpu_pad_us": gpu_pad_us, "tp": tp,
                    # arm B's alone: with --base-ops arm A is patched too, and serves the shipped kernels
                    "candidates": {o: str(p) for o, p in (candidates or {}).items()} if arm == "B" else {}}
            _say(f"{name} (ops {ops if isinstance(ops, str) else ','.join(ops)}): starting worker")
            self.workers[name] = WorkerProc(name, spec, python, module, out / f"worker-{name}.log",
                                            {**env, **env_of_arm(arm_env, arm)}, cwd)

    def wait_ready(self, timeout: float) -> None:
        for name, w in self.workers.items():
            self.ready[name] = w.ready(timeout)
            _say(f"{name} ready after {time.monotonic() - w.t0:.0f}s "
                 f"(model load {self.ready[name].get('load_s', 0):.0f}s, {self.ready[name].get('gpu', '')}, "
                 f"step timer on {self.ready[name].get('timer', '?')})")

    def stop(self) -> Dict[str, Optional[int]]:
        return {name: w.stop() for name, w in self.workers.items()}


def proc_name(arm: str, i: int) -> str:
    return f"{arm}-p{i}"


def profile_arms(session: Session, procs: Sequence[str], batch_sizes: Sequence[int], input_len: int, steps: int,
                 pdir: Path, cfg: dict, meta: dict, timeout: float) -> dict:
    """Profile each named process at each batch size (traces named by its arm); write
    pdir/profile-meta.json after every capture (a run cut off mid-way keeps the captures it made, and
    `analyze_only` reports them); returns it."""
    from .profile import META

    pdir.mkdir(parents=True, exist_ok=True)
    caps: List[dict] = []
    pm = {**meta, "config": cfg, "captures": caps}
    for name in procs:
        arm = session.arm_of[name]
        for bs in batch_sizes:
            r = session.workers[name].call({"cmd": "profile", "batch_size": bs, "input_len": input_len, "steps": steps,
                                            "warmup": 5, "dir": str(pdir), "prefix": arm, "shapes": True}, timeout)
            caps += r["captures"] + r.get("rank_captures", [])   # tensor parallel: arm "A-TP1" is rank 1's
            write_whole(pdir / META, json.dumps(pm, indent=1))   # whole or absent, never half-written
            _say(f"profiled {name} batch {bs} ({r['seconds']:.1f}s)")
    return pm


def predicted_from_profile(analysis: dict, base: str, others: Sequence[str],
                           patched: Optional[Dict[str, object]] = None,
                           patched_base: bool = False) -> Dict[Tuple[str, int], dict]:
    """(arm, batch) -> the profile's saved µs per decode step: from bench speedups on the base's
    profile, and in-graph (base kernel time − the arm's, both profiled). Only arms that were
    profiled (the patched ones) get one; an unpatched A2 does not. patched: arm -> its ops ("all" or
    a list): only those ops' savings count. patched_base: arm A runs astra's ops too, so a bench speedup (over
    SGLang's kernel) does not apply to its profile: no bench prediction (None, shown as —), the in-graph ones stand
    (moe_align alone at batch 64: 40 µs measured, 38 in-graph, 39 with consumers; H200, 2026-11-29)."""
    from .profile import Q_COPY, q_out_ops
    from .step_worker import ops_to_patch

    dec = {(c["arm"], c["batch_size"]): c for c in analysis["captures"] if c["stage"] == "decode"}
    # what each arm patched: "all" is the default ops, as the worker patches them (a DEFAULT_OFF op's
    # bench speedup is no saving)
    arm_ops = {o: set(ops_to_patch((patched or {}).get(o, "all"))) for o in others}
    out = {}
    for (arm, bs), c in dec.items():
        if arm != base:
            continue
        for o in others:
            if not any(a == o for a, _ in dec):
                continue
            # a patched fused op stands for the members it replaces (their kernels in the base profile)
            fused = _widest_fused([f for f in c.get("fused", ()) if f["op"] in arm_ops[o]])
            replaced = {m for f in fused for m in f["replaces"]}
            mine = [r for r in c["ops"] if r["covered"] and r["op"] in arm_ops[o] and r["op"] not in replaced] + fused
            measured = [r for r in mine if r["speedup"]]
            # None (shown as —) when no patched op has a bench speedup on these shapes
            p = {"saved_us": sum(r["saved_us"] for r in measured) if measured and not patched_base else None,
                 "unmeasured_ops": [] if patched_base else sorted({r["op"] for r in mine if not r["speedup"]}),
                 "base_kernel_us": c["kernel_us_per_step"]}
            oc = dec.get((o, bs))
            if oc is not None:
                # the covered ops' own kernel time, base minus patched: GEMM time differs between
                # processes by ~1% (profiled), which would swamp a whole-step difference
                theirs = {r["op"]: r["us_per_step"] for r in oc["ops"] if r["covered"]}
                p["in_context_saved_us"] = sum(r["us_per_step"] - theirs.get(r["op"], r["us_per_step"])
                                               for r in c["ops"] if r["covered"] and r["op"] in theirs)
                # a fused op's kernel in the arm against its members' kernels in the base
                # (only a fused op whose kernel ran in the arm: of two overlapping ones, the one the arm ran)
                counted = [f for f in c.get("fused", ()) if f["op"] in theirs and not set(f["replaces"]) & set(theirs)]
                p["in_context_saved_us"] += sum(f["us_per_step"] - theirs[f["op"]] for f in counted)
                # fa3's q copies, which an op writing q into its own buffer removes (profile.Q_COPY), where no fused
                # row above counted them (an arm A running astra's op with q in place has none)
                if arm_ops[o] & q_out_ops() and not any(Q_COPY in f["replaces"] for f in counted):
                    p["in_context_saved_us"] += _us_of(c, Q_COPY) - _us_of(oc, Q_COPY)
                p["kernel_step_delta_us"] = c["kernel_us_per_step"] - oc["kernel_us_per_step"]
            out[(o, bs)] = p
    return out


def _us_of(capture: dict, op: str) -> float:
    """µs a step of `op`'s row in a profiled capture (0 where it has none)."""
    return next((r["us_per_step"] for r in capture["ops"] if r["op"] == op), 0.0)


def _widest_fused(fused: Sequence[dict]) -> List[dict]:
    """Fused rows that share no member, the widest first: where two patched fused ops cover the same kernels
    (dense Qwen3: qknorm_rope's qknorm + rope inside qknorm_rope_store's qknorm + rope + kv_store), the layer runs
    the wider one (it replaces the method that calls the narrower), so only it counts."""
    out: List[dict] = []
    for f in sorted(fused, key=lambda f: -len(f["replaces"])):
        if not any(set(f["replaces"]) & set(g["replaces"]) for g in out):
            out.append(f)
    return out


def _op_list(text: str) -> object:
    t = text.strip()
    return t if t in ("all", "none") else [o.strip() for o in t.split(",") if o.strip()]


def parse_arm_env(items: Sequence[str]) -> Dict[str, Dict[str, str]]:
    """--arm-env ARM:KEY=VALUE items -> {"A": {...}, "B": {...}}: arm A's (A2 takes A's too) or arm B's worker
    environment on top of the driver's, for an A/B of a switch an op reads from the environment at patch time."""
    out: Dict[str, Dict[str, str]] = {}
    for item in items:
        arm, sep, kv = item.partition(":")
        key, eq, value = kv.partition("=")
        if not sep or not eq or arm not in ("A", "B") or not key.strip() or "=" in key:
            raise AstraError(f"--arm-env {item!r}: give ARM:KEY=VALUE with ARM A or B "
                             "(e.g. B:ASTRA_GPAN_ACROSS_LAYERS=1)")
        out.setdefault(arm, {})[key.strip()] = value
    return out


def env_of_arm(arm_env: Optional[Dict[str, Dict[str, str]]], arm: str) -> Dict[str, str]:
    """The extra environment of an arm's workers: A2, the A/A twin, gets A's."""
    return dict((arm_env or {}).get("A" if arm == "A2" else arm, {}))


def arms_for(ops: str, aa: bool, calibrate: bool, base_ops: str = "none",
             arm_env: Optional[Dict[str, Dict[str, str]]] = None, candidates: bool = False) -> Dict[str, object]:
    """Arm -> its ops. A (and A2) run `base_ops` (default: unpatched), B runs `ops`: with a base, the Δ is what
    `ops` adds on top of it (one fused op against the ops it replaces, both patched in one run). With `arm_env`
    giving A and B different environments, or with `candidates` (arm B's alone), the ops may be the same (the Δ is
    the switch's, or the candidate's against the shipped kernel)."""
    patched, base = _op_list(ops), _op_list(base_ops or "none")
    if aa:
        return {"A": base, "A2": base}
    if ops.strip() == "none" or not patched:
        raise AstraError("--ops none would compare the baseline with itself; use --aa for an A/A run"
                         + (" (and no op reads an --arm-env switch in an unpatched arm)" if arm_env else ""))
    from .step_worker import ops_to_patch

    # the ops each arm patches, as its workers resolve them ('all,OP' with OP on by default is 'all')
    same_ops = set(ops_to_patch(base_ops or "none")) == set(ops_to_patch(ops))
    if base != "none" and same_ops and not candidates and env_of_arm(arm_env, "A") == env_of_arm(arm_env, "B"):
        raise AstraError("--base-ops equals --ops: the arms would be the same")
    return {"A": base, "A2": base, "B": patched} if calibrate else {"A": base, "B": patched}


def load_floors(path: Optional[Path]) -> Optional[Dict[int, dict]]:
    """Noise floors (per batch size) from an earlier --aa run's summary.json (or its folder; results/ keeps it as
    summary.json.xz where it is over 10 KB)."""
    from . import step_stats as ss
    from .speedups import record_path
    from .trace import load_json

    if not path:
        return None
    p = record_path(Path(path), "summary.json")
    if not p.is_file():
        raise AstraError(f"--aa-floor {path}: no summary.json there (give an --aa run's summary.json or --out dir)")
    fl = ss.floors_from_summary(load_json(p), f"A/A run {p.parent.name}")
    if not fl:
        raise AstraError(f"--aa-floor {p}: it holds no A/A comparison (run e2e --step --aa first)")
    return fl


def run_step(model_path: str, ops: str, batch_sizes: Sequence[int], input_len: int, output_len: int, rounds: int,
             out: Path, aa: bool = False, calibrate: bool = False, python: str = sys.executable,
             module: str = WORKER_MODULE, profile_steps: int = 20, profile: bool = True, port: int = 30200,
             mem_fraction: float = 0.9, prefill_graph: bool = False, extra: Sequence[str] = (),
             startup_timeout: float = 900.0, cmd_timeout: float = 600.0, results_dirs: Sequence[Path] = (),
             self_check: str = "first", tokenizer_path: Optional[str] = None, procs: int = 2,
             procs_at_once: Optional[int] = None, warmup_rounds: int = 1, skip_steps: int = 3,
             gpu_pad_us: float = 100.0, aa_floor: Optional[Path] = None, tp: int = 1,
             candidates: Optional[Dict[str, Path]] = None, base_ops: str = "none",
             arm_env: Optional[Dict[str, Dict[str, str]]] = None) -> str:
    from . import step_memory as sm
    from . import step_stats as ss
    from .model_configs import resolve_model_path
    from .profile import analyze_dir, write_outputs
    from .speedups import SpeedupTable
    from .tokenizer import model_dir_with_tokenizer

    if rounds < 1:
        raise AstraError("--rounds must be >= 1")
    if output_len < 2:
        raise AstraError("--output-len must be >= 2 (one prefill token, then decode steps)")
    if procs < 1 or (procs_at_once is not None and procs_at_once < 1):
        raise AstraError("--procs and --procs-at-once must be >= 1")
    if warmup_rounds < 0 or skip_steps < 0:
        raise AstraError("--warmup-rounds and --skip-steps must be >= 0")
    if skip_steps >= output_len - 1:
        raise AstraError(f"--skip-steps {skip_steps} leaves no decode step of --output-len {output_len}")
    if tp < 1:
        raise AstraError("--tp must be >= 1")
    arms = arms_for(ops, aa, calibrate, base_ops, arm_env, bool(candidates))
    floors = load_floors(aa_floor)
    src = resolve_model_path(model_path)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # the one-batch path always loads a tokenizer: the given one, else one generated beside a copy of the config
    model_dir = src if tokenizer_path else model_dir_with_tokenizer(src, out / "model")
    tok_dir = str(Path(tokenizer_path).resolve()) if tokenizer_path else str(model_dir)
    cfg = json.loads((src / "config.json").read_text())
    max_bs = max(batch_sizes)
    kv = kv_tokens_needed(batch_sizes, input_len, output_len, profile_steps)
    tp_args = ["--tp-size", str(tp)] if tp > 1 else []   # each worker spawns its other ranks (step_worker)
    sargs = lambda i: worker_server_args(max_bs, batch_sizes, kv, mem_fraction, port + 20 * i, prefill_graph,  # noqa: E731
                                         [*tp_args, *extra])
    wave_list = ss.waves(procs, procs_at_once or procs)
    if module == WORKER_MODULE:   # a stand-in worker (tests) loads no weights
        # before any load: a wave that cannot fit dies out of memory only after minutes of loading
        sm.check_fits(cfg, len(arms) * max(len(w) for w in wave_list), tp, sm.gpu_memory_bytes(),
                      mem_fraction=mem_fraction)
    arm_env_text = "; ".join(f"{a}: " + " ".join(f"{k}={v}" for k, v in env_of_arm(arm_env, a).items())
                             for a in arms if env_of_arm(arm_env, a))
    meta = {"date (UTC)": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "model": str(model_path),
            "arms": ", ".join(f"{a}: ops {o if isinstance(o, str) else ','.join(o)}" for a, o in arms.items()),
            **({"arm environment": arm_env_text} if arm_env_text else {}),
            "processes per arm": procs, "tensor parallel": tp,
            "candidates (arm B)": ", ".join(f"{o}={p}" for o, p in (candidates or {}).items()) or "none", "waves": " | ".join(",".join(map(str, w)) for w in wave_list),
            "batch sizes": ",".join(map(str, batch_sizes)), "input_len": input_len, "output_len": output_len,
            "rounds": rounds, "warm-up rounds (dropped)": warmup_rounds, "steps dropped per run": skip_steps,
            "spin pad before each timed replay (µs)": gpu_pad_us, "server args (first process)": " ".join(sargs(0)),
            "attention backend": named_in(sargs(0)) or "SGLang's default for the GPU and model (fa3 on Hopper)",
            "command": "astra-sglang " + " ".join(sys.argv[1:]) if "astra" in sys.argv[0] or sys.argv[0].endswith("cli.py")
            else " ".join(sys.argv)}
    if aa_floor:
        meta["noise floor from"] = str(aa_floor)
    records: List[dict] = []
    analysis = None
    codes: Dict[str, Optional[int]] = {}
    patched_arms = [a for a in arms if a not in ss.UNPATCHED]
    for a in arms:  # a rerun into the same --out must not sum the last run's processes into this run's counters
        fresh_counter_dir(out / f"counters-{a}")
    for w, idxs in enumerate(wave_list):
        names = {proc_name(a, i): (a, o) for i in idxs for a, o in arms.items()}
        session = Session(names, model_dir, tok_dir, out, python, module, sargs, max_bs, self_check, gpu_pad_us,
                          port_base=len(names) * w, tp=tp, candidates=candidates, arm_env=arm_env)
        try:
            session.wait_ready(startup_timeout)
            first = next(iter(session.ready.values()))
            meta.setdefault("GPU", first.get("gpu", ""))
            meta.setdefault("step timer", first.get("timer", ""))
            if tp > 1:
                meta.setdefault("TP ranks aligned before each timed replay", first.get("ranks_aligned", "?"))
            meta[f"wave {w} start-up (s)"] = f"{max(time.monotonic() - x.t0 for x in session.workers.values()):.0f}"
            for rnd, arm, i in ss.process_schedule(list(arms), idxs, rounds, warmup_rounds):
                name = proc_name(arm, i)
                grnd = rnd if rnd < 0 else w * rounds + rnd
                for bs in batch_sizes:
                    r = session.workers[name].call({"cmd": "run", "batch_size": bs, "input_len": input_len,
                                                    "output_len": output_len, "seed": 1000 + bs}, cmd_timeout)
                    rec = {"arm": arm, "proc": name, "proc_index": i, "wave": w, "round": grnd, "batch_size": bs,
                           "input_len": input_len, "output_len": output_len, "skip_steps": skip_steps,
                           **{k: r.get(k) for k in ("prefill_s", "gpu_step_s", "decode_wall_s", "decode_steps",
                                                    "timer", "replays_per_step", "tokens", "decode_s",
                                                    "gpu_step_s_by_rank", "tokens_match_by_rank")
                              if r.get(k) is not None}}
                    records.append(rec)
                    st = ss.run_stats(rec)
                    _say(f"round {grnd:>2} {name:<6} bs {bs:>3}: prefill {st['prefill_ms']:8.2f} ms, "
                         f"GPU step {st['gpu_ms']:7.4f} ms, host step {st['decode_ms']:7.3f} ms")
                _dump(out, meta, records)
            if profile and w == len(wave_list) - 1:
                # after every timed round: a process the torch profiler has run in keeps a per-step
                # overhead (measured 2026-11-23: ~0.2 ms per host-timed step)
                prof = [proc_name("A", idxs[0])] + [proc_name(a, idxs[0]) for a in patched_arms]
                profile_arms(session, prof, batch_sizes, input_len, profile_steps, out / "profile",
                             cfg, {**meta, "tp": tp, "arm_env": arm_env or {}}, cmd_timeout)
        finally:
            codes.update(session.stop())
    meta["worker exit codes"] = ", ".join(f"{a}={c}" for a, c in codes.items())
    counters = {}
    try:
        from astra_sglang.patch.counters import shape_totals, totals

        for arm in arms:
            d = out / f"counters-{arm}"
            if d.is_dir():
                counters[arm] = {"totals": totals(d), "shapes": shape_totals(d), "by_rank": counters_by_rank(d)}
        (out / "counters.json").write_text(json.dumps(counters, indent=1))
    except Exception as e:  # noqa: BLE001 - the timings stand without the counters
        meta["counters"] = f"unreadable: {e}"
    if profile and (out / "profile" / "profile-meta.json").is_file():
        dirs = list(results_dirs) or default_results_dirs()
        analysis = analyze_dir(out / "profile", SpeedupTable.from_dirs(dirs))
        analysis["meta"]["model"] = str(model_path)
        write_outputs(analysis, out / "profile", cfg, str(model_path))
    _dump(out, meta, records)
    pairs = [("A", "A2")] if aa else ([("A", "A2"), ("A", "B")] if calibrate else [("A", "B")])
    predicted = (predicted_from_profile(analysis, "A", [p[1] for p in pairs], arms, arms["A"] != "none")
                 if analysis else None)
    neighbours = consumer_effects_of(out / "profile") if analysis else []
    add_consumer_prediction(predicted, neighbours)
    summary = ss.summarize(records, pairs, predicted, floors=floors)
    summary["meta"] = meta
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    md = ss.report_markdown(summary, meta)
    if tp > 1:
        md += rank_report(records, counters)
    if counters:
        md += "\nastra counters (calls from Python incl. capture; graph replays not counted): " + "; ".join(
            f"{arm}: " + ", ".join(f"{op} calls={c.get('calls', 0)} captured={c.get('captured', 0)} "
                                   f"fallbacks={c.get('fallbacks', 0)} disabled={c.get('disabled', 0)}"
                                   for op, c in v["totals"].items()) for arm, v in counters.items()) + "\n"
    png = ss.plot(summary, str(out / "step.png"))
    if png:
        md += "\n![decode-step Δ](step.png)\n"
    if analysis:
        md += "\nProfile (arm A and the patched arm): [profile/profile.md](profile/profile.md)\n"
        md += graph_tables(analysis, neighbours)
    (out / "report.md").write_text(md)
    return md


def graph_tables(analysis: Optional[dict], neighbours: Sequence[dict]) -> str:
    """The report's tables of the decode graph, arm A against the patched arm: every profile row that moved
    (e2e/graph_diff.py), then the kernel after and before each covered op (e2e/neighbours.py)."""
    from . import graph_diff
    from .neighbours import report as consumer_report

    return (graph_diff.report(graph_diff.diff(analysis)) if analysis else "") + consumer_report(neighbours)


def consumer_effects_of(pdir: Path) -> List[dict]:
    """The kernel after each patched op in arm A's and the patched arms' decode traces (e2e/neighbours.py),
    also written to PDIR/neighbours.json; [] where it cannot be computed."""
    from .neighbours import compare_dir

    try:
        res = compare_dir(pdir)
    except (OSError, ValueError, KeyError) as e:
        _say(f"consumer effects not computed ({type(e).__name__}: {e})")
        return []
    (pdir / "neighbours.json").write_text(json.dumps(res, indent=1))
    return res


def add_consumer_prediction(predicted: Optional[Dict[Tuple[str, int], dict]], neighbours: Sequence[dict]) -> None:
    """predicted[(arm, batch)]["consumer_saved_us"]: what the patched ops save with the kernels after them, the
    in-graph prediction that sees a slowed consumer (e2e/neighbours.py saved_with_consumers)."""
    from .neighbours import saved_with_consumers

    for r in neighbours:
        p = (predicted or {}).get((r["arm"], r["batch_size"]))
        if p is not None and r["rows"]:
            p["consumer_saved_us"] = saved_with_consumers(r["rows"])


def counters_by_rank(directory: Path) -> Dict[str, Dict[str, Dict[str, int]]]:
    """rank ("TP1"; "pid N" where the process named none) -> op -> counts, summed over its processes."""
    from astra_sglang.patch.counters import by_rank

    return {r: d["ops"] for r, d in by_rank(directory).items()}


def rank_report(records: Sequence[dict], counters: Dict[str, dict]) -> str:
    """Tensor parallel: did every rank sample the same ids, and does every rank run each op astra runs?"""
    bad = sorted({f"{r['proc']} bs {r['batch_size']} TP{k}" for r in records
                  for k, same in (r.get("tokens_match_by_rank") or {}).items() if not same})
    lines = ["", "### Tensor-parallel ranks", "",
             "Ids sampled by every rank identical to rank 0's: " + ("yes, in every run" if not bad else
                                                                     "NO: " + ", ".join(bad)), "",
             "| arm | rank | op | calls | checks passed | fallbacks | disabled |", "|---|---|---|---:|---:|---:|---:|"]
    for arm, v in counters.items():
        for rank, ops in sorted(v.get("by_rank", {}).items()):
            for op, c in sorted(ops.items()):
                if any(c.values()):
                    lines.append(f"| {arm} | {rank} | {op} | {c.get('calls', 0)} | {c.get('checks_passed', 0)} | "
                                 f"{c.get('fallbacks', 0)} | {c.get('disabled', 0)} |")
    return "\n".join(lines) + "\n"


def default_results_dirs() -> List[Path]:
    """$ASTRA_SGLANG_RESULTS (path list), results/ of the checkout the package runs from, and of the cwd."""
    env = [Path(p) for p in os.environ.get("ASTRA_SGLANG_RESULTS", "").split(os.pathsep) if p]
    here = Path(__file__).resolve().parent.parent / "results"
    cwd = Path.cwd() / "results"
    return [p for p in dict.fromkeys(env + [here, cwd]) if p.is_dir()]


def _dump(out: Path, meta: dict, records: List[dict]) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "runs": records}))
    tmp.replace(out / "results.json")


def arms_from_meta(text: str) -> Dict[str, object]:
    """'A: ops none, B: ops silu_and_mul,fused_add_rmsnorm' (results.json meta) -> {arm: ops}."""
    import re

    return {m.group(1): (m.group(2) if m.group(2) in ("all", "none") else m.group(2).split(","))
            for m in re.finditer(r"(\w+): ops ([\w-]+(?:,[\w-]+)*)", text or "")}   # "all,-moe_align" too


def analyze_only(results: Path, out: Path, aa_floor: Optional[Path] = None) -> str:
    """Rebuild summary/report from an earlier results.json (and profile/ beside it). A run cut off while
    profiling gets its profile report from the captures it finished; the report ends with the neighbours tables, as
    the run's own does."""
    from . import step_stats as ss
    from .profile import META, analyze_dir, write_outputs
    from .speedups import SpeedupTable, read_ab_results

    data = read_ab_results(results, "decode-step A/B")   # results.json, or results.json.xz as results/ keeps it
    records = data["runs"]
    arms = sorted({r["arm"] for r in records})
    pairs = [("A", a) for a in arms if a != "A"]
    pdir = Path(results).parent / "profile"
    predicted = analysis = None
    arm_ops = arms_from_meta(data.get("meta", {}).get("arms", ""))
    report_missing = not (pdir / "profile.json").is_file()   # a run cut off while profiling
    neighbours = consumer_effects_of(pdir) if (pdir / META).is_file() else []
    if (pdir / META).is_file():
        analysis = analyze_dir(pdir, SpeedupTable.from_dirs(default_results_dirs()))
        if report_missing:
            model = str(data.get("meta", {}).get("model", ""))
            analysis["meta"]["model"] = model
            write_outputs(analysis, pdir, json.loads((pdir / META).read_text()).get("config") or {}, model)
        predicted = predicted_from_profile(analysis, "A", [p[1] for p in pairs], arm_ops,
                                           arm_ops.get("A", "none") != "none")
        add_consumer_prediction(predicted, neighbours)
    summary = ss.summarize(records, pairs, predicted, floors=load_floors(aa_floor))
    summary["meta"] = data.get("meta", {})
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    md = ss.report_markdown(summary, data.get("meta"))
    if ss.plot(summary, str(out / "step.png")):
        md += "\n![decode-step Δ](step.png)\n"
    md += graph_tables(analysis, neighbours)
    (out / "report.md").write_text(md)
    return md
