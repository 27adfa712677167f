#!/usr/bin/env bash
# The norm/activation family's GPU record (issue 14, helper E1): `astra-sglang check` and `astra-sglang bench`
# of each shipped kernel against its extracted production kernel, on one GPU, in one device call.
#
# Run from the repository root of a copy that carries astra-work/e1/ (git-ignored):
#   astra-work/e1/src  a `git archive` snapshot of the commit the numbers belong to (isolates the run
#                      from uncommitted edits in a shared working tree)
#   astra-work/e1/ws   the workspaces `extract` wrote for sm_90 from the sglang 0.5.23 / flashinfer-python
#                      0.7.2 / apache-tvm-ffi 0.1.11 wheels, with their baselines and kernel.cu prebuilt;
#                      they are copied to /tmp/e1ws, the path they were built at (the build cache key holds
#                      the absolute include paths), so nothing compiles on the device.
#   DEADLINE=seconds   phases that would start later are skipped and said so (device budget).
# Results: $OUT/<op>/{check,decode,prefill}.json + .png, $OUT/run.log.
#
# Preparing astra-work/e1 on a CPU machine with nvcc (the wheels from tests/conftest.py's cache):
#   PREP=1 bash results/2026-11-23-h200/kernels/norm_family_gpu_run.sh
set -uo pipefail
# The snapshot as the astra_sglang package, ahead of any install a machine already has; python runs from a
# neutral directory (it puts the current directory first on sys.path, and the snapshot's own
# astra_sglang/ folder lacks the kernels/extract/patch mapping).
farm() {
  SRC=$(cd astra-work/e1/src && pwd)
  F=/tmp/e1farm/astra_sglang; rm -rf /tmp/e1farm; mkdir -p $F
  for f in "$SRC"/astra_sglang/*; do ln -sfn "$f" $F/; done
  for d in extract kernels patch e2e; do ln -sfn "$SRC/$d" "$F/$d"; done
  export PYTHONPATH=/tmp/e1farm PYTHONUNBUFFERED=1 ASTRA_CACHE_DIR=/tmp/e1-astra-cache
  mkdir -p /tmp/e1run && cd /tmp/e1run
}
if [ "${PREP:-0}" = 1 ]; then
  rm -rf astra-work/e1 /tmp/e1ws && mkdir -p astra-work/e1/src
  git archive HEAD | tar -x -C astra-work/e1/src && git rev-parse HEAD > astra-work/e1/src/COMMIT
  REPO=$PWD; farm
  SRC=$SRC python3 - <<'PY' && cp -r /tmp/e1ws "$REPO/astra-work/e1/ws"
import os
from pathlib import Path
from astra_sglang.build import Arch
from astra_sglang.extract import discover, extract
from astra_sglang.registry import get_op
from astra_sglang.build.workspace import Workspace
C = Path.home() / ".cache/astra-sglang-tests"
roots = discover(C / "sglang", C / "flashinfer", C / "tvm")
for op, variant in [("rmsnorm", "flashinfer"), ("gemma_rmsnorm", "flashinfer"), ("gemma_fused_add_rmsnorm", "flashinfer"),
                    ("gelu_tanh_and_mul", "jit"), ("gelu_and_mul", "jit")]:
    dest = Path("/tmp/e1ws") / variant / op
    extract(get_op(op), roots, dest, Arch(9, 0), variant=variant)
    ws = Workspace.open(op, path=dest)
    print(op, ws.build().ok, ws.build(Path(os.environ["SRC"]) / "kernels" / op / "kernel.cu").ok)  # prebuilt
PY
  exit $?
fi
DEADLINE=${DEADLINE:-200}
OUT=${OUT:-./e1-gpu-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
rm -rf /tmp/e1ws && cp -r astra-work/e1/ws /tmp/e1ws
farm
AS="python3 -m astra_sglang.cli"
python3 -c "import astra_sglang.kernels as k; print('astra_sglang from', k.__file__)"
declare -A VARIANT=([rmsnorm]=flashinfer [gemma_rmsnorm]=flashinfer [gemma_fused_add_rmsnorm]=flashinfer
                    [gelu_tanh_and_mul]=jit [gelu_and_mul]=jit)
OPS=${OPS:-rmsnorm gemma_fused_add_rmsnorm gemma_rmsnorm gelu_tanh_and_mul gelu_and_mul}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__)"; echo "snapshot of commit $(cat "$SRC/COMMIT")"; } | tee "$OUT/env.txt"
status=0
for ph in check decode prefill; do
  for op in $OPS; do
    ws=/tmp/e1ws/${VARIANT[$op]}/$op; mkdir -p "$OUT/$op"
    cand=(--workspace "$ws" --candidate "$SRC/kernels/$op/kernel.cu")
    need=$([ $ph = check ] && echo 12 || echo 15)
    if [ "$(left)" -lt "$need" ]; then t "SKIP $ph $op (device budget: $(left)s left)"; continue; fi
    t "$ph $op"
    case $ph in
      check) timeout $(left) $AS check $op "${cand[@]}" --dtype fp16,bf16 --json "$OUT/$op/check.json" || status=1 ;;
      *) timeout $(left) $AS bench $op "${cand[@]}" --shapes $ph --replays 5 --out "$OUT/$op/$ph.json" || status=1 ;;
    esac
  done
done
t "done (status $status)"
exit $status
