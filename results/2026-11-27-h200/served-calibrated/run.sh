#!/bin/bash
# 2026-11-27e: the serving gain measured with the fixed method: unpatched A, --ops all B, and a second unpatched
# server A2 in every round (--calibrate, rotated order), all three --sleep-on-idle. Run from the repository root on
# one H200, one model per device call:
#   HOST=1 bash run.sh qwen3-8b "bs1:8:128:128:1 c4:16:128:128:4" 5 440     (HOST=1: also kernels/dev/host_overhead.py)
#   bash run.sh qwen3-30b-a3b-20l "bs1:8:128:128:1 c4:16:128:128:4" 5 440
#   bash run.sh llama3-8b "bs1:8:128:128:1 c4:16:128:128:4" 5 440
#   bash run.sh gemma2-9b "bs1:8:128:128:1 c4:16:128:128:4" 5 420
# --- astra-work/dev/prelude.sh ---
# sourced by every device script: install SGLang once per warm machine, then astra from this checkout
REPO=$(pwd)
PART=$(ls -d .whl/wh26/carry*/part* 2>/dev/null | tail -1)
if [ ! -d /tmp/e2e-site/sglang ]; then
  [ -n "$PART" ] && bash e2e/device_install.sh stage $PART >/dev/null
  timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
# --- astra-work/dev/s37.sh ---
# Serving gain measured the fixed way: --ops all --calibrate (A, B, A2 unpatched in rotated rounds), both arms
# --sleep-on-idle. Usage: s37.sh MODEL "WORKLOADS" [ROUNDS] [TIMEOUT] [EXTRA e2e args]
set -uo pipefail
M=$1; WL=$2; R=${3:-4}; T=${4:-420}; shift 4 2>/dev/null; EXTRA="$*"
W=""; for w in $WL; do W="$W --workload $w"; done
cd /tmp
timeout $T python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M --out /tmp/cal-$M --ops all --calibrate \
  $W --rounds $R --max-total-tokens 16384 $EXTRA > $OUT/cal-$M.log 2>&1; echo "cal $M rc=$?"
tar -C /tmp -czf $OUT/cal-$M.tar.gz --exclude="*/counters-*" cal-$M 2>/dev/null
grep -E "^\| (startup|output throughput|TPOT mean|ITL p10|TTFT)" /tmp/cal-$M/report.md 2>/dev/null | head -30
tail -4 $OUT/cal-$M.log
if [ -n "${HOST:-}" ]; then (cd /tmp && timeout 90 python3 $REPO/kernels/dev/host_overhead.py > $OUT/host-overhead.txt 2>&1); echo "host rc=$?"; tail -12 $OUT/host-overhead.txt; fi
