#!/usr/bin/env bash
# The all-ops record (2026-11-23, second session): check every shipped kernel against SGLang 0.5.17's
# production kernel, a scripted optimize round with a CuTe candidate (issue 18), then bench of the
# decode corpus (bf16) op by op until the deadline. Carried (git-ignored): astra-work/e1ws (extract
# OP --sglang-src <sglang 0.5.17 wheel> --flashinfer-src <flashinfer 0.7.2> --arch sm_90 --no-build;
# merge_state --variant flashinfer), astra-work/e2ws (kernels/rope/gpu_run.sh's header),
# astra-work/cutlass-include.tgz (flashinfer's data/cutlass/include), .whl/agents (pip download
# openai-agents==0.24.0). Knobs: OPS (checked), BENCH_OPS (decode-benched), CUTE_SHAPES, DIAG_ROPE=1, TOTAL.
# From the repo root on the GPU machine, $OUT set:
#   bash results/2026-11-23-h200/kernels/all_ops/device_call.sh
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
TOTAL=${TOTAL:-560}
mkdir -p /tmp/ws/flashinfer /tmp/ws/jit /tmp/cutlass
for op in rmsnorm gemma_rmsnorm gemma_fused_add_rmsnorm fused_add_rmsnorm merge_state; do rm -rf /tmp/ws/flashinfer/$op; cp -a astra-work/e1ws/$op /tmp/ws/flashinfer/; done
for op in gelu_and_mul gelu_tanh_and_mul silu_and_mul; do rm -rf /tmp/ws/jit/$op; cp -a astra-work/e1ws/$op /tmp/ws/jit/; done
for op in qknorm rope kv_store rope_store; do rm -rf /tmp/ws/jit/$op; cp -a astra-work/e2ws/sglang_0_5_17/$op /tmp/ws/jit/; done
tar -C /tmp/cutlass -xzf astra-work/cutlass-include.tgz
python3 -m pip install -q --no-index --find-links .whl/agents openai-agents > "$OUT/pip.log" 2>&1 || echo "pip openai-agents failed"
export WS=/tmp/ws VARIANT_merge_state=flashinfer DTYPES=${DTYPES:-bf16}
export OPS=${OPS:-"rope rope_store silu_and_mul fused_add_rmsnorm merge_state qknorm rmsnorm gemma_fused_add_rmsnorm gemma_rmsnorm kv_store gelu_tanh_and_mul gelu_and_mul"}
RES=$OUT/check bash kernels/gpu_run.sh check
echo "[$(el)s] checks done"
if [ "${CUTE:-1}" = 1 ]; then
  ASTRA_CUTLASS_INCLUDE=/tmp/cutlass/include timeout 240 python3 -m astra_sglang.cli optimize silu_and_mul \
    --workspace /tmp/ws/jit/silu_and_mul --model scripted:tests/optimize_fixtures/cute/script.json --rounds 1 \
    --shapes ${CUTE_SHAPES:-decode} --dtypes fp16 --replays 20 --final-shapes edge --run-dir /tmp/cute-run > /tmp/cute-run.log 2>&1
  echo "cute optimize rc=$?"; cp /tmp/cute-run.log /tmp/cute-run/ 2>/dev/null; tar -C /tmp -czf "$OUT/cute-run.tgz" cute-run
  echo "[$(el)s] cute done"; tail -15 /tmp/cute-run.log
fi
if [ -n "${DIAG_ROPE:-}" ]; then  # the in-place re-check diagnosis: two shapes of each rope op
  for op in rope rope_store; do
    sh=1x32x8x128x128x6144x6144,256x32x8x128x128x6144x6144; [ $op = rope ] || sh=1x32x4x128x5120x5120x5120,256x32x4x128x5120x5120x5120
    timeout 120 python3 -m astra_sglang.cli bench $op --workspace /tmp/ws/jit/$op --candidate kernels/$op/kernel.cu \
      --shapes $sh --dtype bf16 --replays 8 --no-plot --out /tmp/diag_$op.json > /tmp/diag_$op.log 2>&1
    echo "diag $op rc=$?"; grep -E "REFUSED|FAIL" /tmp/diag_$op.log | cut -c1-400
  done
  tar -C /tmp -czf "$OUT/diag-rope.tgz" diag_rope.json diag_rope.log diag_rope_store.json diag_rope_store.log 2>/dev/null
fi
OPS="${BENCH_OPS:-$OPS}" DEADLINE=$(( TOTAL - 60 - $(el) )) RES=$OUT/decode bash kernels/gpu_run.sh decode
echo "[$(el)s] all done"; cat "$OUT/check/summary.txt" "$OUT/decode/summary.txt"
