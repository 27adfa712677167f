#!/bin/bash
# 2026-11-27 05:06 UTC (H200): server A/B on deepseek-v3-2l, SGLang unpatched (A) vs --ops all,moe_grouped_router (B),
# bs1 and c8 (32 prompts), 6 rounds. Run from the repository root on the GPU machine after staging the wheelhouse.
set -uo pipefail
REPO=$(pwd)
if [ ! -d /tmp/e2e-site/sglang ]; then
  bash e2e/device_install.sh stage .whl/wh26/carry20/part06 >/dev/null
  timeout 200 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
A="python3 -m astra_sglang.cli"
cd /tmp
timeout ${1:-450} $A e2e --model-path $REPO/e2e/configs/deepseek-v3-2l --out /tmp/ab-ds2 --ops all,moe_grouped_router \
  --workload bs1:8:128:128:1 --workload c8:32:128:128:8 --rounds 6 --max-total-tokens 8192 --mem-fraction-static 0.5 \
  > $OUT/ab.log 2>&1; echo "ab rc=$?"
tar -C /tmp -czf $OUT/ab-ds2.tar.gz --exclude="ab-ds2/counters-*" ab-ds2 2>/dev/null
grep -E "^\| (output throughput|TPOT mean)|identical|moe_grouped_router: calls" $OUT/ab.log | head -12
