"""kernels/dev/moe_router_chain.py on the CPU: bad arguments and a missing GPU are one error line and exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "kernels" / "dev" / "moe_router_chain.py"


@pytest.mark.parametrize("args,msg", [(["--tokens", "1,x"], "comma-separated positive integers"),
                                      (["--tokens", "0"], "comma-separated positive integers"),
                                      ([], "no CUDA GPU")])
def test_moe_router_chain_refuses_with_one_error_line(args, msg):
    torch = pytest.importorskip("torch")
    if not args and torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run")
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [next(
        ln for ln in r.stderr.splitlines() if ln.startswith("error:"))] and msg in r.stderr
