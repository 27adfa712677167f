"""`astra-sglang profile`: where a model's SGLang decode (and prefill) step goes, per op.

Modes:
  --model-path DIR|NAME   load the model in SGLang's one-batch path (dummy weights, CUDA graphs),
                          profile prefill and decode at each batch size (e2e/step_worker.py; one prefill
                          of that size runs unprofiled first: a patched op's first-call self-check)
  --url http://HOST:PORT  a running server: POST /start_profile (activities GPU), wait for the traces
  --analyze DIR           re-attribute an earlier capture dir (no GPU)
  --from-counters DIR     the shapes a patched server ran on (patch counters) as a corpus file
Outputs in --out: profile.md (tables), profile.json, profile-<stage>.png, shapes.json (corpus for
check/bench/optimize --shapes FILE), the traces.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import click

from astra_sglang.errors import AstraError


def _say(msg: str) -> None:
    click.echo(f"  · {msg}", err=True)


def _speedups(results):
    from .speedups import SpeedupTable
    from .step import default_results_dirs

    return SpeedupTable.from_dirs([Path(r) for r in results] or default_results_dirs())


def trace_rank(name: str) -> str:
    """SGLang names each rank's trace `<id>-TP-<r>[-EP-<e>]....trace.json.gz`: -> "TP1" ("server" if none)."""
    m = re.search(r"TP-(\d+)", name)
    return f"TP{m.group(1)}" if m else "server"


