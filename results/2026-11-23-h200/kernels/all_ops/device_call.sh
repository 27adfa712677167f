#!/usr/bin/env bash
# The all-ops record (2026-11-23, second session): check every shipped kernel against SGLang 0.5.17's
# production kernel, a scripted optimize round with a CuTe candidate (issue 18), then bench of the
# decode corpus (bf16) op by op until the deadline. Carried (git-ignored): astra-work/e1ws (extract
# OP --sglang-src <sglang 0.5.17 wheel> --flashinfer-src <flashinfer 0.7.2> --arch sm_90 --no-build;
# merge_state --variant flashinfer), astra-work/e2ws (kernels/rope/gpu_run.sh's header),
# astra-work/cutlass-include.tgz (flashinfer's data/cutlass/include), .whl/agents (pip download
# openai-agents==0.24.0). From the repo root on the GPU machine, $OUT set:
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
    --shapes decode --dtypes fp16 --replays 20 --final-shapes edge --run-dir /tmp/cute-run > /tmp/cute-run.log 2>&1
  echo "cute optimize rc=$?"; cp /tmp/cute-run.log /tmp/cute-run/ 2>/dev/null; tar -C /tmp -czf "$OUT/cute-run.tgz" cute-run
  echo "[$(el)s] cute done"; tail -15 /tmp/cute-run.log
fi
DEADLINE=$(( TOTAL - 60 - $(el) )) RES=$OUT/decode bash kernels/gpu_run.sh decode
echo "[$(el)s] all done"; cat "$OUT/check/summary.txt" "$OUT/decode/summary.txt"
