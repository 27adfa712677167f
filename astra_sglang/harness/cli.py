"""`astra-sglang check` and `astra-sglang bench` (registered lazily in cli.py)."""
from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple

import click

from ..errors import AstraError


def _progress(msg: str) -> None:
    click.echo(f"  · {msg}", err=True)


def _dtypes(values: Sequence[str]) -> Optional[Tuple[str, ...]]:
    out = []
    for v in values:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return tuple(out) or None


def _workspace(op: str, ws_path: Optional[Path], root: Path):
    from ..build.workspace import Workspace
    from ..registry import get_op

    get_op(op)  # an unknown op is named as such, before any workspace is looked for
    return Workspace.open(op, path=ws_path) if ws_path else Workspace.open(op, root=root)


_ws_opts = [
    click.option("--workspace", "ws_path", type=click.Path(path_type=Path),
                 help="The op's workspace directory (default: ROOT/<op>)."),
    click.option("--root", type=click.Path(path_type=Path), default=Path("astra-work"), show_default=True,
                 help="Workspace root that `extract --out` wrote to."),
]


def _with(opts):
    def deco(f):
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


@click.command("check")
@click.argument("op")
@click.option("--candidate", type=click.Path(path_type=Path), help="Candidate .cu behind the op's ABI "
              "(default: check the production baseline itself).")
@_with(_ws_opts)
@click.option("--shapes", default="check", show_default=True,
              help="check (edge + paper + corpus sample) | corpus | paper | edge | decode | prefill | AxB,... "
                   "(join with +)")
@click.option("--dtype", "dtypes", multiple=True, help="fp16, bf16, fp32 (repeat or comma-separate; "
              "default: all the workspace supports).")
@click.option("--seed", type=int, help="Input seed (default: fresh each run; printed for reproduction).")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds without progress before the run counts as hung.")
@click.option("--sanitize", is_flag=True, help="Also run compute-sanitizer memcheck and racecheck on small shapes.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the full result as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Print notes (skipped shapes, non-finite positions).")
def check_cmd(op, candidate, ws_path, root, shapes, dtypes, seed, timeout, sanitize, json_out, verbose):
    """Say whether a kernel computes OP: fp64 reference + production kernel as the oracle.

    Exit status 0 when it passes, 1 when it fails (with the reason), 2 on usage errors."""
    from .check import check_candidate
    from .results import format_check

    ws = _workspace(op, ws_path, root)
    res = check_candidate(op, ws, candidate, shapes=shapes, dtypes=_dtypes(dtypes), seed=seed, timeout=timeout,
                          sanitize=sanitize, progress=_progress)
    if json_out:  # first: the result is kept even if printing it fails
        res.to_json(json_out)
    click.echo(format_check(res, verbose=verbose))
    click.echo(f"  seed {res.seed} (--seed {res.seed} reproduces the inputs)", err=True)
    if json_out:
        click.echo(f"  wrote {json_out}", err=True)
    if not res.ok:
        sys.exit(1)


@click.command("bench")
@click.argument("op")
@click.option("--candidate", type=click.Path(path_type=Path), help="Candidate .cu (default: production only).")
@_with(_ws_opts)
@click.option("--shapes", default=None,
              help="paper | corpus | decode | prefill | edge | check | AxB,... (join with +); default: paper, or "
                   "decode for an op without paper shapes")
@click.option("--dtype", "dtypes", multiple=True, help="Default: fp16,bf16 (those the workspace has; an op "
              "with neither, e.g. moe_align's int32, its own).")
@click.option("--l2", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
              help="cold: rotating input sets > 4x L2; warm: one set, repeated.")
@click.option("--replays", type=int, default=30, show_default=True, help="Graph replays per implementation.")
@click.option("--seed", type=int)
@click.option("--out", "out", type=click.Path(path_type=Path),
              help="JSON path (plot written beside it as .png; default: WORKSPACE/bench/<time>.json).")
