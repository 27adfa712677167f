"""`astra-sglang patch` and `astra-sglang validate`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click

from astra_sglang.errors import AstraError

from . import config as cfg


def _progress(msg: str) -> None:
    click.echo(f"  · {msg}", err=True)


def _ops(text: Optional[str]) -> List[str]:
    from . import patchable_ops

    known = patchable_ops()
    return cfg.parse_ops(text if text is not None else "all", known, cfg.default_ops(known))


def _candidates(items: Sequence[str]) -> Dict[str, Path]:
    from . import patchable_ops

    out = cfg.parse_pairs(";".join(items), "candidate")
    for op, p in out.items():
        if op not in patchable_ops():
            raise AstraError(f"--candidate {op}=...: unknown op; patchable ops: {', '.join(patchable_ops())}")
        if not p.is_file():
            raise AstraError(f"--candidate {op}={p}: no such file")
    return out


_NO_SGLANG = ("sglang is not installed here: install it (`pip install --no-deps sglang` is enough to scan it) or pass "
              "--sglang-src PATH")


def _sglang_source(sglang_src: Optional[Path]) -> Optional[Path]:
    """The sglang package discovery scans: the one under --sglang-src, or None for the installed one; the error where
    there is none (cheap: checked before any long work)."""
    if not sglang_src:
        from .discover import find_package_dir

        if find_package_dir("sglang") is None:
            raise AstraError(_NO_SGLANG)
        return None
    src = Path(sglang_src)
    pkg = src / "sglang" if (src / "sglang" / "__init__.py").exists() else (
        src / "python" / "sglang" if (src / "python" / "sglang" / "__init__.py").exists() else src)
    if not (pkg / "__init__.py").exists():
        raise AstraError(f"--sglang-src {src}: no sglang package there (expected {src}/sglang/__init__.py)")
    return pkg


# The sglang package a Python would import, found without importing it (find_spec of a top-level package runs none
# of its code): the server's SGLang may not be this CLI's
_FIND_SGLANG = ("import importlib.util as u; s = u.find_spec('sglang'); "   # origin None: a bare namespace dir
                "print(s.submodule_search_locations[0] if s and s.origin and s.submodule_search_locations else '')")


def _server_sglang(python_exe: str, sglang_src: Optional[Path]) -> Optional[Path]:
    """What discovery scans for a server run by `python_exe`: --sglang-src where given; else, for another Python than
    this one, the sglang package that Python imports (its call sites are the ones the server's processes patch);
    else None (this Python's own SGLang)."""
    # abspath, not realpath: a venv's python links to the base interpreter, whose site-packages are not the venv's
    if sglang_src or os.path.abspath(python_exe) == os.path.abspath(sys.executable):
        return sglang_src
    try:
        r = subprocess.run([python_exe, "-c", _FIND_SGLANG], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise AstraError(f"--python {python_exe}: cannot run it ({type(e).__name__}: {e})") from None
    where = r.stdout.strip()
    if r.returncode != 0 or not where:
        raise AstraError(f"--python {python_exe}: sglang is not installed there (the server would not start)")
    return Path(where)


def _discovery(ops: List[str], sglang_src: Optional[Path]):
    from astra_sglang.registry import get_op

    from . import discovery_cached
    from .discover import discover_for_specs

    specs = [get_op(o) for o in ops]
    pkg = _sglang_source(sglang_src)
    if pkg is not None:
        return discover_for_specs(specs, roots={"sglang": pkg})
    disc = discovery_cached(specs)
    if disc is None:
        raise AstraError(_NO_SGLANG)
    return disc


def _jit_methods(ops: List[str]) -> Dict[str, List[str]]:
    from .adapters import get_adapter

    return {o: [r.method for rs in get_adapter(o).jit_routes.values() for r in rs] for o in ops}


@click.command("patch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                         "help_option_names": ["-h", "--help"]})
@click.option("--serve", is_flag=True, help="Start an SGLang server (python -m sglang.launch_server ARGS) with the patch.")
@click.option("--dry-run", is_flag=True, help="Report what would be patched where (discovery over the installed SGLang); start nothing.")
@click.option("--ops", "ops_text", default="all", show_default=True,
              help="Comma-separated ops, 'all' (the defaults), 'all,OP' / 'all,-OP' (one more / one less), or 'none' "
                   "(the same server unpatched, for A/B).")
@click.option("--candidate", "candidate_items", multiple=True, metavar="OP=FILE.cu",
              help="Serve OP with this kernel instead of kernels/OP/kernel.cu (repeatable).")
@click.option("--self-check", type=click.Choice(cfg.SELF_CHECK_MODES), default="first", show_default=True,
              help="Check each op against SGLang's original on first use per shape class (or always, or off).")
@click.option("--counter-dir", type=click.Path(path_type=Path),
              help="Where the server's processes write their counters (default: a fresh directory under $TMPDIR).")
@click.option("--counters", "show_counters", type=click.Path(path_type=Path),
              help="Print the counters a patched server wrote to DIR, and exit.")
@click.option("--sglang-src", type=click.Path(path_type=Path),
              help="Discover call sites in this SGLang source (checkout or unpacked wheel) instead of the installed one.")
@click.option("--arch", help="Build the kernels for this arch (default: the local GPU's), e.g. sm_90.")
@click.option("--python", "python_exe", default=sys.executable, show_default=True, help="Python that runs the server.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output for --dry-run and --counters.")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def patch_cmd(serve, dry_run, ops_text, candidate_items, self_check, counter_dir, show_counters, sglang_src, arch,
              python_exe, as_json, server_args):
    """Serve SGLang with the astra kernels in every process: `patch --serve [--ops ...] -- <launch_server args>`."""
    from .counters import format_table, read_counters, totals

    if show_counters:
        if not Path(show_counters).is_dir():
            raise AstraError(f"--counters {show_counters}: no such directory")
        procs = read_counters(show_counters)
        if as_json:
            click.echo(json.dumps({"processes": [p.__dict__ for p in procs], "totals": totals(show_counters)}, indent=1))
        else:
            click.echo(format_table(procs) if procs else f"no counter files in {show_counters}")
        return
    if not serve and not dry_run:
        raise AstraError("give --serve (start a patched server), --dry-run (report what would be patched) "
                         "or --counters DIR")
    ops = _ops(ops_text)
    candidates = _candidates(candidate_items)
    stray = sorted(set(candidates) - set(ops))
    if stray:
        raise AstraError(f"--candidate for {', '.join(stray)}, which --ops does not patch")
    server_args = list(server_args)
    if server_args and server_args[0] == "--":
        server_args = server_args[1:]
    if serve and not server_args and not dry_run:
        raise AstraError("no server arguments: give them after `--`, e.g. "
                         "`astra-sglang patch --serve -- --model-path DIR --port 30000`")
    if serve and not dry_run and python_exe == sys.executable:  # the server runs in this Python
        from astra_sglang.preconditions import require
        require("sglang")
    if ops:  # discovery reads the server's SGLang, which another --python may hold in another version
        sglang_src = _server_sglang(python_exe, sglang_src)
    if counter_dir:
        cdir = Path(counter_dir)
    elif dry_run:
        cdir = Path(tempfile.gettempdir()) / "astra-sglang-counters-<new>"
    else:
        cdir = Path(tempfile.mkdtemp(prefix="astra-sglang-counters-"))

    disc = None
    if ops and dry_run:
        disc = _discovery(ops, sglang_src)
    if dry_run:
        _dry_run(ops, candidates, disc, self_check, cdir, python_exe, server_args, arch, as_json)
        return

    env = dict(os.environ)
    for k in (cfg.ENV_OPS, cfg.ENV_LIBS, cfg.ENV_CANDIDATES, cfg.ENV_PLAN):
        env.pop(k, None)
    env[cfg.ENV_OPS] = ",".join(ops) if ops else "none"
    env[cfg.ENV_COUNTER_DIR] = str(cdir)
    env[cfg.ENV_SELF_CHECK] = self_check
    if ops:
        from concurrent.futures import ThreadPoolExecutor

        from . import STARTUP_DIR
        from .apply import build_kernels

        _sglang_source(sglang_src)  # no SGLang to scan says so before the builds start

        def built(op, lib, secs):
            if not isinstance(lib, AstraError):
                _progress(f"{op}: {candidates.get(op) or f'kernels/{op}/kernel.cu'} -> {lib} ({secs:.1f}s)")

        # nvcc runs in subprocesses, the scan of SGLang's sources in this one (~20-30 s cold): side by side
        _progress(f"building {len(ops)} kernel(s) while scanning SGLang for their call sites")
        with ThreadPoolExecutor(1) as bg:
            pending = bg.submit(build_kernels, ops, candidates, arch, built)
            disc = _discovery(ops, sglang_src)
            libs = pending.result()
        failed = [lib for lib in libs.values() if isinstance(lib, AstraError)]
        if failed:
            raise failed[0]
        for op in ops:
            if not disc.for_op(op):
                _progress(f"WARNING {op}: no call site in this SGLang; its counters will stay at 0")
        cdir.mkdir(parents=True, exist_ok=True)
        plan = cdir / "plan.json"
        plan.write_text(disc.to_json())
        env[cfg.ENV_LIBS] = cfg.format_pairs(libs)
        env[cfg.ENV_PLAN] = str(plan)
        if candidates:
            env[cfg.ENV_CANDIDATES] = cfg.format_pairs(candidates)
        pp = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR)] + ([pp] if pp else []))
    cmd = [python_exe, "-m", "sglang.launch_server", *server_args]
    _progress(f"ops: {', '.join(ops) or 'none (unpatched)'}; self-check: {self_check}")
    _progress(f"counters: astra-sglang patch --counters {cdir}")
    _progress("server: " + " ".join(cmd))
    rc = _run_forwarding_signals(cmd, env)
    procs = read_counters(cdir)
    if procs:
        click.echo(format_table(procs), err=True)
    if ops:
        tot = totals(cdir)
        never, uncalled = never_ran(ops, tot, all_requested=(ops_text or "").strip().lower() == "all")
        if uncalled:
            click.echo(f"astra-sglang: not called by this model (neither astra nor SGLang's original ran): "
                       f"{', '.join(uncalled)}", err=True)
        disabled = [o for o in ops if tot.get(o, {}).get("disabled", 0)]
        if disabled:
            click.echo(f"astra-sglang: DISABLED during the run (self-check or kernel error): {', '.join(disabled)}", err=True)
        if never:
            click.echo(f"astra-sglang: patched op(s) never ran (0 astra kernel calls): {', '.join(never)}; "
                       "not reporting success", err=True)
            sys.exit(3)
    sys.exit(rc)


def never_ran(ops: List[str], tot: Dict[str, Dict[str, int]], all_requested: bool):
    """(ops whose astra kernel never ran: exit 3, ops the model never called: a note). A named op that
    never ran is a failed patch. Under `--ops all` an op with no call at all, astra's or the fallback's,
    is one this model does not use (Qwen3 never calls gelu_and_mul), not a failure."""
    never = [o for o in ops if tot.get(o, {}).get("calls", 0) == 0]
    if not all_requested:
        return never, []
    uncalled = [o for o in never if not tot.get(o, {}).get("fallbacks", 0)]
    return [o for o in never if o not in uncalled], uncalled


def _run_forwarding_signals(cmd: List[str], env: Dict[str, str]) -> int:
    proc = subprocess.Popen(cmd, env=env)
    forwarded = {"n": 0}

    def fwd(sig, frame):
        forwarded["n"] += 1
        try:
            proc.send_signal(sig if forwarded["n"] < 3 else signal.SIGKILL)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, fwd) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    # a server we stopped on request ended normally
    if forwarded["n"] and rc in (-signal.SIGINT, -signal.SIGTERM, 130, 143, 0):
        return 0
    return rc if rc >= 0 else 128 - rc


