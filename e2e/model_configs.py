"""Model configs shipped with the package (e2e/configs/<name>/config.json, no weights).

`--model-path` takes a directory, or the name of a shipped config (`llama3-8b`), so the e2e,
profile and step commands work from an installed wheel as well as from a checkout.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from astra_sglang.errors import AstraError

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> List[str]:
    return sorted(d.name for d in CONFIGS_DIR.iterdir() if (d / "config.json").is_file())


def resolve_model_path(model_path: str) -> Path:
    """A directory with config.json, or a shipped config's name -> its absolute directory."""
    p = Path(model_path)
    shipped = CONFIGS_DIR / model_path
    if p.is_dir() and ((p / "config.json").is_file() or not (shipped / "config.json").is_file()):
        return p.resolve()
    if "/" not in model_path and (shipped / "config.json").is_file():
        return shipped
    raise AstraError(f"--model-path {model_path}: no such directory or shipped config "
                     f"(shipped: {', '.join(shipped_configs())})")
