#!/bin/bash
# 2026-11-27 (H200, seventh session): gate_up_silu (SiLU-and-mul in the gate_up GEMV's epilogue) on the GPU.
#   bash c_gus.sh corpus   install, check + decode corpus (bf16), the 8-row variant's bench, validate, Qwen3-8B step
#   bash c_gus.sh steps    Llama-3-8B step (default kernel), then Qwen3-8B's with the late PDL trigger variant
# Step A/B: arm A `--ops all` (every default op), arm B `--ops all,gate_up_silu`. From the repository root on the GPU
# machine after staging the wheelhouse (e2e/README.md).
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=${BUDGET:-570}
if [ ! -d /tmp/e2e-site/sglang ]; then
  timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
STEP="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5"
step() {  # step NAME MODEL SECS
  mkdir -p $OUT/$1
  DEADLINE_S=$(( B - $(el) )) RES=$OUT/$1 STEP_ARGS="$STEP" bash e2e/step_session.sh "$1:$2:$3:--base-ops=all --ops=all,gate_up_silu" > $OUT/$1/step-session.log 2>&1
  echo "$1 rc=$? at $(el)s"; grep -A4 "summary (Δ" $OUT/$1/step-session.log | tail -3
}
if [ "${1:-corpus}" = corpus ]; then
  mkdir -p $OUT/gus-corpus
  OPS=gate_up_silu EXTRACT=1 DTYPES=bf16 DEADLINE=120 RES=$OUT/gus-corpus bash kernels/gpu_run.sh check,decode > $OUT/gus-corpus/run.log 2>&1
  echo "corpus rc=$? at $(el)s"; cat $OUT/gus-corpus/summary.txt
  # the 8-row CTA (4 gate/up pairs) in the same bench
  sed 's/^#define ASTRA_GUS_PAIRS 2 /#define ASTRA_GUS_PAIRS 4 /' kernels/gate_up_silu/kernel.cu > /tmp/gus_p4.cu
  ws=$(ls -d .gpu_ws/*/gate_up_silu | head -1)
  timeout 150 python3 -m astra_sglang.cli bench gate_up_silu --workspace $ws --candidate /tmp/gus_p4.cu --shapes decode \
    --dtype bf16 --out $OUT/gus-corpus/decode_p4.json > $OUT/gus-corpus/decode_p4.log 2>&1
  echo "p4 bench rc=$? at $(el)s"; grep -E "^geomean|^rows:" $OUT/gus-corpus/decode_p4.log
  mkdir -p $OUT/gus-validate
  (cd /tmp && timeout -s INT -k 10 90 python3 -m astra_sglang.cli validate --ops gate_up_silu --dtypes bf16 \
     --json $OUT/gus-validate/validate.json) > $OUT/gus-validate/validate.log 2>&1
  echo "validate rc=$? at $(el)s"; tail -3 $OUT/gus-validate/validate.log
  step gus-qwen3 qwen3-8b 260
else
  step gus-llama3 llama3-8b 260
  sed -i 's/^#define ASTRA_GUS_LATE_TRIGGER 0 /#define ASTRA_GUS_LATE_TRIGGER 1 /' kernels/gate_up_silu/kernel.cu
  grep -c "^#define ASTRA_GUS_LATE_TRIGGER 1 " kernels/gate_up_silu/kernel.cu
  bash e2e/device_install.sh astra >/dev/null
  step gus-late-qwen3 qwen3-8b 260
fi
