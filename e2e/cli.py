"""`astra-sglang e2e`: baseline vs patched SGLang servers, same flags, same workload, A/B interleaved.

Both servers are started through `astra-sglang patch --serve` (`--ops none` for the baseline), so
they differ only in the patch. They run side by side on the GPU (KV pool capped by
--max-total-tokens, so both get the same pool whichever started first) and are driven one at a
time, rounds in ABBA order. The idle one holds memory, not the GPU's time, and (--sleep-on-idle) not a
CPU core either: SGLang's idle scheduler otherwise spins a core at 100%, and on a VM whose vCPUs share
physical cores that spin slowed whichever arm was measured by up to 25%, differently per server start
(results/2026-11-27-h200 §6).

Outputs in --out: results.json (every request: chunk times, output ids), summary.json,
report.md (CIs and parity), ab.png, server-{A,B}.log, counters-B.json; with --server-profile also
server-profile.{md,json} and the traces under server-profile/{A,B}/; with --each-op one such folder per op
(OUT/<op>/, arm A's log and counters once in OUT) and each-op.{md,png}.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click

from astra_sglang.errors import AstraError
from astra_sglang.patch.counters import fresh_counter_dir


def _say(msg: str) -> None:
    click.echo(f"  · {msg}", err=True)


def server_args(model_path: str, load_format: str, port: int, max_total_tokens: int, mem_fraction: float,
                cuda_graph_max_bs: int, extra: List[str]) -> List[str]:
    """The launch_server flags, identical for both arms except the port."""
    args = ["--model-path", model_path, "--load-format", load_format, "--skip-tokenizer-init",
            "--sampling-backend", "pytorch",           # the attention backend comes in `extra` (e2e/attention.py)
            "--disable-radix-cache",                  # every round prefills for real
            "--max-total-tokens", str(max_total_tokens), "--mem-fraction-static", str(mem_fraction),
            "--cuda-graph-max-bs-decode", str(cuda_graph_max_bs),  # 0.5.23 refuses 0.5.17's --cuda-graph-max-bs
            "--random-seed", "0", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--sleep-on-idle"]                        # the idle arm must not spin a core beside the measured one
    return args + list(extra)


def launcher_cmd(python: str, ops: str, counter_dir: Path, args: List[str], self_check: str,
                 candidates: Optional[Dict[str, Path]] = None) -> List[str]:
    cand = [x for op, p in (candidates or {}).items() for x in ("--candidate", f"{op}={p}")]
    return [python, "-m", "astra_sglang.cli", "patch", "--serve", "--ops", ops, "--counter-dir", str(counter_dir),
            "--self-check", self_check, *cand, "--", *args]


class Server:
    def __init__(self, arm: str, cmd: List[str], port: int, log: Path, env: dict, cwd: Path):
        self.arm, self.cmd, self.port, self.log_path = arm, cmd, port, log
        self.log = open(log, "w")
        self.t0 = time.monotonic()
        # cwd outside any source checkout: `python -m astra_sglang.cli` must import the installed
        # package (a checkout's astra_sglang/ lacks the astra_sglang.patch mapping).
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(cwd),
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 40.0) -> Optional[int]:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGINT)   # the patch CLI forwards it and prints counters
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        if self.alive():
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(10)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
        # stray children (scheduler, detokenizer) of the group
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()
        return self.proc.returncode

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _gpu_name() -> str:
    from astra_sglang.build import query_gpu

    return query_gpu("name,driver_version,memory.total") or "unknown"


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("sglang", "sglang-kernel", "torch", "triton", "flashinfer-python", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "-"
    return out


# arm B of `--aa` and arm A2 of `--calibrate` (served_floor knows an A/A's summary by its "A/A")
AA_ARM = "astra-sglang patch --serve --ops none (A/A control: a second unpatched server)"


def served_floor(path: Path) -> dict:
    """An earlier server A/A's summary (summary.json, .json.xz as results/ keeps it, or its --out dir), for --aa-floor."""
    from .speedups import RECORD_ERRORS, record_path
    from .trace import load_json

    p = record_path(path, "summary.json")
    try:
        data = load_json(p)
    except RECORD_ERRORS as e:
        raise AstraError(f"--aa-floor {path}: cannot read a summary.json there ({e})") from e
    arm_b = str(data.get("meta", {}).get("arm B", ""))
    if "workloads" not in data or (arm_b and "A/A" not in arm_b):
        raise AstraError(f"--aa-floor {path}: not the summary of a server A/A (run e2e --aa first)")
    return data


