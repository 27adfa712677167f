#!/bin/bash
# NEXT SESSION (prepared 2026-11-27c, not run): the DeepSeek-shaped server A/B that was 19% slower at c8, again,
# with --server-profile: is arm B's extra 0.45 ms a step GPU idle (host), other kernels, or a slower replay kernel?
set -uo pipefail
REPO=$(pwd)
if [ ! -d /tmp/e2e-site/sglang ]; then
  bash e2e/device_install.sh stage .whl/wh26/carry17/part08 >/dev/null
  timeout 200 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
cd /tmp
timeout ${1:-400} python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/deepseek-v3-2l --out /tmp/ab-prof --ops all \
  --workload c8:32:128:128:8 --rounds 3 --max-total-tokens 8192 --mem-fraction-static 0.5 \
  --server-profile c8 --profile-steps 60 > $OUT/ab.log 2>&1; echo "ab rc=$?"
tar -C /tmp -czf $OUT/ab-prof.tar.gz --exclude="ab-prof/counters-*" ab-prof 2>/dev/null
grep -E "^\| (output throughput|ITL p10|TPOT mean)" $OUT/ab.log; cat /tmp/ab-prof/server-profile.md | head -30
