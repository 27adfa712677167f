#!/bin/bash
# 2026-11-27 (H200, eighth session), call B: the serving gain with today's defaults (fused MLPs on, silu_and_mul off),
# measured as served-calibrated/run.sh measured it: `e2e --ops all --calibrate` (A unpatched, B --ops all, A2 a second
# unpatched server, rotated rounds, all --sleep-on-idle). From the repository root on the GPU machine:
#   bash b_served.sh qwen3-8b "bs1:8:128:128:1 c4:16:128:128:4" 5 440
set -uo pipefail
M=$1; WL=$2; R=${3:-5}; T=${4:-440}
REPO=$(pwd)
bash e2e/device_install.sh ensure >/dev/null || exit 1
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi \
  TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
W=""; for w in $WL; do W="$W --workload $w"; done
cd /tmp
timeout $T python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M --out /tmp/cal-$M --ops all --calibrate \
  $W --rounds $R --max-total-tokens 16384 > $OUT/cal-$M.log 2>&1; echo "cal $M rc=$?"
tar -C /tmp -czf $OUT/cal-$M.tar.gz --exclude="*/counters-*" cal-$M 2>/dev/null
grep -E "^\| (output throughput|TPOT mean)" /tmp/cal-$M/report.md 2>/dev/null | head -12
tail -3 $OUT/cal-$M.log
