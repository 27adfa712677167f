#!/bin/bash
# NEXT SESSION (prepared 2026-11-27c, not run): which default op makes the DeepSeek-shaped server slower at
# concurrency 8 (results/2026-11-27-h200 §5: --ops all,moe_grouped_router -19%, moe_grouped_router alone +5.9%).
# e2e --each-op: arm A up once, arm B restarted per op alone; c8 32 prompts, 3 rounds. Usage: s32.sh "op1,op2" [secs]
# ~100 s per op on a warm machine (first start ~200 s cold). Needs an H200 (two 26 GiB servers at 0.5).
set -uo pipefail
REPO=$(pwd)
if [ ! -d /tmp/e2e-site/sglang ]; then
  bash e2e/device_install.sh stage .whl/wh26/carry17/part08 >/dev/null
  timeout 200 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
cd /tmp
OPS=${1:-linear,rmsnorm,fused_add_rmsnorm,silu_and_mul,moe_align,moe_combine}
timeout ${2:-560} python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/deepseek-v3-2l --out /tmp/each --ops $OPS \
  --each-op --workload c8:32:128:128:8 --rounds 3 --max-total-tokens 8192 --mem-fraction-static 0.5 > $OUT/each.log 2>&1
echo "each-op rc=$?"
tar -C /tmp -czf $OUT/each.tar.gz --exclude="*/counters-*" --exclude="*/results.json" each 2>/dev/null
cat /tmp/each/each-op.md 2>/dev/null | grep "^|"
