#!/bin/bash
# 2026-11-27 (H200, eighth session), call A: check + decode corpus in fp16 of gemma_fused_add_rmsnorm and qknorm
# (never run in fp16), then the decode corpus (bf16, in context) of the norm/activation family that misses issue
# 14's 1.3x, now with the in-context floor (bench's touch kernel) beside every row: how much any kernel could gain.
# From the repository root on the GPU machine after staging the wheelhouse (e2e/README.md).
#   BUDGET=540 OPS_FLOOR="..." bash a_floor.sh
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=${BUDGET:-540}
bash e2e/device_install.sh ensure >/dev/null || exit 1
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra PYTHONUNBUFFERED=1 EXTRACT=1
part() {  # part NAME DTYPES OPS PHASES DEADLINE
  mkdir -p $OUT/$1
  DTYPES=$2 OPS="$3" DEADLINE=$5 RES=$OUT/$1 bash kernels/gpu_run.sh $4 > $OUT/$1/run.log 2>&1
  echo "$1 rc=$? at $(el)s"; cat $OUT/$1/summary.txt
}
[ -n "${SKIP_FP16:-}" ] || part fp16 fp16 "gemma_fused_add_rmsnorm qknorm" check,decode 120
part floor-bf16 bf16 "${OPS_FLOOR:-fused_add_rmsnorm gemma_rmsnorm gemma_fused_add_rmsnorm qknorm gelu_tanh_and_mul}" decode \
  $(( B - $(el) - 70 ))
