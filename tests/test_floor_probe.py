"""kernels/dev/floor_probe.py on the CPU: bad arguments and a missing GPU are one error line and exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[1] / "kernels" / "dev" / "floor_probe.py"


@pytest.mark.parametrize("args,msg", [(["--hidden", "4096,x"], "comma-separated integers"),
                                      ([], "no CUDA GPU")])
def test_floor_probe_refuses_with_one_error_line(args, msg):
    torch = pytest.importorskip("torch")
    if not args and torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe would run")
    r = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [next(
        ln for ln in r.stderr.splitlines() if ln.startswith("error:"))] and msg in r.stderr
