#!/bin/bash
# 2026-11-27 (H200, seventh session): gate_up_gelu_tanh (gelu_tanh-and-mul in the gate_up GEMV's epilogue, Gemma's
# MLP) on the GPU: install, check + decode corpus (bf16), Gemma-2-9B step A/B (arm A `--ops all`, B + the op),
# validate in SGLang 0.5.17's Gemma2MLP; then the fp16 decode corpus of the norms with what time is left.
# From the repository root on the GPU machine after staging the wheelhouse (e2e/README.md).
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=${BUDGET:-520}
if [ ! -d /tmp/e2e-site/sglang ]; then
  timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
mkdir -p $OUT/gugt-corpus $OUT/gugt-step $OUT/gugt-validate $OUT/norms-fp16
OPS=gate_up_gelu_tanh EXTRACT=1 DTYPES=bf16 DEADLINE=100 RES=$OUT/gugt-corpus bash kernels/gpu_run.sh check,decode > $OUT/gugt-corpus/run.log 2>&1
echo "corpus rc=$? at $(el)s"; cat $OUT/gugt-corpus/summary.txt
DEADLINE_S=$(( B - 60 - $(el) )) RES=$OUT/gugt-step STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
  bash e2e/step_session.sh "gugt-gemma2:gemma2-9b:260:--base-ops=all --ops=all,gate_up_gelu_tanh" > $OUT/gugt-step/step-session.log 2>&1
echo "step rc=$? at $(el)s"; grep -A4 "summary (Δ" $OUT/gugt-step/step-session.log | tail -3
(cd /tmp && timeout -s INT -k 10 60 python3 -m astra_sglang.cli validate --ops gate_up_gelu_tanh --dtypes bf16 \
   --json $OUT/gugt-validate/validate.json) > $OUT/gugt-validate/validate.log 2>&1
echo "validate rc=$? at $(el)s"; tail -2 $OUT/gugt-validate/validate.log
left=$(( B - $(el) - 70 ))
if [ $left -gt 30 ]; then
  OPS="rmsnorm fused_add_rmsnorm gemma_rmsnorm gemma_fused_add_rmsnorm qknorm" EXTRACT=1 DTYPES=fp16 DEADLINE=$left RES=$OUT/norms-fp16 \
    bash kernels/gpu_run.sh decode > $OUT/norms-fp16/run.log 2>&1
  echo "norms fp16 rc=$? at $(el)s"; cat $OUT/norms-fp16/summary.txt
fi
