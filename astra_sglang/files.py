"""Whole-file writes: a file other processes read while it changes (bench's report, the exported patch plan, the
profile's metadata, the ceiling cache, a patched process's counter metadata) is written to a temporary beside it and renamed over it, so a reader, or a run
killed mid-write, finds the old file or the new one, never half of one."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Union


def write_whole(path: Union[str, Path], text: str) -> Path:
    """`text` at `path` (its folder made if missing), replaced in one rename; the temporary is named for this process
    and thread, so concurrent writers never share one, and removed if the write fails."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
