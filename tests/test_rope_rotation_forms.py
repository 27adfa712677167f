"""The rotary kernels build the rotation exactly as the H200 checks found bit-identical to SGLang 0.5.17's JIT rope.

Where nvcc contracts `x * c - y * s` into an fma depends on the code around it, so each kernel spells the form out
(ASTRA_ROPE_X / ASTRA_ROPE_Y; X=1 Y=2, results/2026-11-27-h200/session8 call D). The fused q/k norm + rope kernels
also round the normed value to the storage dtype before rotating it, as production's two kernels do
(ASTRA_QKN_ROUND=1): with it qknorm_rope went from 0 to 100 of 100 comparisons bit-identical and qknorm_rope_store
from 52 to 208 of 208 (results/2026-11-27-h200/session9 call A). Here the default build's PTX is compared with the
build that names those forms, and with the old one, so an edit cannot drift from what was measured unnoticed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from astra_sglang.registry import shipped_kernel

MEASURED = ("-DASTRA_ROPE_X=1", "-DASTRA_ROPE_Y=2")
# (op, extra defines of the measured form, defines of a form that must build differently)
CASES = [
    ("dense_rope_store", (), ("-DASTRA_ROPE_X=2", "-DASTRA_ROPE_Y=1")),
    ("rope", (), ("-DASTRA_ROPE_X=3", "-DASTRA_ROPE_Y=3")),
    ("rope_store", (), ("-DASTRA_ROPE_X=3", "-DASTRA_ROPE_Y=3")),
    ("qknorm_rope", ("-DASTRA_QKN_ROUND=1",), ("-DASTRA_QKN_ROUND=0",)),
    ("qknorm_rope_store", ("-DASTRA_QKN_ROUND=1",), ("-DASTRA_QKN_ROUND=0",)),
]


def _nvcc() -> str:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("needs nvcc")
    return nvcc


@pytest.mark.nvcc
@pytest.mark.parametrize("op,measured,other", CASES, ids=[c[0] for c in CASES])
def test_the_shipped_rotation_is_the_form_measured_bit_identical(op, measured, other, tmp_path):
    nvcc, src = _nvcc(), Path(shipped_kernel(op))

    def ptx(*defs: str) -> str:
        out = tmp_path / f"k{len(list(tmp_path.iterdir()))}.ptx"
        subprocess.run([nvcc, "-arch=sm_90a", "-O3", "-std=c++17", "-ptx", *defs, str(src), "-o", str(out)],
                       check=True, capture_output=True, timeout=300)
        return "\n".join(line for line in out.read_text().splitlines() if not line.startswith("//"))

    shipped = ptx()
    assert shipped == ptx(*MEASURED, *measured)
    assert shipped != ptx(*MEASURED, *other)