def _dry_run(ops, candidates, disc, self_check, cdir, python_exe, server_args, arch, as_json) -> None:
    from astra_sglang.build import find_nvcc

    from .apply import kernel_source
    from .discover import format_report

    sources = {}
    for op in ops:
        try:
            sources[op] = str(kernel_source(op, candidates.get(op)))
        except AstraError as e:
            sources[op] = f"MISSING ({e})"
    try:
        nvcc = find_nvcc()
    except AstraError as e:
        nvcc = f"not found ({e})"
    env = {cfg.ENV_OPS: ",".join(ops) if ops else "none", cfg.ENV_COUNTER_DIR: str(cdir), cfg.ENV_SELF_CHECK: self_check}
    cmd = [python_exe, "-m", "sglang.launch_server", *server_args]
    if as_json:
        click.echo(json.dumps({
            "ops": ops,
            "kernels": sources,
            "nvcc": nvcc,
            "discovery": json.loads(disc.to_json()) if disc else None,
            "env": env,
            "command": cmd,
        }, indent=1))
        return
    if disc is not None:
        click.echo(format_report(disc, ops, _jit_methods(ops)))
    click.echo("\nkernels:")
    for op in ops:
        click.echo(f"  {op}: {sources[op]}")
    click.echo(f"build: nvcc {nvcc}; -O3 -std=c++17 -gencode for {arch or 'the local GPU'}")
    click.echo("\nwould run: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd))
    click.echo("(dry run: nothing built, nothing started)")


# ---------------------------------------------------------------------- validate
@click.command("validate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--ops", "ops_text", default="all", show_default=True, help="Comma-separated ops or 'all'.")
@click.option("--candidate", "candidate_items", multiple=True, metavar="OP=FILE.cu",
              help="Validate this kernel instead of kernels/OP/kernel.cu (repeatable).")
@click.option("--dtypes", default=None, help="Comma-separated (default: fp16,bf16 where the op has them, "
              "else its own, e.g. int32).")
@click.option("--shapes", default="validate", show_default=True,
              help="'validate' (decode + prefill + edge samples), a spec tag (paper, decode, prefill, edge), or AxB,...")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the results here too.")
def validate_cmd(ops_text, candidate_items, dtypes, shapes, seed, json_out):
    """Run SGLang's own layers (SiluAndMul, RMSNorm with residual, merge_state) with and without the patch."""
    from .validate import format_results, validate

    ops = _ops(ops_text)
    if not ops:
        raise AstraError("--ops none: nothing to validate")
    dts = [d.strip() for d in dtypes.split(",") if d.strip()] if dtypes else None
    from .validate import build_cases

    build_cases(ops, dts, shapes)  # an unknown dtype or shape selector is named before anything else
    from astra_sglang.preconditions import require
    require("sglang", "gpu", "cuda_torch")
    results = validate(ops, candidates=_candidates(candidate_items), dtypes=dts, shapes=shapes, seed=seed,
                       progress=_progress)
    click.echo(format_results(results))
    if json_out:
        Path(json_out).write_text(json.dumps([r.__dict__ for r in results], indent=1, default=str))
    failed = [r for r in results if not r.ok]
    if failed:
        raise AstraError(f"{len(failed)} of {len(results)} validation case(s) failed")
