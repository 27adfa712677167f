"""An op adapter's module attribute as a fresh process imports it under an environment variable: the adapters read
their dev switches at import (a worker's environment), so a test asks a new interpreter, not a reloaded module."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional


def adapter_attr_under_env(op: str, attr: str, name: str, value: Optional[str]) -> str:
    """str(adapter.ATTR) printed by a new interpreter with NAME=VALUE (NAME unset where VALUE is None)."""
    env = {k: v for k, v in os.environ.items() if k != name}
    if value is not None:
        env[name] = value
    r = subprocess.run([sys.executable, "-c", f"from astra_sglang.registry import op_part; "
                        f"print(op_part({op!r}, 'adapter').{attr})"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()
