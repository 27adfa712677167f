"""Writing the plots every stage makes (bench, step, server A/B, profile, agents' reports).

Plots are kept beside their JSON records under results/, and every GPU call carries the whole tracked tree (64 MiB
with the wheels, results/README.md), so they are written as 256-colour palette PNGs: matplotlib's flat fills and
text survive the palette, at about 40% of the RGBA file's size (2026-11-28: 14.2 MB of plots in results/ -> 5.5 MB)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Union


def save_figure(fig: Any, path: Union[str, Path], dpi: int = 110) -> Path:
    """fig.savefig(path) as a palette PNG (a plain PNG where Pillow is missing); returns the path."""
    p = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    p.write_bytes(compact_png(buf.getvalue()))
    return p


def compact_png(data: bytes) -> bytes:
    """A PNG's bytes as a 256-colour palette PNG, or unchanged where Pillow is missing or it would not be smaller."""
    try:
        from PIL import Image
    except ImportError:
        return data
    with Image.open(io.BytesIO(data)) as im:
        out = io.BytesIO()
        im.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
    small = out.getvalue()
    return small if len(small) < len(data) else data
