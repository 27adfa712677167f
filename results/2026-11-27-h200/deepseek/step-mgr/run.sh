#!/bin/bash
# 2026-11-27 04:55 UTC (H200): decode-step A/B on deepseek-v3-2l, --ops all (A) vs all,moe_grouped_router (B),
# batch 1 and 8. Run from the repository root on the GPU machine after staging the wheelhouse.
set -uo pipefail
REPO=$(pwd)
if [ ! -d /tmp/e2e-site/sglang ]; then
  bash e2e/device_install.sh stage .whl/wh26/carry20/part06 >/dev/null
  timeout 200 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
S=${1:-400}
DEADLINE_S=$S RES=$OUT STEP_ARGS="--procs 1 --batch-size 1,8 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
  bash e2e/step_session.sh "mgr-ds:deepseek-v3-2l:$(( S - 10 )):--base-ops=all --ops=all,moe_grouped_router" > $OUT/step-session.log 2>&1
echo "session rc=$?"
grep -A6 "summary (Δ" $OUT/step-session.log; tail -4 $OUT/step-session.log
