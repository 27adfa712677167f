"""The layout's promises: a new op is one new folder under kernels/, and every measured record lives in
one tree, results/<YYYY-MM-DD>-<gpu>/<stage>/, linked from where it is cited and never shipped.

The first test is issue 11's done-criterion, literally: copy kernels/silu_and_mul/ to a new folder,
rename the op inside that folder alone, `pip install .` (not editable) into a fresh venv, and
`astra-sglang ops --json` lists the new op with extract, kernel, patch and validate all present.
It takes seconds: the venv has no pip of its own and no downloads; it sees this interpreter's
site-packages (pip, setuptools, click, libcst) through a .pth line, after its own.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NEW_OP = "astra_layout_probe_op"
# what `pip install .` reads: the package folders, their metadata and the README pyproject names
SHIPPED = ("pyproject.toml", "setup.py", "README.md", "astra_sglang", "extract", "patch", "e2e", "kernels")
DATE_GPU = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9]+$")
MEASURED = {".json", ".png", ".log", ".jsonl", ".xz", ".tgz", ".ncu-rep"}


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.so", "*.o")
    dest.mkdir(parents=True)
    for name in SHIPPED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def _fresh_venv(where: Path) -> Path:
    """A venv without pip of its own; this interpreter's site-packages come after its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    py = where / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "zz_outer_site.pth").write_text("".join(p + "\n" for p in outer))
    return py


def _offline_build_ok() -> bool:
    """setuptools >= 70.1 builds wheels by itself (no `wheel` package): no index needed."""
    try:
        import setuptools
        from packaging.version import Version

        return Version(setuptools.__version__) >= Version("70.1")
    except Exception:
        return False


def test_a_new_op_is_one_folder(tmp_path):
    repo = tmp_path / "repo"
    _copy_tree(repo)
    src, new = repo / "kernels" / "silu_and_mul", repo / "kernels" / NEW_OP
    shutil.copytree(src, new)
    for f in new.rglob("*"):
        if f.is_file():
            text = f.read_text()
            f.write_text(text.replace("silu_and_mul", NEW_OP))
    py = _fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    offline = _offline_build_ok()
    how = ["--no-build-isolation", "--no-index"] if offline else []  # else pip fetches setuptools
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", *how, str(repo)], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path), timeout=600)
    if p.returncode and not offline and re.search(r"(?i)no matching distribution|connection|network", p.stderr):
        pytest.skip("no setuptools>=70.1 here and no package index reachable to build the wheel")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    cli = tmp_path / "venv" / "bin" / "astra-sglang"
    p = subprocess.run([str(cli), "ops", "--json"], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = {r["op"]: r for r in json.loads(p.stdout)}
    row = rows.get(NEW_OP)
    assert row is not None, sorted(rows)
    assert row["extract"] == rows["silu_and_mul"]["extract"] and not row["extract_missing_launchers"]
    assert row["kernel"] and row["validate"] and row["missing"] == []
    assert f"sgl_kernel:{NEW_OP}" in row["patch"]
    # it came from the wheel installed in the venv, not from this checkout
    where = subprocess.run([str(py), "-c", "import astra_sglang.kernels as k; print(k.__file__)"],
                           capture_output=True, text=True, env=env, cwd=str(tmp_path), check=True).stdout.strip()
    installed = Path(where).parent
    assert installed.is_relative_to(tmp_path / "venv"), where
    assert (installed / NEW_OP / "kernel.cu").is_file()
    # nothing measured ships in the wheel
    shipped = [f.relative_to(installed) for f in installed.rglob("*") if f.is_file()]
    assert not [f for f in shipped if f.suffix in MEASURED or f.name in ("RESULTS.md", "BASELINE_GPU.md")], shipped


def test_every_op_folder_is_a_package():
    """setup.py installs the folders that hold an __init__.py; an op folder without one still imports from a checkout
    (a namespace package) but is missing from an installed astra-sglang: a GPU machine's site then said "unknown op"
    (2026-12-01, moe_topk_experts' first device run)."""
    ops = [d for d in (ROOT / "kernels").iterdir() if (d / "spec.py").is_file()]
    assert ops and not [d.name for d in ops if not (d / "__init__.py").is_file()]


def _tracked():
    p = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        pytest.skip("not a git checkout")
    return [Path(x) for x in p.stdout.splitlines() if (ROOT / x).exists()]


def test_measured_records_live_in_one_tree():
    files = _tracked()
    stray = [str(f) for f in files if f.parts[0] != "results" and ("results" in f.parts[:-1] or "logs" in f.parts[:-1]
                                                                  or f.name == "BASELINE_GPU.md")]
    assert not stray, f"measured records outside results/<date>-<gpu>/<stage>/: {stray}"
    top = {f.parts[1] for f in files if f.parts[0] == "results" and len(f.parts) > 2}
    assert top and all(DATE_GPU.match(d) for d in top), sorted(top)
    loose = [str(f) for f in files if f.parts[0] == "results" and len(f.parts) == 2 and f.name != "README.md"]
    assert not loose, loose


def test_records_cited_in_docs_exist():
    """Every results/<date>-<gpu>/... path a RESULTS.md or README cites exists (links and backticked paths)."""
    docs = [ROOT / "README.md", ROOT / "e2e" / "RESULTS.md", *sorted((ROOT / "kernels").glob("*/RESULTS.md"))]
    cite = re.compile(r"results/\d{4}-\d{2}-\d{2}-[a-z0-9]+(?:/[\w.+-]+)*/?")
    missing = []
    for doc in docs:
        for m in cite.finditer(doc.read_text() if doc.exists() else ""):
            path = m.group(0).rstrip(".")
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, missing


def test_large_json_records_are_kept_compressed():
    """Every GPU call carries the whole tracked tree (64 MiB with the wheels, results/README.md): a JSON record over
    10 KB is kept as NAME.json.xz. The tree was 57.7 MB on 2026-11-27, 54 MB of it results/, and left room for wheel
    parts of 5.6 MiB only; at 50 KB it was 49.4 MB on 2026-11-29 (339 plain records of 10-50 KB, 7.5 MB)."""
    big = [f"{f} ({(ROOT / f).stat().st_size // 1000} KB)" for f in _tracked()
           if f.parts[0] == "results" and f.suffix == ".json" and (ROOT / f).stat().st_size > 10_000]
    assert not big, ("compress these with `xz -9e PATH` and point their links at PATH.xz: " + ", ".join(big))
