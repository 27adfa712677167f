#!/bin/bash
# 2026-11-28 (fourteenth session), 2x H200. The wheelhouse is staged first (.whl/wh30, built at 580eeda with
# python3 e2e/build_wheelhouse.py --out .whl/wh30 --chunk-mib auto --lock e2e/wheelhouse/lock.txt; one device call per
# part: bash e2e/device_install.sh stage .whl/wh30/carry/partNN), then back to back, carrying astra-work/ws
# (extracted on the CPU: astra-sglang extract OP --sglang 0.5.17 --arch sm_90 --out astra-work/ws/VARIANT --no-build):
#   bash run.sh k   GPU 0: the shipped linear and rmsnorm (2-row CTAs past 12288 inputs; the late trigger at 128-256
#                   tokens): check + decode corpus, then validate in SGLang's layers.
#                   GPU 1 meanwhile: the late trigger (-DASTRA_PDL=1) on the other three norms at 128-256 tokens,
#                   then qknorm's dev variants on its decode corpus
#   bash run.sh s   decode step A/Bs, --ops all in both arms: Qwen3-8B with linear's 2-row CTAs taking its 12288-wide
#                   down_proj too (B: a candidate with ASTRA_LONG_ROWS 12287u; GPU 0), and Gemma-2-9B at batch 4 with
#                   the tensor-core path taking the 14336-wide down_proj (B: ASTRA_LINEAR_MMA_MAX_IN_FEATURES=14336; GPU 1)
#   bash run.sh e   GPU 0: the batch-4 A/B on Llama-3-8B; GPU 1: server A/B Gemma-2-9B, SGLang unpatched against
#                   --ops all (the patched server's start: kernels built side by side)
# A second hold, after the norms' late trigger and linear's 3-4-token rule shipped (and e2e --step gave a candidate to
# arm B alone; part s's Qwen3-8B run had been refused as two identical arms):
#   bash run.sh v   GPU 0: the Qwen3-8B step A/B of part s again. GPU 1: the three norms as shipped (check + decode
#                   corpus, bf16), and linear's check on 3-4 x 14336 -> 3584
# A third hold, after ASTRA_LONG_ROWS_1 shipped (1-token calls on 12288 inputs take the 2-row CTAs: v's batch 1 is the
# rule's own A/B; its batch 2 ran 2-token calls, which the rule leaves as they were):
#   bash run.sh w   validate linear (3-4 x 14336 -> 3584 now taken) and the three norms in SGLang's own layers
set -uo pipefail
PART=${1:?k, s, e, v or w}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s14/$PART; mkdir -p $O
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site PYTHONUNBUFFERED=1 WS=astra-work/ws
echo "installed at $(el)s"
AS="python3 -m astra_sglang.cli"
step() {  # RES_DIR NAME:CONFIG:SECS:ARGS
  local res=$1; shift
  STEP_ARGS=$STEP_ARGS RES=$res DEADLINE_S=$(( 570 - $(el) )) bash e2e/step_session.sh "$1" > $res.log 2>&1
  tail -24 $res.log
}
STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5"
B4="--procs 1 --batch-size 4 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5"
MMA="--base-ops=all --ops=all --arm-env=B:ASTRA_LINEAR_MMA_MAX_IN_FEATURES=14336"
case $PART in
k)
  (  # GPU 1: the late trigger on the other norms, then qknorm's variants
    export CUDA_VISIBLE_DEVICES=1
    N=128x4096,256x4096,128x5120,256x5120
    for op in gemma_rmsnorm fused_add_rmsnorm gemma_fused_add_rmsnorm; do
      extra=(); [ $op = fused_add_rmsnorm ] && extra=(trigend="-DASTRA_TRIG_END=1")
      RES=$O/norm-$op BOTH_ORDERS=1 timeout 150 bash kernels/dev/bench_variants.sh $op $WS/flashinfer/$op $N bf16 \
        default= pdl1="-DASTRA_PDL=1" "${extra[@]}" > $O/norm-$op.log 2>&1
      echo "$op variants done at $(el)s"
    done
    RES=$O/qknorm BOTH_ORDERS=1 timeout $(( 560 - $(el) )) bash kernels/dev/bench_variants.sh qknorm $WS/jit/qknorm decode \
      bf16 default= t64="-DASTRA_QKN_THREADS=64" trig0="-DASTRA_QKN_TRIG_FIRST=1" > $O/qknorm.log 2>&1
    echo "qknorm variants done at $(el)s"
  ) &
  RES=$O/shipped DEADLINE=330 EXTRACT=1 OPS="linear rmsnorm" bash kernels/gpu_run.sh check,decode > $O/shipped.log 2>&1
  echo "shipped check+decode at $(el)s"; cat $O/shipped/summary.txt
  timeout $(( 560 - $(el) )) $AS validate --ops linear,rmsnorm --json $O/validate.json > $O/validate.log 2>&1
  echo "validate rc=$? at $(el)s"; tail -8 $O/validate.log
  wait; echo "GPU 1 done at $(el)s"
  for op in gemma_rmsnorm fused_add_rmsnorm gemma_fused_add_rmsnorm qknorm; do
    echo "== $op"; tail -14 $O/norm-$op.log 2>/dev/null || tail -14 $O/$op.log
  done ;;
