"""`astra-sglang optimize <op>`: the agent loop from the command line."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import click

from ..errors import AstraError
from .context import DEFAULT_PROFILE_FROM_ROUND


def _say(msg: str) -> None:
    click.echo(msg, err=True)


def _price(text: Optional[str]) -> Optional[Tuple[float, float]]:
    if not text:
        return None
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise AstraError(f"--price {text!r}: give IN,OUT in USD per 1M tokens, e.g. --price 1.10,4.40")
    if a < 0 or b < 0:
        raise AstraError("--price must not be negative")
    return a, b


def _command(ctx: click.Context) -> str:
    """The command as given (flags from the command line only; never the key)."""
    from click.core import ParameterSource

    params = ctx.params
    parts = ["astra-sglang", "optimize", params["op"]]
    for k, v in params.items():
        if k in ("op", "api_key") or v is None or v is False:
            continue
        if ctx.get_parameter_source(k) not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        flag = "--" + {"ws_path": "workspace", "strict_schema": "strict-schema"}.get(k, k).replace("_", "-")
        if k == "strict_schema":
            parts.append("--strict-schema" if v else "--no-strict-schema")
        elif v is True:
            parts.append(flag)
        else:
            parts += [flag, str(v)]
    return " ".join(parts)


@click.command("optimize")
@click.argument("op")
@click.option("--rounds", type=click.IntRange(1, 1000), default=5, show_default=True, help="Optimization rounds.")
@click.option("--model", envvar="ASTRA_MODEL",
              help="Model name (e.g. o4-mini), a model served at --base-url, or scripted:FILE to replay a script "
                   "[env ASTRA_MODEL].")
@click.option("--base-url", help="OpenAI-compatible chat-completions endpoint, e.g. http://localhost:30000/v1 "
                                 "[default: $OPENAI_BASE_URL, else OpenAI].")
@click.option("--api-key", help="API key [default: $OPENAI_API_KEY]. Never written to the log.")
@click.option("--single-agent", is_flag=True, help="Ablation: one agent holding all tools, same budget.")
@click.option("--resume", is_flag=True, help="Continue the interrupted (or finished) run in --run-dir.")
@click.option("--run-dir", type=click.Path(path_type=Path),
              help="Where the log, candidates and report go [default: WORKSPACE/optimize, or optimize-single].")
@click.option("--workspace", "ws_path", type=click.Path(path_type=Path),
              help="The op's extracted workspace [default: ROOT/<op>].")
@click.option("--root", type=click.Path(path_type=Path), default=Path("astra-work"), show_default=True,
              help="Workspace root that `extract --out` wrote to.")
@click.option("--executor", type=click.Choice(["gpu", "cpu"]), default="gpu", show_default=True,
              help="gpu: astra-sglang check/bench on the extracted workspace; cpu: the C stand-in (tests, demos).")
@click.option("--baseline", type=click.Path(path_type=Path), help="--executor cpu: the C stand-in production kernel.")
@click.option("--shapes", help="Timing suite: a shape tag (paper, decode, ...) or AxB,CxD [default: paper].")
@click.option("--dtypes", help="Timing dtypes, comma-separated [default: fp16,bf16; fp32 on the CPU stand-in].")
@click.option("--check-shapes", default="check", show_default=True,
              help="Per-round correctness suite (astra-sglang check's --shapes selector).")
@click.option("--final-shapes", default="corpus+edge", show_default=True,
              help="Shapes the best candidate is re-verified on before it is reported.")
@click.option("--replays", type=click.IntRange(3, 1000), default=30, show_default=True, help="Graph replays per timing.")
@click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True), help="Wall-time budget for the run.")
@click.option("--max-tokens", type=click.IntRange(1), help="Token budget (input + output) for the run.")
@click.option("--max-cost", type=click.FloatRange(min=0, min_open=True), help="Cost budget in USD (needs a price).")
@click.option("--price", help="IN,OUT: USD per 1M input / output tokens (default: list price of known OpenAI models).")
@click.option("--max-fixes", type=click.IntRange(0, 10), default=2, show_default=True,
              help="How often compile errors go back to the coding agent in one round.")
@click.option("--max-turns", type=click.IntRange(2, 100), default=12, show_default=True,
              help="Model turns per agent run.")
@click.option("--strict-schema/--no-strict-schema", default=None,
              help="Strict JSON-schema outputs and tools [default: on for OpenAI, off for other endpoints].")
@click.option("--profile-from-round", type=click.IntRange(0, 1000), default=DEFAULT_PROFILE_FROM_ROUND,
              show_default=True,
              help="Nsight Compute metrics go to the agents from this round on; before it, correctness and time "
                   "only (0: from the production kernel on).")
@click.option("--beam", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Start each round from one of the N best correct kernels (the least expanded); 1 evolves one "
                   "kernel.")
@click.option("--trace", is_flag=True, help="Upload agent traces to OpenAI (off unless asked).")
def optimize_cmd(op, rounds, model, base_url, api_key, single_agent, resume, run_dir, ws_path, root, executor, baseline,
                 shapes, dtypes, check_shapes, final_shapes, replays, max_minutes, max_tokens, max_cost, price,
                 max_fixes, max_turns, strict_schema, profile_from_round, beam, trace):
    """Optimize OP's production kernel with the multi-agent loop; report the best verified kernel."""
    from ..registry import get_op
    from .budget import Budget
    from .context import OptimizeConfig
    from .orchestrator import Optimizer
    from .providers import resolve
    from .report import rounds_table
    from .runlog import Redactor

    ctx = click.get_current_context()
    redactor = Redactor()
    try:
        from . import sdk

        get_op(op)  # an unknown op is named before the SDK or the API key
        agents_sdk = sdk.require()
        pspec = resolve(model, base_url, api_key, strict_schema, redactor)
        spec = get_op(op)
        mode = "single" if single_agent else "multi"
        if executor == "cpu":
            from .standin import StandinExecutor

            if baseline is None:
                raise AstraError("--executor cpu needs --baseline FILE.c (the C stand-in of the production kernel)")
            run_dir = run_dir or Path(root) / op / ("optimize-cpu" + ("-single" if single_agent else ""))
            ex = StandinExecutor(spec, baseline, run_dir, check_shapes=check_shapes, final_shapes=final_shapes)
        else:
            from astra_sglang.build.workspace import Workspace
            from .gpu_executor import GpuExecutor

            ws = Workspace.open(op, path=ws_path) if ws_path else Workspace.open(op, root=root)
            from ..preconditions import require
            require("gpu", "cuda_torch")
            run_dir = run_dir or ws.path / ("optimize" + ("-single" if single_agent else ""))
            ex = GpuExecutor(spec, ws, check_shapes=check_shapes, final_shapes=final_shapes, replays=replays)
        bench_shapes = [s.dims for s in spec.shapes(shapes)] if shapes else ex.default_bench_shapes()
        bench_dtypes = [d.strip() for d in dtypes.split(",") if d.strip()] if dtypes else ex.default_bench_dtypes()
        bad = [d for d in bench_dtypes if d not in spec.dtypes]
        if bad:
            raise AstraError(f"--dtypes: {', '.join(bad)} not among {op}'s dtypes ({', '.join(spec.dtypes)})")
        budget = Budget(rounds, max_minutes * 60 if max_minutes else None, max_tokens, max_cost)
        cfg = OptimizeConfig(rounds=rounds, mode=mode, bench_shapes=bench_shapes, bench_dtypes=bench_dtypes,
                             max_fix_attempts=max_fixes, max_turns=max_turns, trace=trace, price=_price(price),
                             profile_from_round=profile_from_round, beam=beam)
        if not trace:
            agents_sdk.set_tracing_disabled(True)
        _say(f"optimize {op}: {mode}-agent, model {pspec.model} ({pspec.kind}), {rounds} rounds, executor "
             f"{ex.name}, run dir {run_dir}")
        opt = Optimizer(spec, ex, pspec, budget, run_dir, cfg, redactor, resume=resume, progress=_say,
                        command=redactor.text(_command(ctx)))
        out = opt.run()
    except AstraError as e:
        err = AstraError(redactor.text(str(e)))
        err.exit_code = e.exit_code
        raise err from None
    click.echo(rounds_table(out.records, out.best_round))
    click.echo("")
    click.echo(out.final.get("verdict", ""))
    for kind, path in out.report.items():
        click.echo(f"{kind}: {path}")
    if out.error is not None:
        kept = (f"the log and the best kernel so far are kept: best round {out.best_round}"
                if out.best_round is not None else f"the log is kept in {out.run_dir}; no round finished")
        err = AstraError(redactor.text(f"{out.error} ({kept}; report {out.report.get('markdown', '-')})"))
        err.exit_code = out.error.exit_code
        raise err
