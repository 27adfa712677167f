"""The `astra-sglang` command line. Every stage is a subcommand; every failure is one line."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import click

from .errors import AstraError


def _progress(msg: str) -> None:
    click.echo(f"  · {msg}", err=True)


# Subcommands living in other modules, imported only when used (each stage owns its module).
LAZY_COMMANDS = {
    "check": "astra_sglang.harness.cli:check_cmd",
    "bench": "astra_sglang.harness.cli:bench_cmd",
    "optimize": "astra_sglang.agents.cli:optimize_cmd",
    "patch": "astra_sglang.patch.cli:patch_cmd",
    "validate": "astra_sglang.patch.cli:validate_cmd",
    "e2e": "astra_sglang.e2e.cli:e2e_cmd",
    "profile": "astra_sglang.e2e.profile_cli:profile_cmd",
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
@click.option("--list", "list_", is_flag=True, help="List ops, their variants, and the sources found (and where from).")
@click.option("--variant", help="Production path to extract (default: what SGLang runs for the common case).")
@click.option("--out", "out_root", type=click.Path(path_type=Path), default=Path("astra-work"), show_default=True,
              help="Workspace root; the op lands in OUT/<op>.")
@click.option("--sglang-src", type=click.Path(path_type=Path), help="SGLang git checkout or unpacked sglang wheel.")
@click.option("--flashinfer-src", type=click.Path(path_type=Path), help="FlashInfer checkout or unpacked wheel.")
@click.option("--tvm-ffi-src", type=click.Path(path_type=Path), help="apache-tvm-ffi install or unpacked wheel.")
@click.option("--download", is_flag=True,
              help="Fetch the sglang, flashinfer-python and apache-tvm-ffi wheels of one SGLang release with pip "
                   "into the cache ($ASTRA_CACHE_DIR, default ~/.cache/astra-sglang) and extract from them.")
@click.option("--sglang", "sglang_version", metavar="VERSION",
              help="The SGLang release --download fetches (implies --download; default: the installed sglang's "
                   "version, else the newest).")
@click.option("--arch", help="Target arch, e.g. sm_90 (default: the local GPU's).")
@click.option("--force", is_flag=True, help="Overwrite an existing workspace.")
@click.option("--no-build", is_flag=True, help="Only write the workspace; skip the test build.")
def extract(op, list_, variant, out_root, sglang_src, flashinfer_src, tvm_ffi_src, download, sglang_version, arch,
            force, no_build):
    """Pull OP's production CUDA kernel into a standalone workspace that builds with nvcc alone.

    The workspace is written and built in a temporary folder beside OUT/<op> and moved into place
    only when everything succeeded."""
    from .build import detect_arch, find_nvcc, parse_arch
    from .preconditions import require
    from .registry import get_op, op_names
    from astra_sglang.extract import extractor as ex
    from astra_sglang.extract import download as dl
    from astra_sglang.extract.sources import discover, missing_roots

    # 1. the arguments, before the network, the GPU or the disk
    download = download or sglang_version is not None
    if sglang_version is not None:
        sglang_version = dl.check_version(sglang_version)
    if download and sglang_src is not None:
        raise AstraError("--download fetches SGLang's sources itself: give either --download/--sglang or --sglang-src")
    spec = get_op(op) if op else None
    if variant is not None:
        if spec is None:
            raise AstraError(f"--variant needs an op (one of: {', '.join(op_names())})")
        spec.variant(variant)
    if not op and not list_:
        raise AstraError(f"give an op to extract (one of: {', '.join(op_names())}) or --list")
    # the given source paths are checked here too (discover reads, never writes)
    local = discover(None if download else sglang_src, flashinfer_src, tvm_ffi_src)

    fetching = download and not (sglang_version and dl.cached(sglang_version))
    if list_:
        require(*(["pip"] if fetching else []))
        sources = _downloaded(dl, sglang_version, flashinfer_src, tvm_ffi_src) if download else local
        _list_sources(sources, dl)
        for name in ([op] if op else op_names()):
            s = get_op(name)
            default = s.default_variant({n: True for n in sources.roots})
            click.echo(f"{name}")
            for v, ok, why in ex.available_variants(s, sources):
                mark = "*" if v.name == default else " "
                state = "available" if ok else f"unavailable ({why})"
                click.echo(f"  {mark} {v.name:12s} {state}: {v.provenance}")
        return

    dest = out_root / op
    ex.check_dest(dest, force)
    target = [parse_arch(arch)] if arch else []

    def arch_need():  # no --arch: the local GPU's (nvidia-smi), and a missing GPU is a missing piece
        if not target:
            try:
                target.append(detect_arch())
            except AstraError as e:
                return list(e.messages)
        return None

    def sources_need():  # with --download the missing roots are what it fetches
        if download:
            return None
        v = ex.choose_variant(spec, local, variant)
        return missing_roots(local, v, f"{op} variant {v.name}")

    # 2. what extract needs, every missing piece at once (an installed variant needs no nvcc: nothing is built)
    installed = not download and ex.choose_variant(spec, local, variant).installed
    require(arch_need, *([] if installed else ["nvcc"]), sources_need, *(["pip"] if fetching else []))
    if not installed:
        ex.check_arch(find_nvcc(), target[0])

    # 3. the sources (downloaded: network), then the workspace, built before it moves into place
    click.echo(f"extracting {op} for {target[0].sm} into {dest}", err=True)
    sources = _downloaded(dl, sglang_version, flashinfer_src, tvm_ffi_src) if download else local
    built = []

    def build_in(tmp: Path) -> None:
        from .build import first_error_line
        from astra_sglang.build.workspace import Workspace
        from astra_sglang.extract.progress import ticker

        _progress("building the baseline with nvcc (a cold build takes seconds to a minute)")
        with ticker("nvcc"):
            res = Workspace.open(op, path=tmp).build()
        if not res.ok:
            import tempfile

            fd, log = tempfile.mkstemp(prefix=f"astra-extract-{op}-", suffix=".log")
            with os.fdopen(fd, "w") as f:
                f.write(res.log + "\n")
            raise AstraError(f"the extracted baseline does not compile: {first_error_line(res.log)} "
                             f"(nvcc log: {log}; {dest} is left as it was)")
        built.append((res, res.library.relative_to(tmp)))

    ex.extract(spec, sources, dest, target[0], variant=variant, force=force, progress=_progress,
               build=None if no_build or installed else build_in)
    if built:
        res, lib = built[0]
        click.echo(f"  · cold build {res.seconds:.1f}s -> {dest / lib}", err=True)
    click.echo(str(dest))


def _downloaded(dl, version, flashinfer_src, tvm_ffi_src):
    """Sources from the downloaded wheels of `version`; --flashinfer-src / --tvm-ffi-src still win."""
    from astra_sglang.extract.sources import discover, mark_downloaded

    got = dl.fetch(version, progress=_progress)
    s = discover(got["sglang"].path, flashinfer_src or got["flashinfer"].path, tvm_ffi_src or got["tvm"].path)
    return mark_downloaded(s, got, dl.describe)


# What --list says about a source root it did not find.
_NOT_FOUND = {
    "sglang_jit": "--download fetches it; or `pip install sglang`, --sglang-src",
    "flashinfer": "--download fetches it; or `pip install flashinfer-python`, --flashinfer-src",
    "tvm_ffi": "--download fetches it; or `pip install apache-tvm-ffi`, --tvm-ffi-src",
    "sglang_checkout": "only merge_state's sgl_kernel variant needs it: --sglang-src PATH/TO/checkout",
}


def _list_sources(sources, dl) -> None:
    for r in sources.roots.values():
        click.echo(f"source {r.name:16s} {r.version:14s} {r.origin:9s} {r.base}"
                   + (f"  <- {r.detail}" if r.detail else ""))
    for name, hint in _NOT_FOUND.items():
        if name not in sources.roots:
            click.echo(f"source {name:16s} {'-':14s} {'not found':9s} ({hint})")
    cached = dl.listing()
    if cached:
        click.echo(f"cached downloads: sglang {', '.join(cached)} in {dl.sources_dir()} "
                   "(--sglang VERSION takes one without the network)")


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