s)
  { echo "#define ASTRA_LONG_ROWS 12287u"; cat kernels/linear/kernel.cu; } > $O/long12288.cu
  step $O/q3 "qwen3-8b:qwen3-8b:540:--base-ops=all --ops=all --candidate=linear=$O/long12288.cu" &
  STEP_ARGS=$B4 CUDA_VISIBLE_DEVICES=1 step $O/g2b4 "gemma2-9b-b4:gemma2-9b:540:$MMA --port=30500" &
  wait ;;
e)
  STEP_ARGS=$B4 step $O/l3b4 "llama3-8b-b4:llama3-8b:540:$MMA" &
  ( cd /tmp && CUDA_VISIBLE_DEVICES=1 timeout 560 $AS e2e --model-path $OLDPWD/e2e/configs/gemma2-9b --out $O/server-gemma2-9b \
      --ops all --workload bs1:8:128:128:1 --rounds 3 --max-total-tokens 16384 --port 30700 > $O/server-gemma2-9b.log 2>&1
    echo "server A/B rc=$? at $(el)s"; grep -i -E "startup|throughput|identical" $O/server-gemma2-9b/report.md | head -12 ) &
  wait ;;
v)
  { echo "#define ASTRA_LONG_ROWS 12287u"; cat kernels/linear/kernel.cu; } > $O/long12288.cu
  step $O/q3 "qwen3-8b:qwen3-8b:540:--base-ops=all --ops=all --candidate=linear=$O/long12288.cu" &
  (
    export CUDA_VISIBLE_DEVICES=1
    N3="gemma_rmsnorm fused_add_rmsnorm gemma_fused_add_rmsnorm"
    RES=$O/norms-check DEADLINE=300 DTYPES=bf16 EXTRACT=1 OPS="$N3 linear" bash kernels/gpu_run.sh check > $O/norms-check.log 2>&1
    RES=$O/norms-decode DEADLINE=300 DTYPES=bf16 OPS="$N3" bash kernels/gpu_run.sh decode > $O/norms-decode.log 2>&1
    source kernels/astra_env.sh
    timeout 120 $AS check linear --workspace $WS/installed/linear --candidate kernels/linear/kernel.cu --dtype bf16,fp16 \
      --shapes 3x14336x3584,4x14336x3584,4x14336x2048,3x14344x3576 --json $O/check-linear-mma-long.json \
      > $O/check-linear-mma-long.log 2>&1
    echo "check linear 3-4 x 14336 rc=$? at $(el)s: $(tail -1 $O/check-linear-mma-long.log)"
    cat $O/norms-check/summary.txt $O/norms-decode/summary.txt
  ) &
  wait ;;
w)
  timeout 500 $AS validate --ops linear,gemma_rmsnorm,fused_add_rmsnorm,gemma_fused_add_rmsnorm --json $O/validate.json \
    > $O/validate.log 2>&1
  echo "validate rc=$? at $(el)s"; grep -E "FAIL|passed" $O/validate.log | tail -6 ;;
esac
echo "all done at $(el)s"
tar -C /tmp/s14 -cJf $OUT/$PART.tar.xz $PART
