"""e2e/device_install.sh on the CPU: `astra` reinstalls astra-sglang alone from the repo into an existing site (servers
and step workers import astra from there, so an edit made after `install` reaches them only through it); bad input is
one error line and exit 2. The wheelhouse `install` itself needs the GPU node's staged parts (not run here)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "e2e" / "device_install.sh"


def _run(*args, cwd=None):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_astra_reinstalls_the_repo_into_an_existing_site(tmp_path):
    site = tmp_path / "site"
    (site / "astra_sglang" / "kernels" / "moe_gate").mkdir(parents=True)
    stale = site / "astra_sglang" / "kernels" / "moe_gate" / "kernel.cu"
    stale.write_text("// an older kernel\n")
    r = _run("astra", str(site))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "astra-sglang installed into" in r.stdout
    assert stale.read_text() == (ROOT / "kernels" / "moe_gate" / "kernel.cu").read_text()
    assert (site / "astra_sglang" / "kernels" / "moe_gate" / "adapter.py").is_file()


def test_bad_input_is_one_error_line(tmp_path):
    r = _run("astra", str(tmp_path / "absent"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: ")
    assert "run 'install' first" in r.stderr
    r = _run("bogus")
    assert r.returncode == 2 and r.stderr.startswith("error: unknown command bogus")


def test_ensure_on_a_warm_site_reinstalls_astra_alone(tmp_path):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)  # SGLang already installed there: no wheelhouse needed
    r = _run("ensure", str(tmp_path / "no-wheels"), str(site))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "astra-sglang installed into" in r.stdout
    assert (site / "astra_sglang" / "kernels" / "moe_gate" / "kernel.cu").is_file()
    assert not (tmp_path / "site.log").exists()


def test_ensure_without_a_staged_wheelhouse_fails_in_one_error_line(tmp_path):
    site = tmp_path / "site"
    r = _run("ensure", str(tmp_path / "no-wheels"), str(site))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: installing the wheelhouse")
    assert (tmp_path / "site.log").is_file() and not (site / "astra_sglang").exists()