def analyze(results_path: Path, out: Path, meta: Optional[dict] = None, n_boot: int = 2000,
            aa_floor: Optional[Path] = None) -> str:
    from .speedups import read_ab_results
    from .stats import Run, aa_runs, floor_markdown, plot, report_markdown, summarize

    data = read_ab_results(results_path, "server A/B")   # results.json, or results.json.xz as results/ keeps it
    floor = served_floor(aa_floor) if aa_floor is not None else None   # a wrong file: say so before any work
    all_runs = [Run.from_dict(r) for r in data["runs"]]
    runs = [r for r in all_runs if r.arm != "A2"]   # A2: --calibrate's second unpatched server
    calibrated = len(runs) < len(all_runs)
    summary = summarize(runs, n_boot=n_boot)
    meta = {**data.get("meta", {}), **(meta or {})}
    summary["meta"] = {"arm B": meta.get("arm B", "")}   # lets a later --aa-floor tell an A/A's summary
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    png = plot(summary, str(out / "ab.png"))
    md = report_markdown(summary, meta)
    if png:
        md += f"\n![A/B per run]({Path(png).name})\n"
    if calibrated:
        aa = summarize(aa_runs(all_runs), n_boot=n_boot)
        (out / "summary-aa.json").write_text(json.dumps(aa, indent=1))
        plot(aa, str(out / "aa.png"))
        md += ("\n## A/A control: A against A2, a second unpatched server in the same rounds\n\n"
               "An offset between two servers that stays the same every round shows here and in no interval "
               "above. So each A/B Δ is judged against the floor its A/A sets:\n\n" + floor_markdown(summary, aa)
               + "\nThe A/A itself, read as an A/B (B = A2):\n\n"
               + report_markdown(aa, None).replace("B = patched", "B = A2, unpatched"))
    if floor is not None and not calibrated:
        md += (f"\n## Against an earlier A/A ({aa_floor})\n\nEach A/B Δ judged against the floor that A/A sets "
               "(run it on the same setup: same machine kind, model and workload):\n\n"
               + floor_markdown(summary, floor))
    prof = Path(results_path).parent / "server-profile.md"
    if prof.is_file():   # --server-profile's comparison
        md += "\n" + prof.read_text()
    (out / "report.md").write_text(md)
    return md


