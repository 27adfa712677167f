#!/bin/bash
# 2026-11-27 (H200, seventh session), call B: decode-step A/B of two shares, every other default op in both arms:
# dense_rope_store on Gemma-2-9B (its new Gemma2Attention site), silu_and_mul on Llama-3-8B.
# Then gelu_and_mul's validate in SGLang 0.5.17's layer if time is left. After a_corpus.sh on the same machine.
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
[ -d /tmp/e2e-site/sglang ] || { echo "not installed: run a_corpus.sh first"; exit 1; }
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
B=${BUDGET:-580}
DEADLINE_S=$(( B - 80 )) RES=$OUT STEP_ARGS="--procs 1 --batch-size 1,8 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
  bash e2e/step_session.sh "drs-gemma2:gemma2-9b:245:--base-ops=all,-dense_rope_store --ops=all" \
                           "silu-llama3:llama3-8b:245:--base-ops=all,-silu_and_mul --ops=all" > $OUT/step-session.log 2>&1
echo "step rc=$? at $(el)s"
left=$(( B - $(el) - 10 ))
if [ $left -gt 40 ]; then
  mkdir -p $OUT/validate
  (cd /tmp && timeout -s INT -k 10 $left python3 -m astra_sglang.cli validate --ops gelu_and_mul --dtypes bf16 \
     --json $OUT/validate/validate.json) > $OUT/validate/validate.log 2>&1
  echo "validate rc=$? at $(el)s"; tail -6 $OUT/validate/validate.log
fi
grep -A8 "summary (Δ" $OUT/step-session.log
