"""The `astra-sglang` command line. Every stage is a subcommand; every failure is one line."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from .errors import AstraError


def _progress(msg: str) -> None:
    click.echo(f"  · {msg}", err=True)


# Subcommands living in other modules, imported only when used (each stage owns its module).
LAZY_COMMANDS = {
    "check": "astra_sglang.check_cli:check_cmd",
    "bench": "astra_sglang.check_cli:bench_cmd",
    "optimize": "astra_sglang.agents.cli:optimize_cmd",
    "patch": "astra_sglang.patch.cli:patch_cmd",
    "validate": "astra_sglang.patch.cli:validate_cmd",
    "e2e": "astra_sglang.e2e.cli:e2e_cmd",
    "ops": "astra_sglang.ops_cli:ops_cmd",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        import importlib.util

        def present(target: str) -> bool:
            try:
                return importlib.util.find_spec(target.split(":")[0]) is not None
            except ImportError:
                return False

        lazy = {n for n, t in LAZY_COMMANDS.items() if present(t)}
        return sorted(set(super().list_commands(ctx)) | lazy)

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            import importlib

            mod, attr = LAZY_COMMANDS[name].split(":")
            try:
                return getattr(importlib.import_module(mod), attr)
            except ImportError as e:
                raise AstraError(f"`{name}` is unavailable: {e}") from e
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="astra-sglang")
def cli() -> None:
    """Extract SGLang's production kernels, optimize them, and patch them back into SGLang."""


@cli.command()
@click.argument("op", required=False)
@click.option("--list", "list_", is_flag=True, help="List ops and the variants the given/installed SGLang has.")
@click.option("--variant", help="Production path to extract (default: what SGLang runs for the common case).")
@click.option("--out", "out_root", type=click.Path(path_type=Path), default=Path("astra-work"), show_default=True,
              help="Workspace root; the op lands in OUT/<op>.")
@click.option("--sglang-src", type=click.Path(path_type=Path), help="SGLang git checkout or unpacked sglang wheel.")
@click.option("--flashinfer-src", type=click.Path(path_type=Path), help="FlashInfer checkout or unpacked wheel.")
@click.option("--tvm-ffi-src", type=click.Path(path_type=Path), help="apache-tvm-ffi install or unpacked wheel.")
@click.option("--arch", help="Target arch, e.g. sm_90 (default: the local GPU's).")
@click.option("--force", is_flag=True, help="Overwrite an existing workspace.")
@click.option("--no-build", is_flag=True, help="Only write the workspace; skip the test build.")
def extract(op, list_, variant, out_root, sglang_src, flashinfer_src, tvm_ffi_src, arch, force, no_build):
    """Pull OP's production CUDA kernel into a standalone workspace that builds with nvcc alone."""
    from .build import detect_arch, parse_arch
    from .registry import get_op, op_names
    from astra_sglang.extract import available_variants, discover, extract as do_extract
    from .workspace import Workspace

    sources = discover(sglang_src, flashinfer_src, tvm_ffi_src)
    if list_:
        for r in sources.roots.values():
            click.echo(f"source {r.name:16s} {r.version:14s} {r.origin:9s} {r.base}")
        for name in ([op] if op else op_names()):
            spec = get_op(name)
            default = spec.default_variant({n: True for n in sources.roots})
            click.echo(f"{name}")
            for v, ok, why in available_variants(spec, sources):
                mark = "*" if v.name == default else " "
                state = "available" if ok else f"unavailable ({why})"
                click.echo(f"  {mark} {v.name:12s} {state}: {v.provenance}")
        return
    if not op:
        raise AstraError(f"give an op to extract (one of: {', '.join(op_names())}) or --list")
    spec = get_op(op)
    target = parse_arch(arch) if arch else detect_arch()
    dest = out_root / op
    click.echo(f"extracting {op} for {target.sm} into {dest}", err=True)
    do_extract(spec, sources, dest, target, variant=variant, force=force, progress=_progress)
    if no_build:
        click.echo(str(dest))
        return
    ws = Workspace.open(op, path=dest)
    res = ws.build()
    if not res.ok:
        from .build import first_error_line

        raise AstraError(f"the extracted baseline does not compile: {first_error_line(res.log)} (log: {dest}/build)")
    click.echo(f"  · cold build {res.seconds:.1f}s -> {res.library}", err=True)
    click.echo(str(dest))


def main(argv: Optional[list] = None) -> None:
    try:
        cli.main(args=argv, standalone_mode=False)
    except AstraError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