@click.command("e2e", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model-path", help="Model dir (config.json; weights only without --load-format dummy).")
@click.option("--ops", default="all", show_default=True, help="Ops patched in arm B (arm A: none).")
@click.option("--load-format", default="dummy", show_default=True)
@click.option("--workload", "workloads", multiple=True, default=("decode", "prefill"), show_default=True,
              help="decode, prefill, or name:prompts:in:out:concurrency (repeatable).")
@click.option("--rounds", default=5, show_default=True, help="Measured A/B rounds per workload (plus one warm-up).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("e2e-out"), show_default=True)
@click.option("--port", default=30100, show_default=True, help="Arm A's port; arm B gets PORT+1 (--calibrate's A2: PORT+2).")
@click.option("--max-total-tokens", default=65536, show_default=True, help="KV pool size of each server.")
@click.option("--mem-fraction-static", "mem_fraction", default=0.85, show_default=True)
@click.option("--cuda-graph-max-bs", default=64, show_default=True)
@click.option("--self-check", default="first", show_default=True, type=click.Choice(["first", "always", "off"]))
@click.option("--server-arg", "extra", multiple=True, help="Extra launch_server argument (repeatable, e.g. '--tp=2').")
@click.option("--python", "python_exe", default=sys.executable, show_default=True)
@click.option("--attention-backend", default="auto", show_default=True,
              help="The servers' (and --step workers') attention backend: auto = SGLang's own default (fa3 on "
              "Hopper) where sgl_kernel has its FA3 library, else triton (the trimmed offline wheelhouse); or a name.")
@click.option("--startup-timeout", default=600.0, show_default=True)
@click.option("--vocab-size", type=int, help="Token ids are drawn below this (default: config.json's vocab_size).")
@click.option("--analyze", "analyze_path", type=click.Path(path_type=Path, exists=True),
              help="Only rebuild report.md / ab.png / summary.json from an earlier results.json.")
@click.option("--bootstrap", "n_boot", default=2000, show_default=True)
@click.option("--step", is_flag=True, help="Decode-step A/B through SGLang's one-batch path instead of servers "
              "(e2e/step.py): median step latency per batch size, prefill latency, profile's prediction.")
@click.option("--batch-size", "batch_sizes", default="1,8,32,64", show_default=True, help="--step: batch sizes.")
@click.option("--input-len", default=256, show_default=True, help="--step: prompt tokens per request.")
@click.option("--output-len", default=64, show_default=True, help="--step: tokens per request (decode steps + 1).")
@click.option("--aa", is_flag=True, help="Both arms unpatched (A/A control: the Δ and CI it shows are what the "
              "method resolves; a server A/A with a significant Δ means the arms are not measured alike).")
@click.option("--calibrate", is_flag=True, help="A third, unpatched arm A2 beside A and B (A/A and A/B in one run; a "
              "server A/B then starts three servers and reports the A/A control under the A/B).")
@click.option("--no-profile", is_flag=True, help="--step: skip the profile (and so the predicted Δ).")
@click.option("--profile-steps", default=20, show_default=True, help="--step: decode steps per profile capture; "
              "--server-profile: scheduler steps profiled per arm (prefills count).")
@click.option("--server-profile", "server_profile_wl", metavar="WORKLOAD",
              help="After that workload's measured rounds, one more round per arm with SGLang's profiler on: "
              "report.md then says where each arm's served decode step goes (graph replay, other kernels, GPU idle) "
              "and which kernels differ.")
@click.option("--each-op", is_flag=True, help="One A/B per op of --ops, each op alone in arm B (arm A stays up, arm B "
              "restarts per op): which op helps or hurts this server. OUT/<op>/ per op, OUT/each-op.md and .png.")
@click.option("--prefill-graph", is_flag=True, help="--step: keep SGLang's prefill CUDA graph (default off: start-up time).")
@click.option("--tokenizer-path", help="--step: a tokenizer dir (default: one is generated beside the config).")
@click.option("--procs", default=2, show_default=True, help="--step: worker processes per arm (the process is a random "
              "effect in the CI; with 1 the interval cannot see it).")
@click.option("--procs-at-once", type=int, help="--step: processes per arm loaded at a time (default all; fewer runs "
              "them in waves, for models the GPU holds only a few copies of).")
@click.option("--warmup-rounds", default=1, show_default=True, help="--step: untimed rounds per process first.")
@click.option("--skip-steps", default=3, show_default=True, help="--step: decode steps dropped at the start of each run.")
@click.option("--gpu-pad-us", default=100.0, show_default=True, help="--step: spin kernel queued before each timed graph "
              "replay so launch latency stays outside the GPU timer (0: none).")
@click.option("--aa-floor", type=click.Path(path_type=Path, exists=True), help="summary.json (or --out dir) of an "
              "earlier --aa run of the same kind (step or server): its CI half-widths are the noise floor each Δ is "
              "judged against.")
@click.option("--candidate", "candidate_items", multiple=True, metavar="OP=FILE.cu",
              help="The patched arm (B) serves OP with this kernel instead of kernels/OP/kernel.cu (repeatable): "
                   "a candidate's serving A/B before it ships. With --step --base-ops, arm A keeps the shipped kernel "
                   "(--base-ops all --ops all --candidate OP=F.cu: the candidate against it).")
@click.option("--base-ops", default="none", show_default=True,
              help="--step: ops patched in arm A too (comma-separated or 'all'), so the Δ is what --ops adds on top "
              "of them (a fused op against the ops it replaces). No profile prediction then.")
@click.option("--arm-env", "arm_env_items", multiple=True, metavar="ARM:KEY=VALUE",
              help="--step: an environment variable for arm A's (and A2's) or arm B's workers only (repeatable), "
              "for an A/B of a switch an op reads at patch time; the arms' ops may then be the same.")
@click.option("--tp", default=1, show_default=True, help="Tensor parallel size (GPUs 0..TP-1): servers get --tp-size; "
              "--step workers spawn one process per rank, as SGLang's one-batch benchmark does.")
@click.option("--collect", "collect_items", multiple=True, metavar="[LABEL=]DIR",
              help="Only tabulate and plot earlier server A/Bs (their --out dirs, repeatable), each judged against "
              "its own A/A (summary-aa.json of --calibrate) or --aa-floor's: OUT/collect.md, .png, .json. No GPU.")
@click.option("--worker-module", default="astra_sglang.e2e.step_worker", hidden=True)
def e2e_cmd(model_path, ops, load_format, workloads, rounds, out_dir, port, max_total_tokens, mem_fraction,
            cuda_graph_max_bs, self_check, extra, python_exe, attention_backend, startup_timeout, vocab_size,
            analyze_path, n_boot,
            step, batch_sizes, input_len, output_len, aa, calibrate, no_profile, profile_steps, prefill_graph,
            tokenizer_path, procs, procs_at_once, warmup_rounds, skip_steps, gpu_pad_us, aa_floor, candidate_items,
            base_ops, arm_env_items, tp, worker_module, server_profile_wl, each_op, collect_items):
    """Baseline vs patched SGLang servers on the same workload: TTFT, TPOT/ITL, throughput with CIs, parity."""
    from .client import parse_workload
    from .model_configs import resolve_model_path, shipped_configs

    if collect_items:
        if step or analyze_path or model_path:
            raise AstraError("--collect only reads earlier runs: drop --step, --analyze and --model-path")
        from .collect import collect

        click.echo(collect(collect_items, out_dir, aa_floor=aa_floor))
        return
    stand_in = step and worker_module != "astra_sglang.e2e.step_worker"  # tests drive --step with a stand-in worker
    if tp < 1:
        raise AstraError("--tp must be >= 1")
    if base_ops.strip() != "none" and not step:
        raise AstraError("--base-ops is for --step (a server A/B's arm A is SGLang unpatched)")
    if arm_env_items and not step:
        raise AstraError("--arm-env is for --step (a server A/B's servers share the driver's environment)")
    from .step import parse_arm_env

    arm_env = parse_arm_env(arm_env_items)
    if server_profile_wl and step:
        raise AstraError("--server-profile is for a server A/B (--step profiles its own captures)")
    if each_op and step:
        raise AstraError("--each-op is for a server A/B (a step A/B of one op: --base-ops all --ops all,OP)")
    if each_op and (aa or calibrate):
        raise AstraError("--each-op with --aa or --calibrate: run the A/A on its own (--aa) before the ops")
    if aa and calibrate:
        raise AstraError("--aa and --calibrate: --calibrate already runs an A/A beside the A/B")
    if aa and candidate_items:
        raise AstraError("--aa with --candidate: an A/A patches nothing (drop --aa to A/B the candidate)")
    if tp > 1 and not step:
        extra = ("--tp-size", str(tp), *extra)
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.config import default_ops, parse_ops

    known = patchable_ops()   # an unknown op name: one error line here, not a worker or server dying on it later
    patched = parse_ops(ops, known, default_ops(known))
    parse_ops(base_ops, known, default_ops(known))
    candidates = {}
    if candidate_items:
        from astra_sglang.patch.cli import _candidates

        candidates = {op: p.resolve() for op, p in _candidates(candidate_items).items()}
        stray = sorted(set(candidates) - set(patched))
        if stray:
            raise AstraError(f"--candidate for {', '.join(stray)}, which --ops {ops} does not patch")
    # the arguments first, then what is missing, then the first write
    if not analyze_path:
        if not model_path:
            raise AstraError("--model-path is required (a dir with config.json, or a shipped config: "
                             f"{', '.join(shipped_configs())})")
        if step:
            from .step import parse_sizes

            if load_format != "dummy":
                raise AstraError("--step runs dummy weights only (--load-format dummy)")
            if input_len < 1:
                raise AstraError("--input-len must be >= 1")
            sizes = parse_sizes(batch_sizes, "--batch-size")
            if procs < 1 or (procs_at_once is not None and procs_at_once < 1):
                raise AstraError("--procs and --procs-at-once must be >= 1")
            if warmup_rounds < 0 or skip_steps < 0 or gpu_pad_us < 0:
                raise AstraError("--warmup-rounds, --skip-steps and --gpu-pad-us must be >= 0")
            if skip_steps >= output_len - 1:
                raise AstraError(f"--skip-steps {skip_steps} leaves no decode step of --output-len {output_len}")
            if aa_floor is not None:
                from .step import load_floors

                load_floors(aa_floor)
        elif ops.strip() == "none" and not aa:
            raise AstraError("--ops none would compare the baseline with itself; name the ops to patch "
                             "(or --aa for that on purpose)")
        if not step and aa_floor is not None:
            served_floor(aa_floor)   # a wrong file: one error line now, not after the servers ran
        model_path = str(resolve_model_path(model_path))
        if not step:
            cfg_path = Path(model_path) / "config.json"
            if vocab_size is None:
                if not cfg_path.is_file():
                    raise AstraError(f"{cfg_path}: not found (give --vocab-size)")
                vocab_size = int(json.loads(cfg_path.read_text())["vocab_size"])
            wls = [parse_workload(w) for w in workloads]
            if server_profile_wl and server_profile_wl not in [w.name for w in wls]:
                raise AstraError(f"--server-profile {server_profile_wl}: no such workload "
                                 f"({', '.join(w.name for w in wls)})")
            for w in wls:
                if w.input_len + w.output_len > max_total_tokens:
                    raise AstraError(f"{w.name}: {w.input_len}+{w.output_len} tokens exceed --max-total-tokens")
            if cfg_path.is_file():   # both arms' servers run at once, on the same GPUs
                from . import step_memory as sm

                sm.check_servers_fit(json.loads(cfg_path.read_text()), 3 if calibrate else 2, tp, max_total_tokens,
                                     sm.gpu_memory_bytes())
    if not analyze_path and not stand_in and python_exe == sys.executable:  # SGLang runs in this Python: what it lacks, first
        from astra_sglang.preconditions import require
        require("sglang", "gpu", "cuda_torch")
    out_dir.mkdir(parents=True, exist_ok=True)
    if analyze_path and step:
        from .step import analyze_only

        click.echo(analyze_only(analyze_path, out_dir, aa_floor=aa_floor))
        return
    if analyze_path:
        click.echo(analyze(analyze_path, out_dir, n_boot=n_boot, aa_floor=aa_floor))
        return
    from .attention import attention_flags

    att_flags, att_label = attention_flags(attention_backend, python_exe, extra)
    _say(f"attention backend: {att_label}")
    extra = (*att_flags, *extra)
    if step:
        from .step import run_step

        md = run_step(model_path, ops, sizes, input_len, output_len, rounds, out_dir, aa=aa, calibrate=calibrate,
                      python=python_exe, module=worker_module, profile_steps=profile_steps, profile=not no_profile,
                      port=port, mem_fraction=mem_fraction if mem_fraction != 0.85 else 0.9,
                      prefill_graph=prefill_graph, extra=list(extra), startup_timeout=startup_timeout,
                      self_check=self_check, tokenizer_path=tokenizer_path, procs=procs, procs_at_once=procs_at_once,
                      warmup_rounds=warmup_rounds, skip_steps=skip_steps, gpu_pad_us=gpu_pad_us, aa_floor=aa_floor,
                      tp=tp, candidates=candidates, base_ops=base_ops, arm_env=arm_env)
        click.echo(md)
        return
    out_dir = out_dir.resolve()
    env = dict(os.environ)
    env.setdefault("TVM_FFI_CACHE_DIR", str(Path.home() / ".cache" / "tvm-ffi"))
    run = _ServedAB(model_path, load_format, port, max_total_tokens, mem_fraction, cuda_graph_max_bs, list(extra),
                    python_exe, self_check, candidates, env, startup_timeout, wls, vocab_size, rounds, workloads,
                    server_profile_wl, profile_steps, tp, n_boot, aa_floor)
    meta = {
        "date (UTC)": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "GPU": _gpu_name(),
        "host": platform.node(),
        "python": platform.python_version(),
        **{k: v for k, v in _versions().items()},
        "model": str(model_path),
        "arm A": "astra-sglang patch --serve --ops none",
        "attention backend": att_label,
        "launch_server args": " ".join(server_args(model_path, load_format, port, max_total_tokens, mem_fraction,
                                                   cuda_graph_max_bs, list(extra))),
    }
    if each_op:
        click.echo(run.each_op(patched, out_dir, meta))
        failed = [op for op in patched if (out_dir / op / "error.txt").is_file()]
        if failed:
            raise AstraError(f"--each-op: {', '.join(failed)} did not run to the end (OUT/<op>/error.txt); "
                             f"the others are in {out_dir / 'each-op.md'}")
        return
    if calibrate:
        meta["arm A2"] = AA_ARM
    click.echo(run.one("none" if aa else ops, out_dir, meta, calibrate))


def _arm_b_text(ops: str, self_check: str, candidates: Dict[str, Path]) -> str:
    if ops == "none":
        return AA_ARM
    return (f"astra-sglang patch --serve --ops {ops} --self-check {self_check}"
            + "".join(f" --candidate {op}={p}" for op, p in candidates.items()))


@dataclass
class _ServedAB:
    """Servers A (unpatched) and B (--ops) on the same flags, driven in ABBA rounds; `each_op` keeps A up and
    restarts B with one op at a time."""

    model_path: str
    load_format: str
    port: int
    max_total_tokens: int
    mem_fraction: float
    cuda_graph_max_bs: int
    extra: List[str]
    python_exe: str
    self_check: str
    candidates: Dict[str, Path]
    env: dict
    startup_timeout: float
    wls: list
    vocab_size: int
    rounds: int
    workloads: tuple
    server_profile_wl: Optional[str]
    profile_steps: int
    tp: int
    n_boot: int
    aa_floor: Optional[Path] = None   # an earlier server A/A's summary: each Δ judged against its floor

    def start(self, arm: str, ops: str, counters: Path, log: Path,
              candidates: Optional[Dict[str, Path]] = None) -> "Server":
        p = self.port + {"A": 0, "B": 1, "A2": 2}[arm]
        args = server_args(self.model_path, self.load_format, p, self.max_total_tokens, self.mem_fraction,
                           self.cuda_graph_max_bs, self.extra)
        cmd = launcher_cmd(self.python_exe, ops, fresh_counter_dir(counters), args, self.self_check, candidates)
        _say(f"arm {arm}: {' '.join(cmd)}")
        return Server(arm, cmd, p, log, self.env, counters)

    def ready(self, s: "Server", meta: dict) -> None:
        from .client import wait_ready

        try:
            waited = wait_ready("127.0.0.1", s.port, self.startup_timeout, s.alive)
        except RuntimeError as e:
            raise AstraError(f"arm {s.arm}: {e}\n--- {s.log_path.name} (tail) ---\n{s.tail()}") from e
        _say(f"arm {s.arm} ready after {time.monotonic() - s.t0:.0f}s (waited {waited:.0f}s)")
        meta[f"startup {s.arm} (s)"] = f"{time.monotonic() - s.t0:.0f}"

    def rounds_of(self, servers: dict, out_dir: Path, meta: dict) -> list:
        from .client import make_prompts, run_workload
        from .stats import ab_schedule, calibrated_schedule

        runs: list = []
        loads: List[float] = []
        for w in self.wls:
            prompts = make_prompts(w, self.vocab_size)
            _say(w.describe())
            for rnd, arm in (calibrated_schedule(self.rounds) if "A2" in servers else ab_schedule(self.rounds)):
                s = servers[arm]
                if not s.alive():
                    raise AstraError(f"arm {arm} died during the run\n{s.tail()}")
                run = run_workload("127.0.0.1", s.port, w, prompts, arm, rnd)
                runs.append(run)
                bad = [r for r in run.results if not r.ok]
                tok = sum(r.n_out for r in run.results if r.ok)
                _say(f"  {w.name} round {rnd:>2} {arm}: {run.t_finish - run.t_begin:6.2f}s, "
                     f"{tok / max(run.t_finish - run.t_begin, 1e-9):8.1f} tok/s"
                     + (f", {len(bad)} failed: {bad[0].error}" if bad else ""))
                loads.append(os.getloadavg()[0])
                meta[HOST_LOAD] = host_load_text(loads, os.cpu_count() or 1)
                _dump(out_dir, meta, self.workloads, runs)
            if w.name == self.server_profile_wl:
                _profile_round({k: servers[k] for k in ("A", "B")}, w, prompts, out_dir, self.profile_steps, self.tp)
        return runs

    def finish(self, out_dir: Path, meta: dict, runs: list, counters_a: Path) -> str:
        """Counters of both arms (read after stop: the files stay), results.json, report."""
        try:
            from astra_sglang.patch.counters import totals

            tot = totals(str(out_dir / "counters-B"))
            (out_dir / "counters-B.json").write_text(json.dumps(tot, indent=1))
            meta["astra counters in B"] = _counter_text(tot)
            meta["astra counters in A"] = _counter_text(totals(str(counters_a)))
        except Exception as e:  # noqa: BLE001 - report, don't lose the results
            meta["astra counters in B"] = f"unreadable: {e}"
        _dump(out_dir, meta, self.workloads, runs)
        return analyze(out_dir / "results.json", out_dir, n_boot=self.n_boot, aa_floor=self.aa_floor)

    def one(self, ops: str, out_dir: Path, meta: dict, calibrate: bool = False) -> str:
        meta["arm B"] = _arm_b_text(ops, self.self_check, self.candidates)
        servers: Dict[str, Server] = {}
        runs: list = []
        try:
            for arm, o in (("A", "none"), ("B", ops)) + ((("A2", "none"),) if calibrate else ()):
                servers[arm] = self.start(arm, o, out_dir / f"counters-{arm}", out_dir / f"server-{arm}.log",
                                          self.candidates if arm == "B" else None)
            for s in servers.values():
                self.ready(s, meta)
            runs = self.rounds_of(servers, out_dir, meta)
        finally:
            for arm, s in servers.items():
                meta[f"server {arm} exit"] = s.stop()
        return self.finish(out_dir, meta, runs, out_dir / "counters-A")

    def each_op(self, ops: List[str], out_dir: Path, meta: dict) -> str:
        """One A/B per op, arm A up throughout: OUT/<op>/ per op, then OUT/each-op.md (+ .png)."""
        from .each_op import summary_markdown

        done: Dict[str, Path] = {}
        a = self.start("A", "none", out_dir / "counters-A", out_dir / "server-A.log")
        try:
            self.ready(a, meta)
            for i, op in enumerate(ops):
                sub = out_dir / op
                sub.mkdir(parents=True, exist_ok=True)
                cand = {op: self.candidates[op]} if op in self.candidates else {}
                m = {**meta, "arm B": _arm_b_text(op, self.self_check, cand)}
                _say(f"op {i + 1}/{len(ops)}: {op}")
                b = self.start("B", op, sub / "counters-B", sub / "server-B.log", cand)
                runs: list = []
                try:
                    self.ready(b, m)
                    runs = self.rounds_of({"A": a, "B": b}, sub, m)
                except AstraError as e:
                    if not a.alive():
                        raise
                    (sub / "error.txt").write_text(f"{e}\n")   # this op's server failed: the next op still runs
                    _say(f"op {op}: {str(e).splitlines()[0]}")
                finally:
                    m["server B exit"] = b.stop()
                if runs:
                    self.finish(sub, m, runs, out_dir / "counters-A")
                done[op] = sub
        finally:
            meta["server A exit"] = a.stop()
        md = summary_markdown(done, out_dir, meta)
        (out_dir / "each-op.md").write_text(md)
        return md


def _profile_round(servers: dict, w, prompts, out_dir: Path, steps: int, tp: int) -> None:
    """One unmeasured round of `w` per arm under SGLang's profiler; writes server-profile.{md,json}. A failure is
    reported there, never fatal: the measured rounds are already on disk."""
    from . import server_profile as sp
    from .client import run_workload

    profiles, notes = {}, []
    for arm, s in servers.items():
        url, tdir = f"http://127.0.0.1:{s.port}", out_dir / "server-profile" / arm
        try:
            sp.start(url, tdir, steps)
            _say(f"  {w.name} profiled round {arm} ({steps} scheduler steps)")
            run_workload("127.0.0.1", s.port, w, prompts, arm, -2)
            sp.stop(url)   # fewer steps than asked: stop and write what there is
            profiles[arm] = sp.profile_of(sp.wait_traces(tdir, tp, 120.0))
            if profiles[arm] is None:
                notes.append(f"arm {arm}: no trace with decode graph replays in {tdir}")
        except AstraError as e:
            profiles[arm] = None
            notes.append(f"arm {arm}: {e}")
    md = sp.compare_markdown(profiles.get("A"), profiles.get("B"), w.name) + "".join(f"\n- {n}" for n in notes)
    (out_dir / "server-profile.md").write_text(md + "\n")
    (out_dir / "server-profile.json").write_text(json.dumps(
        {arm: (p.to_dict() if p else None) for arm, p in profiles.items()}, indent=1))


HOST_LOAD = "host load (1-min average, after each round)"


def host_load_text(samples: Sequence[float], cpus: int) -> str:
    """The host's load over a served run's rounds. A batch-1 server is host-bound, so other work on the host moves
    its A/B: the 20-layer Qwen3-30B-A3B read +7.45% (not resolved) beside a step A/B on the other GPU and +39.16% alone
    (results/2026-11-30-h200/session30/, session31/). Above half the CPUs the report says so."""
    if not samples:
        return "not sampled"
    lo, hi = min(samples), max(samples)
    text = f"{lo:.1f} to {hi:.1f} on {cpus} CPUs"
    return text + (" (busy: another job shared the host; a batch-1 A/B is host-sensitive)" if hi > cpus / 2 else "")


def _counter_text(tot: dict) -> str:
    if not tot:
        return "none (no patched process wrote counters)"
    return "; ".join(f"{op}: " + " ".join(f"{k}={v}" for k, v in c.items()) for op, c in sorted(tot.items()))


def _dump(out_dir: Path, meta: dict, workloads, runs) -> None:
    data = {"meta": meta, "workloads": list(workloads), "runs": [r.to_dict() for r in runs]}
    tmp = out_dir / "results.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(out_dir / "results.json")
