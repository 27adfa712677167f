#!/bin/bash
# 2026-11-30 (twenty-fifth session), one H200, from the repository root, after staging the wheelhouse WITH sgl_kernel's
# FA3 library (.whl/wh33fa3, 25 parts, one a call: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`).
# SGLang's own default attention throughout (fa3 on Hopper).
#   bash run.sh a   moe_grouped_router's ASTRA_ROUTER_WARP variants, in context, both orders, fp32 (serving's dtype),
#                   on the five rows without a shared column (DeepSeek-V3 1/8/256 tokens, Kimi-K2 1/256)
#   bash run.sh b   Gemma-3-12B decode-step A/B: arm A every default op but gemma_qknorm_rope, arm B every default op;
#                   arm A's trace is the first real one for the profile's attribution of SGLang's torch q/k path
#   bash run.sh c   Gemma-3-12B served A/B (every default op against none, --calibrate) with linear's 21504 bound
#   bash run.sh d   Qwen3-30B-A3B (20 layers) served A/B, the MoE family on fa3
#   bash run.sh e   Qwen2.5-7B served A/B (linear takes its 18944-wide down_proj)
#   bash run.sh f   Gemma-3-27B (20 layers) decode-step A/B: linear's bound 14336 (A) against 21504 (B, the default)
set -uo pipefail
PART=${1:?a, b, c, d, e or f}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s25}/$PART; mkdir -p $O
LIMIT=${LIMIT:-570}
REPO=$(pwd)
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "installed at $(el)s"
served() {  # MODEL ROUNDS: every default op against none, SGLang's default attention
  local M=$1
  (cd /tmp && timeout $(( LIMIT - 20 - $(el) )) python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M \
    --out /tmp/cal-$M --ops all --calibrate --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds $2 \
    --max-total-tokens 16384 > $O/cal-$M.log 2>&1); echo "cal $M rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-$M.tar.gz --exclude="*/counters-*" cal-$M 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-$M/report.md 2>/dev/null | head -8 | cut -c1-250
  tail -3 $O/cal-$M.log | cut -c1-250
}
step() {  # SPEC BATCHES: one decode-step A/B through e2e/step_session.sh
  STEP_ARGS="--procs 1 --batch-size $2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh "$1" \
    > $O/step.log 2>&1
  echo "step done at $(el)s"; tail -12 $O/step.log | cut -c1-220
}
case $PART in
a)
  source kernels/astra_env.sh; WS=/tmp/s25-ws
  $AS extract moe_grouped_router --variant installed --arch sm_90 --out $WS/installed --no-build > $O/extract.log 2>&1 \
    || { tail -3 $O/extract.log; exit 1; }
  RES=$O/router NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 60 - $(el) )) bash kernels/dev/bench_variants.sh \
    moe_grouped_router $WS/installed/moe_grouped_router 1x256x8x8x4x0,8x256x8x8x4x0,256x256x8x8x4x0,1x384x8x1x1x0,256x384x8x1x1x0 \
    fp32 default= warp=-DASTRA_ROUTER_WARP=1 warp2=-DASTRA_ROUTER_WARP=2 > $O/router.log 2>&1
  echo "router variants done at $(el)s"; grep -A14 "geomean (min)" $O/router.log | cut -c1-200 ;;
b)
  step 'gemma3-12b-qk:gemma3-12b:400:--base-ops=all,-gemma_qknorm_rope --ops=all' 1,2 ;;
c)
  served gemma3-12b ${ROUNDS:-4} ;;
d)
  served qwen3-30b-a3b-20l ${ROUNDS:-4} ;;
e)
  served qwen2.5-7b ${ROUNDS:-4} ;;
f)
  step 'gemma3-27b-20l-linear:gemma3-27b-20l:400:--base-ops=all --ops=all --arm-env=A:ASTRA_LINEAR_MAX_IN_FEATURES=14336' 1,2 ;;
*) echo "error: run.sh takes a, b, c, d, e or f" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
