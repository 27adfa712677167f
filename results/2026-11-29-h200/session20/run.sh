#!/bin/bash
# 2026-11-29 (twentieth session), one H200, from the repository root.
#   bash run.sh a   (no wheelhouse) the single Gemma norms at their pair-of-norms sites (gemma_rmsnorm with astra's rmsnorm
#                   after it, gemma_fused_add_rmsnorm with it before; bench --sites serving), bf16, --neighbours astra; then
#                   rope and kv_store with today's bench: check, then the decode corpus, --neighbours astra (their standing
#                   numbers are from 2026-11-23/24, before the floor, the sites and --neighbours)
#   bash run.sh b   (no wheelhouse) where rope and kv_store release their dependents, on the rows part a found slowest in
#                   context, bf16, both orders (kernels/dev/bench_variants.sh): shipped (right after griddepcontrol.wait);
#                   trigend (ASTRA_TRIG_END=1: after the stores, production's placement); kv_store also plain
#                   (ASTRA_PDL=0: no programmatic dependent launch)
#   bash run.sh c   (no wheelhouse) part b's rows again with smaller blocks (ASTRA_THREADS=64 / 128 against the shipped 256:
#                   a decode batch over more SMs; SGLang's rope runs 128-thread blocks, 16 threads a head), both orders
#                   Parts b and c ran bench_variants.sh without --neighbours astra: cuBLAS on both sides, not what a patched
#                   server runs (astra's linear takes the 1- and 16-token producers there); part d has it.
#   bash run.sh d   (no wheelhouse) parts b and c's best variants (trigend, t64) against the shipped kernel on the same
#                   rows, with --neighbours astra, both orders
# Workspaces extracted on the CPU from the sglang 0.5.17, flashinfer-python 0.6.15.post1 and apache-tvm-ffi 0.1.11 wheels,
# carried as astra-work/ws: bash kernels/dev/workspaces_from_wheels.sh WHEELDIR astra-work/ws gemma_rmsnorm=flashinfer \
#   gemma_fused_add_rmsnorm=flashinfer rope=jit kv_store=jit
set -uo pipefail
PART=${1:?a, b, c or d}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s20/$PART; mkdir -p $O
export WS=astra-work/ws
LIMIT=${LIMIT:-540}
case $PART in
a)
  RES=$O/gemma NEIGHBOURS=astra DTYPES=bf16 OPS="gemma_rmsnorm gemma_fused_add_rmsnorm" DEADLINE=200 \
    bash kernels/gpu_run.sh decode > $O/gemma.log 2>&1
  echo "gemma done at $(el)s"; cat $O/gemma/summary.txt | cut -c1-500
  RES=$O/rope_kv NEIGHBOURS=astra OPS="rope kv_store" DEADLINE=$(( LIMIT - 90 - $(el) )) \
    bash kernels/gpu_run.sh check,decode > $O/rope_kv.log 2>&1
  echo "rope/kv done at $(el)s"; cat $O/rope_kv/summary.txt | cut -c1-500 ;;
b)
  rows=1x512x512x3072x3072,16x512x512x3072x3072,64x128x128x1280x1280,1x1024x1024x6144x6144,64x1024x1024x6144x6144,256x512x512x3072x3072
  RES=$O/kv_store BOTH_ORDERS=1 DEADLINE=$(( LIMIT / 2 - 30 )) bash kernels/dev/bench_variants.sh kv_store $WS/jit/kv_store \
    $rows bf16 default= trigend=-DASTRA_TRIG_END=1 plain=-DASTRA_PDL=0 > $O/kv_store.log 2>&1
  echo "kv_store variants done at $(el)s"; grep -A12 "geomean (min)" $O/kv_store.log
  rows=64x32x8x128x128x6144x6144,64x8x1x128x128x1280x1280,16x16x2x128x128x2560x2560,16x28x4x128x128x4608x4608,1x32x8x128x128x6144x6144,256x16x4x128x128x3072x3072
  RES=$O/rope BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 30 - $(el) )) bash kernels/dev/bench_variants.sh rope $WS/jit/rope \
    $rows bf16 default= trigend=-DASTRA_TRIG_END=1 > $O/rope.log 2>&1
  echo "rope variants done at $(el)s"; grep -A12 "geomean (min)" $O/rope.log ;;
c)
  rows=1x512x512x3072x3072,16x512x512x3072x3072,64x128x128x1280x1280,1x1024x1024x6144x6144,64x1024x1024x6144x6144,256x512x512x3072x3072
  RES=$O/kv_store BOTH_ORDERS=1 DEADLINE=$(( LIMIT / 2 - 30 )) bash kernels/dev/bench_variants.sh kv_store $WS/jit/kv_store \
    $rows bf16 default= t64=-DASTRA_THREADS=64 t128=-DASTRA_THREADS=128 > $O/kv_store.log 2>&1
  echo "kv_store variants done at $(el)s"; grep -A12 "geomean (min)" $O/kv_store.log
  rows=64x32x8x128x128x6144x6144,64x8x1x128x128x1280x1280,16x16x2x128x128x2560x2560,16x28x4x128x128x4608x4608,1x32x8x128x128x6144x6144,256x16x4x128x128x3072x3072
  RES=$O/rope BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 30 - $(el) )) bash kernels/dev/bench_variants.sh rope $WS/jit/rope \
    $rows bf16 default= t64=-DASTRA_THREADS=64 t128=-DASTRA_THREADS=128 > $O/rope.log 2>&1
  echo "rope variants done at $(el)s"; grep -A12 "geomean (min)" $O/rope.log ;;
d)
  export BENCH_ARGS="--neighbours astra"
  rows=1x512x512x3072x3072,16x512x512x3072x3072,64x128x128x1280x1280,1x1024x1024x6144x6144,64x1024x1024x6144x6144,256x512x512x3072x3072
  RES=$O/kv_store BOTH_ORDERS=1 DEADLINE=$(( LIMIT / 2 - 30 )) bash kernels/dev/bench_variants.sh kv_store $WS/jit/kv_store \
    $rows bf16 default= trigend=-DASTRA_TRIG_END=1 t64=-DASTRA_THREADS=64 > $O/kv_store.log 2>&1
  echo "kv_store variants done at $(el)s"; grep -A12 "geomean (min)" $O/kv_store.log
  rows=64x32x8x128x128x6144x6144,64x8x1x128x128x1280x1280,16x16x2x128x128x2560x2560,16x28x4x128x128x4608x4608,1x32x8x128x128x6144x6144,256x16x4x128x128x3072x3072
  RES=$O/rope BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 30 - $(el) )) bash kernels/dev/bench_variants.sh rope $WS/jit/rope \
    $rows bf16 default= trigend=-DASTRA_TRIG_END=1 t64=-DASTRA_THREADS=64 > $O/rope.log 2>&1
  echo "rope variants done at $(el)s"; grep -A12 "geomean (min)" $O/rope.log ;;
esac
