#!/bin/bash
# 2026-11-28 (twelfth session), one H200. The wheelhouse is staged first (python3 e2e/build_wheelhouse.py --out
# .whl/wh28 --chunk-mib auto --lock e2e/wheelhouse/lock.txt on the CPU; one device call per part:
# bash e2e/device_install.sh stage .whl/wh28/carry/partNN), then back to back, carrying astra-work/ws (production
# workspaces extracted on the CPU: bash kernels/dev/workspaces_from_wheels.sh .whl/wh27/wheels astra-work/ws OP ...):
#   bash run.sh a    install; validate gemma_post_attention_norms in SGLang 0.5.17 with the cross-layer hand-off off
#                    and on (ASTRA_GPAN_ACROSS_LAYERS=1); its decode bench again (the last record had rc 1)
#   bash run.sh b    add_rmsnorm_linear: check against production (SGLang's fused_add_rmsnorm + cuBLAS), its decode
#                    bench in context, the bar (fused_add_rmsnorm and astra linear benched on the same shapes), validate
#   bash run.sh g2   the decode-step A/B on Gemma-2-9B: every default op in both arms, B with the hand-off on (after
#                    validate with the hand-off on, again: part a found it never deferred under SGLang's REPLACE hook)
#   bash run.sh g3   the same on Gemma-3-12B
#   bash run.sh l3   the decode-step A/B on Llama-3-8B: every default op in both arms, add_rmsnorm_linear added in B
set -uo pipefail
PART=${1:?a, b, g2, g3 or l3}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s12/$PART; mkdir -p $O
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site PYTHONUNBUFFERED=1 WS=astra-work/ws
echo "installed at $(el)s"
AS="python3 -m astra_sglang.cli"
STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5"
step() {  # NAME:CONFIG:SECS:ARGS
  STEP_ARGS=$STEP_ARGS RES=$O DEADLINE_S=$(( 570 - $(el) )) bash e2e/step_session.sh "$1" > $O/step.log 2>&1
  tail -32 $O/step.log
}
case $PART in
a)
  for arm in off on; do
    [ $arm = on ] && export ASTRA_GPAN_ACROSS_LAYERS=1
    (cd /tmp && timeout -s INT -k 20 200 $AS validate --ops gemma_post_attention_norms --dtypes bf16,fp16 \
      --json $O/validate-$arm.json) > $O/validate-$arm.log 2>&1
    echo "validate ($arm) rc=$? at $(el)s: $(tail -1 $O/validate-$arm.log)"
  done
  unset ASTRA_GPAN_ACROSS_LAYERS
  RES=$O/gpan DEADLINE=150 OPS=gemma_post_attention_norms bash kernels/gpu_run.sh decode > $O/gpan.log 2>&1
  echo "gpan decode bench at $(el)s"; cat $O/gpan/summary.txt ;;
b)
  W=$WS/installed/add_rmsnorm_linear
  RES=$O/arl DEADLINE=200 OPS=add_rmsnorm_linear DTYPES=bf16 bash kernels/gpu_run.sh check,decode > $O/arl.log 2>&1
  echo "arl check/decode at $(el)s"; cat $O/arl/summary.txt
  (cd /tmp && timeout 100 $AS validate --ops add_rmsnorm_linear --dtypes bf16,fp16 --json $O/validate-arl.json) \
    > $O/validate-arl.log 2>&1; echo "validate rc=$? at $(el)s: $(tail -1 $O/validate-arl.log)"
  source kernels/astra_env.sh
  timeout 120 $AS bench fused_add_rmsnorm --workspace $WS/flashinfer/fused_add_rmsnorm --dtype bf16 \
    --candidate kernels/fused_add_rmsnorm/kernel.cu --shapes 1x4096,2x4096,1x5120,2x5120,1x8192,2x8192 \
    --out $O/bar-fan.json > $O/bar-fan.log 2>&1; echo "bar fused_add_rmsnorm rc=$? at $(el)s"
  timeout 150 $AS bench linear --workspace $WS/installed/linear --dtype bf16 --candidate kernels/linear/kernel.cu \
    --shapes 1x4096x6144,2x4096x6144,1x5120x7168,2x5120x7168,1x8192x5120,2x8192x5120 \
    --out $O/bar-linear.json > $O/bar-linear.log 2>&1; echo "bar linear rc=$? at $(el)s"
  for f in bar-fan bar-linear; do echo "== $f"; grep -B2 -A12 "in context" $O/$f.log | tail -16; done ;;
g2)
  (cd /tmp && ASTRA_GPAN_ACROSS_LAYERS=1 timeout -s INT -k 20 200 $AS validate --ops gemma_post_attention_norms \
    --dtypes bf16,fp16 --json $O/validate-on.json) > $O/validate-on.log 2>&1
  echo "validate (on) rc=$? at $(el)s: $(tail -1 $O/validate-on.log)"
  step 'gemma2-9b:gemma2-9b:500:--base-ops=all --ops=all --arm-env=B:ASTRA_GPAN_ACROSS_LAYERS=1' ;;
g3) step 'gemma3-12b:gemma3-12b:500:--base-ops=all --ops=all --arm-env=B:ASTRA_GPAN_ACROSS_LAYERS=1' ;;
l3) step 'llama3-8b:llama3-8b:500:--base-ops=all --ops=all,add_rmsnorm_linear' ;;
esac
echo "all done at $(el)s"
tar -C /tmp/s12 -cJf $OUT/$PART.tar.xz $PART
