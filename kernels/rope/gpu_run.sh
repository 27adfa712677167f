#!/usr/bin/env bash
# The numbers in kernels/{qknorm,rope,kv_store,rope_store}/RESULTS.md: `astra-sglang check` and `astra-sglang bench` of the
# four shipped kernels against SGLang's JIT kernels, one GPU, one run, inside a time budget. From the repo root:
#
#   WS=/tmp/e2ws DEADLINE=140 bash kernels/rope/gpu_run.sh
#
# Workspaces (extracted on any machine with nvcc, `--arch sm_90`), one per SGLang version, at $WS/<tag>/<op>:
#   C=~/.cache/astra-sglang-tests   # the unpacked wheels tests/conftest.py downloads
#   for op in qknorm rope kv_store rope_store; do astra-sglang extract $op --sglang-src $C/sglang_0_5_17 \
#     --flashinfer-src $C/flashinfer --tvm-ffi-src $C/tvm --arch sm_90 --out /tmp/e2ws/sglang_0_5_17; done
#   for op in qknorm kv_store; do astra-sglang extract $op --sglang-src $C/sglang ... --out /tmp/e2ws/sglang; done
#   cp -a /tmp/e2ws astra-work/e2ws     # git-ignored; name it in the device call's carry
# and on the GPU machine: mkdir -p /tmp/e2ws && cp -a astra-work/e2ws/. /tmp/e2ws/ before this script.
# (0.5.17 is the serving version on the GPU machines; 0.5.23's q/k norm gained a half-warp kernel and its KV
# store a new kernel, so those two ops are timed against both.) Builds are cached inside each workspace: a
# workspace copied to the same absolute path with the same nvcc reuses them.
# Order = priority: checks (in parallel), then decode benches, then prefill; a step that would start after
# DEADLINE seconds is skipped and says so. Results: $RES (default $OUT or ./rope-kv-gpu-out).
set -uo pipefail
WS=${WS:-/tmp/e2ws}
DEADLINE=${DEADLINE:-140}
RES=${RES:-${OUT:-./rope-kv-gpu-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
source kernels/astra_env.sh
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  git rev-parse --short HEAD 2>/dev/null; } | tee "$RES/env.txt"
status=0
old=$WS/sglang_0_5_17 new=$WS/sglang
for op in qknorm rope kv_store rope_store; do
  [ -f "$old/$op/manifest.json" ] || { echo "no workspace $old/$op"; status=1; }
done
# 1. correctness: each op against fp64 and SGLang 0.5.17's kernel (fp16 + bf16, edge + corpus sample)
for op in qknorm rope kv_store rope_store; do
  ( timeout 100 $AS check $op --workspace "$old/$op" --candidate "kernels/$op/kernel.cu" \
      --json "$RES/check_$op.json" > "$RES/check_$op.log" 2>&1; echo "rc=$?" >> "$RES/check_$op.log" ) &
done
wait
echo "[$(el)s] checks done"; tail -n 3 "$RES"/check_*.log
# 2. timing: label workspace op shapes dtype
bench() {
  local label=$1 ws=$2 op=$3 shapes=$4 dt=$5
  if [ "$(el)" -ge "$DEADLINE" ]; then echo "[$(el)s] SKIP $label (deadline)"; return; fi
  [ -f "$ws/$op/manifest.json" ] || { echo "SKIP $label: no workspace"; return; }
  echo "[$(el)s] bench $label"
  timeout $(( DEADLINE + 20 - $(el) )) $AS bench $op --workspace "$ws/$op" --candidate "kernels/$op/kernel.cu" \
    --shapes "$shapes" --dtype "$dt" --replays 8 --no-plot --out "$RES/bench_$label.json" > "$RES/bench_$label.log" 2>&1 \
    || { echo "  rc=$? (log: bench_$label.log)"; status=1; }
  tail -n 4 "$RES/bench_$label.log"
}
bench qknorm_decode_bf16_0517 "$old" qknorm decode bf16
bench rope_decode_bf16_0517 "$old" rope decode bf16
bench kv_store_decode_bf16_0517 "$old" kv_store decode bf16
bench rope_store_decode_bf16_0517 "$old" rope_store decode bf16
bench qknorm_decode_bf16_0523 "$new" qknorm decode bf16
bench kv_store_decode_bf16_0523 "$new" kv_store decode bf16
bench qknorm_decode_fp16_0517 "$old" qknorm decode fp16
bench rope_decode_fp16_0517 "$old" rope decode fp16
bench qknorm_prefill_bf16_0517 "$old" qknorm 1024x32x8x128x6144x6144,4096x32x8x128x6144x6144 bf16
bench rope_prefill_bf16_0517 "$old" rope 1024x32x8x128x128x6144x6144,4096x32x8x128x128x6144x6144 bf16
bench rope_store_prefill_bf16_0517 "$old" rope_store 1024x32x4x128x5120x5120x5120,4096x32x4x128x5120x5120x5120 bf16
bench kv_store_prefill_bf16_0517 "$old" kv_store 1024x1024x1024x6144x6144,4096x1024x1024x6144x6144 bf16
echo "[$(el)s] done, status $status"
exit $status
