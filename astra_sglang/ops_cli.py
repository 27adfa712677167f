"""`astra-sglang ops`: every op the registry finds, and which of its parts exist.

An op is complete when its folder holds all of: extract variants (spec + launch templates), a
shipped kernel, a patch adapter and a validate layer. Whatever is missing is named, never hidden.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import click


def op_rows() -> List[Dict[str, Any]]:
    from .registry import has_part, get_op, op_dir, op_names, op_part, shipped_kernel

    rows = []
    for name in op_names():
        spec = get_op(name)
        d = op_dir(name)
        # an installed variant (SGLang's callable is production) has no launcher to ship
        launchers = [v.name for v in spec.variants if v.installed or (d / v.launcher).is_file()]
        row: Dict[str, Any] = {
            "op": name,
            "summary": spec.summary,
            "extract": [v.name for v in spec.variants],
            "extract_missing_launchers": [v.launcher for v in spec.variants if v.name not in launchers],
            "kernel": shipped_kernel(name).is_file(),
            "patch": [],
            "validate": has_part(name, "layer"),
        }
        if has_part(name, "adapter"):
            ad = op_part(name, "adapter").ADAPTER
            jit = [f"{f}:{r.method}" for f, rs in ad.jit_routes.items() for r in rs]
            row["patch"] = list(spec.replaces) + jit
            row["default_off"] = getattr(op_part(name, "adapter"), "DEFAULT_OFF", "")
        row["missing"] = [what for what, ok in (
            ("extract", bool(row["extract"]) and not row["extract_missing_launchers"]),
            ("kernel", row["kernel"]), ("patch", bool(row["patch"])), ("validate", row["validate"])) if not ok]
        rows.append(row)
    return rows


@click.command("ops")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def ops_cmd(as_json: bool) -> None:
    """List every op: extract variants, shipped kernel, patched SGLang callables, validate layer."""
    rows = op_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    w = max([24] + [len(r["op"]) for r in rows])  # the op column fits the longest name
    click.echo(f"{'op':{w}s} {'extract':22s} {'kernel':6s} {'validate':8s} patches")
    for r in rows:
        click.echo(f"{r['op']:{w}s} {','.join(r['extract']) or '-':22s} {'yes' if r['kernel'] else 'no':6s} "
                   f"{'yes' if r['validate'] else 'no':8s} {', '.join(r['patch']) or '-'}")
        if r.get("default_off"):
            click.echo(f"{'':{w}s} not in --ops all: {r['default_off']}")
        if r["missing"]:
            click.echo(f"{'':{w}s} missing: {', '.join(r['missing'])}")
