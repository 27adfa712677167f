"""The shipped kernels, built as patch builds them, export their ABI entry point and nothing shared.

A function-local static in an inline or template function (an occupancy cache, the "smem attribute
already raised" flag) becomes a GNU-unique symbol in a shared library; every library loaded into one
process then shares one copy.  `check` loads the production kernel and a candidate into one worker,
and development sweeps loaded several builds of one kernel.cu: a later build trusted the flag a first build
had set for its own kernel and launched without raising the limit (rc=invalid value, seen on the
H200, 2026-11-22).  The kernels keep their internals in an anonymous namespace; this keeps it so.
"""
import os
import shutil
import subprocess

import pytest

from astra_sglang.registry import op_names, shipped_kernel

# every op folder that ships a kernel.cu (a new op is covered without an edit here)
OPS = [op for op in op_names() if shipped_kernel(op).is_file()]


@pytest.mark.nvcc
@pytest.mark.parametrize("op", OPS)
def test_shipped_kernel_exports_only_its_entry_point(op, tmp_path, monkeypatch):
    if not shutil.which("nm"):
        pytest.skip("needs binutils nm")
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    from astra_sglang.patch.apply import build_kernel

    lib = build_kernel(op, arch="sm_90")
    assert os.path.getsize(lib) > 0
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    kinds = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            kinds.setdefault(parts[1], []).append(parts[2])
    assert "u" not in kinds, f"GNU-unique symbols in {op}: {kinds['u'][:3]}"
    assert kinds.get("T") == [f"astra_{op}"], kinds.get("T")
