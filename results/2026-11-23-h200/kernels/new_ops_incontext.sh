#!/usr/bin/env bash
# The new ops' record after the harness landed (2026-11-23, integration call): `astra-sglang check` of
# each shipped kernel against its extracted SGLang 0.5.17 production kernel, then `bench` of the Llama/
# Qwen/Gemma TP1 decode shapes (1, 16, 64, 256 tokens, bf16) chained AND in context (producer GEMM ->
# op -> consumer GEMM; decode rows take their speedup from the in-context time). From the repo root:
#   carry astra-work/e1ws (extract ... --sglang-src <0.5.17 wheel> --arch sm_90 --no-build, 7 ops)
#   and astra-work/e2ws (kernels/rope/gpu_run.sh's header); DEADLINE=seconds skips what would start later.
# No install: the checkout imports as is (PYTHONPATH=$PWD).
set -uo pipefail
DEADLINE=${DEADLINE:-300}
RES=${OUT:-./new-ops-out}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 ASTRA_CACHE_DIR=/tmp/astra-cache
AS="python3 -m astra_sglang.cli"
rm -rf /tmp/e1ws /tmp/e2ws; cp -a astra-work/e1ws /tmp/e1ws; cp -a astra-work/e2ws /tmp/e2ws
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; } | tee "$RES/env.txt"
declare -A WS=([rmsnorm]=/tmp/e1ws/rmsnorm [gemma_rmsnorm]=/tmp/e1ws/gemma_rmsnorm
  [gemma_fused_add_rmsnorm]=/tmp/e1ws/gemma_fused_add_rmsnorm [gelu_tanh_and_mul]=/tmp/e1ws/gelu_tanh_and_mul
  [gelu_and_mul]=/tmp/e1ws/gelu_and_mul [qknorm]=/tmp/e2ws/sglang_0_5_17/qknorm [rope]=/tmp/e2ws/sglang_0_5_17/rope
  [kv_store]=/tmp/e2ws/sglang_0_5_17/kv_store [rope_store]=/tmp/e2ws/sglang_0_5_17/rope_store)
declare -A SH=([rmsnorm]=1x4096,16x4096,64x4096,256x4096 [gemma_rmsnorm]=1x3584,16x3584,64x3584,256x3584
  [gemma_fused_add_rmsnorm]=1x3584,16x3584,64x3584,256x3584 [gelu_tanh_and_mul]=1x14336,16x14336,64x14336,256x14336
  [gelu_and_mul]=1x24576,16x24576,64x24576,256x24576
  [qknorm]=1x32x8x128x6144x6144,16x32x8x128x6144x6144,64x32x8x128x6144x6144,256x32x8x128x6144x6144
  [rope]=1x32x8x128x128x6144x6144,16x32x8x128x128x6144x6144,64x32x8x128x128x6144x6144,256x32x8x128x128x6144x6144
  [kv_store]=1x1024x1024x6144x6144,16x1024x1024x6144x6144,64x1024x1024x6144x6144,256x1024x1024x6144x6144
  [rope_store]=1x32x4x128x5120x5120x5120,16x32x4x128x5120x5120x5120,64x32x4x128x5120x5120x5120,256x32x4x128x5120x5120x5120)
OPS="rmsnorm qknorm rope kv_store rope_store gemma_fused_add_rmsnorm gemma_rmsnorm gelu_tanh_and_mul gelu_and_mul"
# 1. build every workspace (production + shipped kernel) and check, all ops in parallel (16 cores)
for op in $OPS; do
  ( timeout 170 $AS check $op --workspace "${WS[$op]}" --candidate "kernels/$op/kernel.cu" --shapes "${SH[$op]}" \
      --dtype bf16 --json "$RES/check_$op.json" > "$RES/check_$op.log" 2>&1; echo "rc=$?" >> "$RES/check_$op.log" ) &
done
wait; echo "[$(el)s] checks done"
for op in $OPS; do echo "check $op: $(grep -E '^(PASS|FAIL)|rc=' "$RES/check_$op.log" | tr '\n' ' ' | cut -c1-150)"; done
# 2. decode benches, one at a time (timing), until the deadline
for op in $OPS; do
  if [ "$(el)" -ge "$DEADLINE" ]; then echo "[$(el)s] SKIP bench $op (deadline)"; continue; fi
  timeout $(( DEADLINE + 25 - $(el) )) $AS bench $op --workspace "${WS[$op]}" --candidate "kernels/$op/kernel.cu" \
    --shapes "${SH[$op]}" --dtype bf16 --replays 10 --no-plot --out "$RES/bench_$op.json" > "$RES/bench_$op.log" 2>&1
  echo "[$(el)s] bench $op rc=$?"
done
for op in $OPS; do [ -f "$RES/bench_$op.log" ] && { echo "== $op"; grep -E "x[0-9]|geomean" "$RES/bench_$op.log" | tail -6; }; done
