#!/usr/bin/env bash
# Third call of the 2026-11-23 all-ops record: the new MoE ops on the GPU for the first time (moe_align:
# check + decode bench vs its extracted sgl_kernel/JIT production; moe_combine: decode rows >32 tokens,
# which SGLang runs through sgl_kernel's moe_sum_reduce), and the Llama-3-8B decode shapes of the three
# ops whose RESULTS.md predate the in-context timer (silu_and_mul, fused_add_rmsnorm, merge_state).
# Carried: astra-work/e1ws, astra-work/gpu_ws/jit/moe_align, astra-work/sgl/moe_combine (device_call.sh's
# header and kernels/moe_*/RESULTS.md say how they were extracted). $OUT set; from the repo root.
set -uo pipefail
source kernels/astra_env.sh
R=$OUT/r3; mkdir -p $R /tmp/ws3
for op in silu_and_mul fused_add_rmsnorm merge_state; do rm -rf /tmp/ws3/$op; cp -a astra-work/e1ws/$op /tmp/ws3/; done
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; } > $R/env.txt
b() {  # name op workspace dtype shapes
  timeout 150 $AS bench $2 --workspace $3 --candidate kernels/$2/kernel.cu --dtype $4 --shapes $5 --replays 8 --no-plot \
    --out $R/bench_$1.json > $R/bench_$1.log 2>&1
  echo "== bench $1 rc=$?"; grep -v "^  ·" $R/bench_$1.log | grep -E "^[0-9]|geomean|REFUSED|FAIL|error" | cut -c1-220
}
timeout 120 $AS check moe_align --workspace astra-work/gpu_ws/jit/moe_align --candidate kernels/moe_align/kernel.cu \
  --dtype int32 --json $R/check_moe_align.json > $R/check_moe_align.log 2>&1
echo "== check moe_align rc=$?"; grep -E "^(PASS|FAIL)|^error" $R/check_moe_align.log | cut -c1-400
b moe_align moe_align astra-work/gpu_ws/jit/moe_align int32 1x8x129x16x128,16x8x129x16x2048,64x8x129x16x2447,256x8x129x32x6047
b moe_combine moe_combine astra-work/sgl/moe_combine bf16 64x8x2048,256x8x2048,64x8x7168,256x8x7168
b silu_and_mul silu_and_mul /tmp/ws3/silu_and_mul bf16 1x14336,16x14336,64x14336,256x14336
b fused_add_rmsnorm fused_add_rmsnorm /tmp/ws3/fused_add_rmsnorm bf16 1x4096,16x4096,64x4096,256x4096
b merge_state merge_state /tmp/ws3/merge_state bf16 1x32x128,16x32x128,64x32x128,256x32x128
tar -C $OUT -czf $OUT/r3.tgz r3 && rm -rf $R
