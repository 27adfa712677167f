#!/bin/bash
# 2026-11-27d: the served A/B's co-tenancy problem. s33 (--ops all) gave +28.9% where the last session gave -19%;
# each-op's arm A drifted 1.55 -> 1.97 ms TPOT as arm B restarted. Now both arms run --sleep-on-idle (committed
# default). First an A/A (both unpatched), then the --ops all A/B again, same workload.
set -uo pipefail
REPO=$(pwd)
if [ ! -d /tmp/e2e-site/sglang ]; then
  bash e2e/device_install.sh stage .whl/wh26/carry17/part08 >/dev/null
  timeout 200 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
cd /tmp
W="--workload c8:48:128:128:8 --rounds 4 --max-total-tokens 8192 --mem-fraction-static 0.5"
timeout ${1:-300} python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/deepseek-v3-2l --out /tmp/aa --aa $W > $OUT/aa.log 2>&1; echo "aa rc=$?"
timeout ${2:-250} python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/deepseek-v3-2l --out /tmp/ab --ops all $W > $OUT/ab.log 2>&1; echo "ab rc=$?"
tar -C /tmp -czf $OUT/aa-ab.tar.gz --exclude="*/counters-*" aa ab 2>/dev/null
for r in aa ab; do echo "== $r"; grep -E "^\| (startup|output throughput|TPOT mean|ITL p10|ITL median)" /tmp/$r/report.md; done
# Its report.md was rebuilt on the CPU side (the run was cut off before its own analysis):
#   astra-sglang e2e --analyze results.json --out . --aa-floor ../aa-sleep/summary.json
