#!/bin/bash
# 2026-11-27 (H200, sixth session): install, then validate of the norm/activation family in SGLang 0.5.17's own
# layers, then a decode-step A/B of moe_combine's share on qwen3-30b-a3b-20l (every other default op in both
# arms). Run from the repository root on the GPU machine after staging the wheelhouse (e2e/README.md).
set -uo pipefail
T0=$(date +%s)
if [ ! -d /tmp/e2e-site/sglang ]; then
  timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
echo "install done at $(( $(date +%s) - T0 ))s"
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
mkdir -p $OUT/validate
(cd /tmp && timeout -s INT -k 20 150 python3 -m astra_sglang.cli validate \
   --ops rmsnorm,fused_add_rmsnorm,gemma_rmsnorm,gemma_fused_add_rmsnorm,qknorm,silu_and_mul,gelu_tanh_and_mul,gelu_and_mul \
   --json $OUT/validate/validate.json) > $OUT/validate/validate.log 2>&1
echo "validate rc=$? at $(( $(date +%s) - T0 ))s"; tail -15 $OUT/validate/validate.log
S=$(( 580 - ($(date +%s) - T0) ))
DEADLINE_S=$S RES=$OUT STEP_ARGS="--procs 1 --batch-size 1,8 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
  bash e2e/step_session.sh "combine:qwen3-30b-a3b-20l:$(( S - 10 )):--base-ops=all,-moe_combine --ops=all" > $OUT/step-session.log 2>&1
echo "step rc=$? at $(( $(date +%s) - T0 ))s"
grep -A6 "summary (Δ" $OUT/step-session.log; tail -4 $OUT/step-session.log