@click.option("--no-plot", is_flag=True)
@click.option("--no-recheck", is_flag=True, help="Skip the re-check on fresh inputs after timing.")
@click.option("--remeasure-ceiling", is_flag=True, help="Measure the copy ceiling again instead of the cached value.")
@click.option("--baseline", type=click.Choice(["extracted", "installed"]), default="extracted", show_default=True,
              help="installed: also time the installed SGLang callable the patch replaces (through torch, same "
                   "graphs) and show extracted == installed in bits.")
@click.option("--no-context", is_flag=True, help="Skip the in-context timing (producer GEMM -> op -> consumer GEMM); "
              "every row then uses the chained time.")
@click.option("--consumer-width", type=int, help="Output width of the in-context consumer GEMM "
              "(default 4096): the model's next GEMM, e.g. 2 x intermediate / TP after a post-attention norm.")
@click.option("--producer-k", type=int, help="Inner size of the in-context producer GEMM (default 4096): the model's "
              "own, e.g. o_proj's heads x head_dim before a post-attention norm.")
@click.option("--neighbours", type=click.Choice(["cublas", "astra"]), default="cublas", show_default=True,
              help="The in-context GEMMs: cublas (F.linear, an unpatched server's) or astra (the shipped linear where "
                   "its adapter takes the shape, as a patched server runs it; else cuBLAS).")
@click.option("--sites", type=click.Choice(["serving", "generic"]), default="serving", show_default=True,
              help="serving: time a decode row in context between each GEMM pair serving runs the op between, where "
                   "its spec names them (e.g. fused_add_rmsnorm: o_proj -> gate_up and down_proj -> qkv of a dense "
                   "model of that hidden size; moe_combine: the experts' down GEMM -> astra's norm -> qkv), the row "
                   "the mean; generic: one pair (--producer-k, --consumer-width), "
                   "as before 2026-11-28. Passing --producer-k or --consumer-width means generic.")
@click.option("--ncu", is_flag=True, help="Also profile one shape with Nsight Compute (JSON beside the report).")
@click.option("--ncu-shape", help="AxB for --ncu (default: the first benchmarked shape).")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds without progress before the run counts as hung.")
def bench_cmd(op, candidate, ws_path, root, shapes, dtypes, l2, replays, seed, out, no_plot, no_recheck,
              remeasure_ceiling, baseline, no_context, consumer_width, producer_k, neighbours, sites, ncu, ncu_shape,
              timeout):
    """Time OP's production kernel (and a candidate) as L2-cold CUDA graphs, chained and in context: table,
    JSON, plot. Decode rows (<= 256 tokens) take their speedup from the in-context time."""
    from .bench import bench

    ws = _workspace(op, ws_path, root)
    dts = _dtypes(dtypes)
    cmd = "astra-sglang " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = ws.path / "bench" / f"{stamp}-{Path(candidate).stem if candidate else 'baseline'}.json"
    rep = bench(op, ws, candidate, shapes=shapes, dtypes=dts, l2=l2, replays=replays, seed=seed, timeout=timeout,
                recheck=not no_recheck, remeasure_ceiling=remeasure_ceiling, command=cmd, progress=_progress,
                context=not no_context, baseline=baseline, consumer_width=consumer_width, producer_k=producer_k,
                neighbours=neighbours, sites=sites, on_row=lambda partial: partial.to_json(out))
    rep.to_json(out)
    click.echo(rep.table())
    click.echo(f"  wrote {out}", err=True)
    if not no_plot and rep.rows:
        png = rep.plot(Path(out).with_suffix(".png"))
        if png:
            click.echo(f"  wrote {png}", err=True)
    if ncu:
        from .ncu import format_profile, profile

        shape = ncu_shape or (rep.rows[0].shape if rep.rows else None)
        if not shape:
            raise AstraError("--ncu: no shape to profile")
        prof = profile(op, ws, candidate, shape, dts[0], progress=_progress)
        npath = Path(out).with_suffix(".ncu.json")
        npath.write_text(json.dumps(prof, indent=1, default=str) + "\n")
        click.echo(format_profile(prof))
        click.echo(f"  wrote {npath}", err=True)
    if not rep.ok:
        click.echo(f"FAIL: {rep.reason}", err=True)
        sys.exit(1)