def _profile_url(url: str, out: Path, num_steps: int, timeout: float, cfg: dict, model: str, tp: int = 1) -> dict:
    from . import server_profile
    from .profile import META

    tdir = out / "server-traces"
    server_profile.start(url, tdir, num_steps, activities=("GPU",), record_shapes=True)
    _say(f"profiling {num_steps} steps; send traffic to the server now (traces land in {tdir})")
    traces = server_profile.wait_traces(tdir, tp, timeout)   # one trace per TP rank
    if not traces:
        raise AstraError(f"no trace in {tdir} after {timeout:.0f}s: did the server run {num_steps} steps, and "
                         "does it share this file system?")
    if len(traces) < tp:
        _say(f"only {len(traces)} of {tp} ranks wrote a trace in {timeout:.0f}s")
    caps = [{"stage": "server", "batch_size": 0, "tokens": 0, "steps": num_steps,
             "trace": str(t.relative_to(out)), "arm": trace_rank(t.name)} for t in traces]
    meta = {"model": model, "url": url, "date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "config": cfg, "captures": caps, "tp": tp}
    (out / META).write_text(json.dumps(meta, indent=1))
    return meta


@click.command("profile", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model-path", help="Model dir (config.json) or a shipped config name (e2e/configs).")
@click.option("--batch-size", "batch_sizes", default="1,8,32,64", show_default=True)
@click.option("--input-len", default=256, show_default=True, help="Prompt tokens per request (prefill, KV length).")
@click.option("--tp", default=1, show_default=True, help="Tensor parallel size: in process, one worker per rank on "
              "GPUs 0..TP-1 (each rank's captures are arm A-TP<r>); with --url, the server's TP size (one trace per rank).")
@click.option("--ops", default="none", show_default=True, help="Ops patched in the profiled process (none: SGLang as shipped).")
@click.option("--steps", default=20, show_default=True, help="Decode steps per capture.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("profile-out"), show_default=True)
@click.option("--url", help="Profile a running SGLang server instead (POST /start_profile).")
@click.option("--analyze", "analyze_dir_", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Only re-attribute an earlier capture dir (profile-meta.json + traces).")
@click.option("--from-counters", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Write the patch counters' shape histogram of DIR as OUT/shapes.json and stop.")
@click.option("--results", multiple=True, type=click.Path(path_type=Path, exists=True),
              help="Bench JSON file or dir for the shipped kernels' speedups (default: results/).")
@click.option("--server-arg", "extra", multiple=True, help="Extra launch_server flag (repeatable).")
@click.option("--python", "python_exe", default=sys.executable, show_default=True)
@click.option("--attention-backend", default="auto", show_default=True,
              help="The workers' attention backend: auto = SGLang's own default (fa3 on Hopper) where sgl_kernel has "
              "its FA3 library, else triton (the trimmed offline wheelhouse); or a name.")
@click.option("--tokenizer-path", help="A tokenizer dir (default: one is generated beside the config).")
@click.option("--startup-timeout", default=900.0, show_default=True)
@click.option("--worker-module", default="astra_sglang.e2e.step_worker", hidden=True)
def profile_cmd(model_path, batch_sizes, input_len, tp, ops, steps, out_dir, url, analyze_dir_, from_counters, results,
                extra, python_exe, attention_backend, tokenizer_path, startup_timeout, worker_module):
    """Where each SGLang step's GPU time goes, per op; what the shipped kernels can win there."""
    from .model_configs import resolve_model_path
    from .profile import analyze_dir, write_outputs

    out_dir = Path(out_dir).resolve()
    if from_counters:
        from astra_sglang.patch.counters import shapes_corpus

        corpus = shapes_corpus(from_counters, source=f"patch counters {from_counters}")
        if not corpus["ops"]:
            raise AstraError(f"{from_counters}: no shape telemetry (*.shp) from any patched process")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "shapes.json").write_text(json.dumps(corpus, indent=1))
        click.echo(str(out_dir / "shapes.json"))
        return
    cfg, model = {}, str(model_path or url or analyze_dir_)
    if model_path:
        src = resolve_model_path(model_path)
        cfg = json.loads((src / "config.json").read_text())
    if analyze_dir_:
        pdir = Path(analyze_dir_)
        meta = json.loads((pdir / "profile-meta.json").read_text()) if (pdir / "profile-meta.json").is_file() else None
        if meta is None:
            raise AstraError(f"{pdir}: no profile-meta.json (not a capture dir)")
        cfg = cfg or meta.get("config") or {}
        model = meta.get("model", model)
    elif url:
        if steps < 1:
            raise AstraError("--steps must be >= 1")
        out_dir.mkdir(parents=True, exist_ok=True)
        _profile_url(url, out_dir, steps, startup_timeout, cfg, model, tp)
        pdir = out_dir
    else:
        if not model_path:
            raise AstraError("give --model-path, --url or --analyze")
        if tp < 1:
            raise AstraError("--tp must be >= 1")
        from .step import Session, kv_tokens_needed, parse_sizes, profile_arms, worker_server_args
        from .tokenizer import model_dir_with_tokenizer

        sizes = parse_sizes(batch_sizes, "--batch-size")
        if input_len < 1 or steps < 1:
            raise AstraError("--input-len and --steps must be >= 1")
        out_dir.mkdir(parents=True, exist_ok=True)
        mdir = src if tokenizer_path else model_dir_with_tokenizer(src, out_dir / "model")
        tok = str(Path(tokenizer_path).resolve()) if tokenizer_path else str(mdir)
        arm = "A" if ops.strip() == "none" else "B"
        arm_ops = "none" if arm == "A" else ("all" if ops.strip() == "all" else [o.strip() for o in ops.split(",")])
        kv = kv_tokens_needed(sizes, input_len, 2, steps)
        tp_args = ["--tp-size", str(tp)] if tp > 1 else []
        from .attention import attention_flags

        att_flags, att_label = attention_flags(attention_backend, python_exe, extra)
        click.echo(f"  · attention backend: {att_label}", err=True)
        extra = (*att_flags, *extra)
        session = Session({arm: (arm, arm_ops)}, mdir, tok, out_dir, python_exe, worker_module,
                          lambda i: worker_server_args(max(sizes), sizes, kv, 0.85, 30300, False, [*tp_args, *extra]),
                          max(sizes), tp=tp)
        try:
            session.wait_ready(startup_timeout)
            profile_arms(session, [arm], sizes, input_len, steps, out_dir,
                         cfg, {"model": model, "tp": tp, "GPU": session.ready[arm].get("gpu", ""),
                               "date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                               "command": "astra-sglang profile " + " ".join(sys.argv[2:])}, 3600)
        finally:
            session.stop()
        pdir = out_dir
    analysis = analyze_dir(pdir, _speedups(results))
    analysis["meta"]["model"] = model
    out_dir.mkdir(parents=True, exist_ok=True)
    md = write_outputs(analysis, out_dir, cfg, model)
    click.echo(md)
