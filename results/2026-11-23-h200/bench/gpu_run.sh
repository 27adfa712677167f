#!/usr/bin/env bash
# Issue 12 on the GPU: cheating candidates rejected by check's dynamic cases and by bench's timed-graph
# re-check; the shipped kernels of silu_and_mul and fused_add_rmsnorm pass check and bench on decode
# shapes, in-context and chained speedups side by side. Workspaces come pre-extracted in astra-work/
# (extract --arch sm_90 --no-build from sglang 0.5.23 / flashinfer 0.7.2 / apache-tvm-ffi 0.1.11).
# Run from the repo root with OUT set: bash results/2026-11-23-h200/bench/gpu_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 ASTRA_CACHE_DIR=/tmp/astra-cache ASTRA_TEST_WORKSPACES=$PWD/astra-work ASTRA_RESULTS_DIR=$OUT/records
export ASTRA_TEST_SHAPES_silu_and_mul=${ASTRA_TEST_SHAPES_silu_and_mul:-16x14336,64x14336,256x14336,1024x14336}
export ASTRA_TEST_SHAPES_fused_add_rmsnorm=${ASTRA_TEST_SHAPES_fused_add_rmsnorm:-16x4096,64x4096,256x4096,1024x4096}
mkdir -p $OUT/records
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1;
  python -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > $OUT/env.txt 2>&1
# a plain (non-editable) install: the machine's setuptools makes an editable install without the
# package-dir mapping (astra_sglang.kernels missing); python runs from /tmp so the checkout's
# astra_sglang/ does not shadow the installed package
pip install -q --no-deps --no-build-isolation --target /tmp/astra . > $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/astra REPO=$PWD
# every library the tests need, built in parallel first (nvcc is the slow part)
(cd /tmp && python - > $OUT/prebuild.log 2>&1) <<'PY'
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from astra_sglang.build.workspace import Workspace
from astra_sglang.harness.timer import build_helpers
jobs = [("silu_and_mul", None), ("fused_add_rmsnorm", None), ("silu_and_mul", "kernels/silu_and_mul/kernel.cu"),
        ("fused_add_rmsnorm", "kernels/fused_add_rmsnorm/kernel.cu")]
jobs += [("silu_and_mul", f"tests/bad_candidates/{n}.cu") for n in ("cheat_capture_skip", "cheat_early_exit_time",
                                                                     "cheat_ignore_stream", "cheat_pointer_memo")]
def one(j):
    import os
    repo = Path(os.environ["REPO"])
    ws = Workspace.open(j[0], path=repo / "astra-work" / j[0])
    r = ws.build(repo / j[1] if j[1] else None)
    return j, r.ok, round(r.seconds, 1)
with ThreadPoolExecutor(12) as ex:
    futs = [ex.submit(one, j) for j in jobs] + [ex.submit(build_helpers, "sm_90")]
    for f in futs:
        print(f.result())
PY
(cd /tmp && timeout 165 python -m pytest -q -rA -p no:cacheprovider --rootdir $REPO $REPO/tests/test_check_bad_candidates.py \
  -k "dynamic or capture_cheat or shipped_kernel_passes" > $OUT/pytest.log 2>&1)
echo "pytest rc=$?" >> $OUT/pytest.log
tail -25 $OUT/pytest.log
for f in $OUT/records/bench-*.txt; do echo "== $f"; cat $f; done
