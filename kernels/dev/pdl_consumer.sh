#!/usr/bin/env bash
# Where our kernels release their dependents, judged by the GEMM that follows them (kernels/NOTES.md,
# "the consumer pays for the early trigger").  In SGLang's decode graph the cuBLAS GEMM after our
# fused_add_rmsnorm ran slower than after FlashInfer's; this times the shipped PDL placement against the
# others in context, with the model's real next GEMM as bench's consumer:
#   pdl2     shipped: L2 prefetch, dependents released right after griddepcontrol.wait
#   trigend  the same prefetch, dependents released after the stores (FlashInfer's placement)
#   pdl1     no prefetch, released after the stores
#   pdl0     no programmatic dependent launch at all
# From the repository root on a GPU machine, workspaces as kernels/gpu_run.sh reads them:
#   FARN_WS=astra-work/e1ws/fused_add_rmsnorm SILU_WS=astra-work/e1ws/silu_and_mul bash kernels/dev/pdl_consumer.sh
# Results: $RES (default $OUT or ./pdl-consumer-out), one folder per (op, consumer width), each ending in
# bench_variants.sh's table.
set -uo pipefail
FARN_WS=${FARN_WS:-astra-work/e1ws/fused_add_rmsnorm}; SILU_WS=${SILU_WS:-astra-work/e1ws/silu_and_mul}
RES=${RES:-${OUT:-./pdl-consumer-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
VARIANTS=(pdl2= trigend="-DASTRA_TRIG_END=1" pdl1="-DASTRA_PDL=1" pdl0="-DASTRA_PDL=0")
# (op workspace shapes consumer-width why); Llama-3-8B: hidden 4096, qkv 6144, gate_up 2 x 14336;
# Llama-3-70B at TP 2: hidden 8192, gate_up 2 x 28672 / 2
RUNS=(
  "fused_add_rmsnorm $FARN_WS 1x4096,8x4096,32x4096,64x4096 28672 8B post-attention norm -> gate_up"
  "fused_add_rmsnorm $FARN_WS 1x4096,8x4096,32x4096,64x4096 6144 8B input norm -> qkv_proj"
  "fused_add_rmsnorm $FARN_WS 1x8192,8x8192,32x8192 28672 70B TP2 post-attention norm -> gate_up"
  "silu_and_mul $SILU_WS 1x14336,8x14336,32x14336,64x14336 4096 8B silu -> down_proj"
)
for run in "${RUNS[@]}"; do
  read -r op ws shapes width why <<<"$run"
  d=$RES/${op}_$(echo "$shapes" | cut -d, -f1 | cut -dx -f2)_w$width
  echo "=== $(date -u +%T) $op $shapes, consumer $width ($why)"
  RES=$d BENCH_ARGS="--consumer-width $width" \
    bash kernels/dev/bench_variants.sh "$op" "$ws" "$shapes" bf16 "${VARIANTS[@]}" | tee "$d.txt" | tail -12
done
