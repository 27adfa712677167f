#!/bin/bash
# 2026-11-30 (twenty-sixth session), one H200, from the repository root, after staging the FA3 wheelhouse
# (.whl/wh33fa3, one part a call: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`); the checkout holds
# main with branch gqkr-q-out merged (gemma_qknorm_rope writes q into its own buffer). SGLang's default attention (fa3).
#   bash run.sh a   GPU gates: moe_grouped_router's check (fp32 / bf16 / fp16, the warp router now takes the calls
#                   without a shared column) and validate with ASTRA_ROUTER_TAKE_NO_SHARED=1 (the adapter takes them);
#                   gemma_qknorm_rope's check (bit-identical) and validate with q written to q_out
#   bash run.sh b   Gemma-3-12B decode-step A/B: arm A every default op with q in place (ASTRA_GQKR_Q_OUT=0, fa3 then
#                   copies the strided q), arm B every default op (q into its own buffer)
#   bash run.sh c   DeepSeek-V3 (2 layers) decode-step A/B without the fused shared column: arm A every default op
#                   (the router's no-shared calls left to SGLang), arm B the same with ASTRA_ROUTER_TAKE_NO_SHARED=1
#   bash run.sh d   Qwen2.5-7B served A/B (every default op against none; linear takes its 18944-wide down_proj)
#   bash run.sh e   Gemma-3-27B (20 layers) decode-step A/B: linear's bound 14336 (A) against 21504 (B, the default)
#   bash run.sh v OP DTYPES   validate one op alone, after a fix (gemma_qknorm_rope bf16,fp16 after its layer's fix;
#                   moe_grouped_router fp32,bf16 once its adapter took the calls without a shared column)
set -uo pipefail
PART=${1:?a, b, c, d, e or v}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s26}/$PART; mkdir -p $O
LIMIT=${LIMIT:-570}
REPO=$(pwd)
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "installed at $(el)s"
gate() {  # OP DTYPES [ENV=VALUE]: extract the installed variant, check the shipped kernel, validate in SGLang's layer
  local OP=$1 WS=/tmp/s26-ws
  $AS extract $OP --variant installed --arch sm_90 --out $WS --no-build > $O/extract-$OP.log 2>&1 \
    || { echo "extract $OP failed"; tail -3 $O/extract-$OP.log; return 1; }
  timeout 240 $AS check $OP --workspace $WS/$OP --candidate kernels/$OP/kernel.cu --json $O/check-$OP.json \
    > $O/check-$OP.log 2>&1
  echo "check $OP rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)|bit-identical" $O/check-$OP.log | cut -c1-200 | head -3
  (cd /tmp && env ${3:-ASTRA_NONE=1} timeout 150 $AS validate --ops $OP --dtypes $2 --json $O/validate-$OP.json) \
    > $O/validate-$OP.log 2>&1
  echo "validate $OP rc=$? at $(el)s: $(tail -1 $O/validate-$OP.log | cut -c1-200)"
}
step() {  # SPEC BATCHES: one decode-step A/B through e2e/step_session.sh
  STEP_ARGS="--procs 1 --batch-size $2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh "$1" \
    > $O/step.log 2>&1
  echo "step done at $(el)s"; tail -12 $O/step.log | cut -c1-220
}
case $PART in
a)
  source kernels/astra_env.sh
  gate moe_grouped_router fp32,bf16 ASTRA_ROUTER_TAKE_NO_SHARED=1
  gate gemma_qknorm_rope bf16,fp16
  tar -C $O -czf /tmp/s26-gates.tar.gz . && rm -f $O/* && mv /tmp/s26-gates.tar.gz $O/gates.tar.gz ;;  # <= 8 files back
b)
  step 'gemma3-12b-qout:gemma3-12b:480:--base-ops=all --ops=all --arm-env=A:ASTRA_GQKR_Q_OUT=0' 1,2,16 ;;
c)
  step 'deepseek-noshared:deepseek-v3-2l:420:--base-ops=all --ops=all --arm-env=B:ASTRA_ROUTER_TAKE_NO_SHARED=1 --server-arg=--disable-shared-experts-fusion' 1,8,64 ;;
d)
  M=qwen2.5-7b
  (cd /tmp && timeout $(( LIMIT - 20 - $(el) )) python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M \
    --out /tmp/cal-$M --ops all --calibrate --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds ${ROUNDS:-4} \
    --max-total-tokens 16384 > $O/cal-$M.log 2>&1); echo "cal $M rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-$M.tar.gz --exclude="*/counters-*" cal-$M 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-$M/report.md 2>/dev/null | head -8 | cut -c1-250
  tail -3 $O/cal-$M.log | cut -c1-250 ;;
e)
  step 'gemma3-27b-20l-linear:gemma3-27b-20l:400:--base-ops=all --ops=all --arm-env=A:ASTRA_LINEAR_MAX_IN_FEATURES=14336' 1,2 ;;
v)
  source kernels/astra_env.sh
  (cd /tmp && timeout 150 $AS validate --ops ${2:?OP} --dtypes ${3:?DTYPES} --json $O/validate-$2.json) \
    > $O/validate-$2.log 2>&1
  echo "validate $2 rc=$? at $(el)s: $(tail -1 $O/validate-$2.log | cut -c1-200)"; grep FAIL $O/validate-$2.log | cut -c1-250 ;;
*) echo "error: run.sh takes a, b, c, d, e or v" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
