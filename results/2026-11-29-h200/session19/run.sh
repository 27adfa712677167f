#!/bin/bash
# 2026-11-29 (nineteenth session), one H200, from the repository root.
#   bash run.sh a   (no wheelhouse) moe_align's rows of 512-2048 ids as compile-time variants (kernels/dev/bench_variants.sh),
#                   int32, in context (bench's generic pair) and chained: shipped; fill (ASTRA_FILL_MIN_NUMEL=0: the one-launch
#                   path writes its padding as one coalesced 16-byte fill of sorted_token_ids before the scatter, not per-bucket
#                   stores inside each segment); two1024 (ASTRA_FUSED_MAX_NUMEL=1024: two launches above 1024 ids); bs16
#                   (ASTRA_PER_BUCKET_MAX_BS=16: block 32 takes the warp-per-bucket layout); then Nsight Compute of the shipped
#                   kernel at 256 x 8 x 129 x 32 (2048 ids), the row it loses most
#   bash run.sh b   (wheelhouse staged first: .whl/wh32, bash e2e/device_install.sh stage .whl/wh32/carry/partNN, one call a
#                   part) moe_combine's <= 32-token Qwen3-MoE rows at their serving site (bench --sites serving) against the
#                   callable SGLang 0.5.17 runs there, the torch.compile'd sum (--baseline installed), bf16, --neighbours astra
#   bash run.sh c   (no wheelhouse) moe_align with the fill shipped (ASTRA_FILL_MIN_NUMEL 0): check, then the 35 decode rows of
#                   2026-11-27's record (1, 8, 64, 128, 256 tokens of each corpus model), int32, chained and in context (bench's
#                   generic pair, cuBLAS)
#   bash run.sh d   (wheelhouse staged) decode step A/B on the 20-layer Qwen3-30B-A3B shape at batch 64 and 256, arm A every
#                   default op but moe_align (SGLang's two kernels), arm B every default op (astra's one-block kernel, which
#                   now takes up to 2048 ids: 256 tokens at top-8)
#   bash run.sh e   (wheelhouse staged) part b again after bench's capture warms every input set first (timer.graph_of warm=):
#                   the installed compiled sum could not be captured on 3 of 8 rows in part b; and the GPU test of that
#   bash run.sh f   (no wheelhouse) moe_align's DeepSeek-V3 rows (257 buckets) as compile-time variants, in context: shipped (the
#                   one-launch fill); wide512 / wide1024 (ASTRA_WIDE_TWO_MIN_NUMEL: above 512 / 1024 ids on more than 256
#                   buckets, two launches, the first filling sorted_token_ids coalesced); part a's two1024 had won the
#                   2048-id row 1.33x against the fill's 1.10x
# Workspaces extracted on the CPU from the sglang 0.5.17, flashinfer-python 0.6.15.post1 and apache-tvm-ffi 0.1.11 wheels,
# carried as astra-work/ws: bash kernels/dev/workspaces_from_wheels.sh WHEELDIR astra-work/ws moe_align=jit moe_combine=jit_topk_sum
set -uo pipefail
PART=${1:?a, b, c, d, e or f}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s19/$PART; mkdir -p $O
export WS=astra-work/ws
LIMIT=${LIMIT:-540}
case $PART in
a)
  rows=1x8x129x16x128,128x8x129x16x2960,256x8x129x32x6048,64x8x257x64x16704,128x8x257x64x17216,256x8x257x64x18240,256x4x129x64x9152
  RES=$O/variants BENCH_ARGS="--replays 10" DEADLINE=$(( LIMIT - 120 )) bash kernels/dev/bench_variants.sh moe_align \
    $WS/jit/moe_align $rows int32 default= fill=-DASTRA_FILL_MIN_NUMEL=0 two1024=-DASTRA_FUSED_MAX_NUMEL=1024 \
    bs16=-DASTRA_PER_BUCKET_MAX_BS=16 > $O/variants.log 2>&1
  echo "variants done at $(el)s"; tail -14 $O/variants.log | grep -v "^  wrote"
  source kernels/astra_env.sh
  for sh in 256x8x129x32x6048 128x8x257x64x17216; do
    timeout 90 $AS bench moe_align --workspace $WS/jit/moe_align --candidate kernels/moe_align/kernel.cu --shapes $sh \
      --dtype int32 --replays 5 --no-context --no-plot --ncu --ncu-shape $sh --out $O/ncu_$sh.json > $O/ncu_$sh.log 2>&1
    echo "ncu $sh rc=$? at $(el)s"; tail -25 $O/ncu_$sh.log | cut -c1-200
  done ;;
b|e)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
  source kernels/astra_env.sh
  [ $PART = b ] || { timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_bench_rules.py \
    -k "compiled_callable or graph_of" > $O/pytest.log 2>&1; echo "pytest rc=$?"; tail -2 $O/pytest.log; }
  rows=1x8x2048,8x8x2048,16x8x2048,32x8x2048,1x8x4096,8x8x4096,16x8x4096,32x8x4096
  for rule in serving generic; do
    timeout $(( (LIMIT - $(el)) / 2 )) $AS bench moe_combine --workspace $WS/jit_topk_sum/moe_combine \
      --candidate kernels/moe_combine/kernel.cu --shapes $rows --dtype bf16 --replays 8 --neighbours astra \
      --baseline installed --sites $rule --no-plot --out $O/installed_$rule.json > $O/installed_$rule.log 2>&1
    echo "sites $rule rc=$? at $(el)s"; grep -E "^geomean|^rows:|^sites:|in context|error" $O/installed_$rule.log | cut -c1-300 | tail -8
  done ;;
c)
  source kernels/astra_env.sh
  timeout 120 $AS check moe_align --workspace $WS/jit/moe_align --candidate kernels/moe_align/kernel.cu --dtype int32 \
    > $O/check.log 2>&1; echo "check rc=$? at $(el)s"; tail -3 $O/check.log
  rows=$(paste -sd, results/2026-11-29-h200/session19/moe_align_rows.txt)  # the rows of decode.json.xz, 2026-11-27
  timeout $(( LIMIT - $(el) )) $AS bench moe_align --workspace $WS/jit/moe_align --candidate kernels/moe_align/kernel.cu \
    --dtype int32 --shapes $rows --out $O/decode.json > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; grep -E "^geomean|^rows:|^served|in-context" $O/bench.log | cut -c1-400 ;;
d)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  STEP_ARGS="--procs 1 --batch-size 64,256 --cuda-graph-max-bs 256 --max-total-tokens 131072 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 \
--skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" RES=$O DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh \
    "qwen3-30b-a3b-20l-align:qwen3-30b-a3b-20l:$(( LIMIT - 40 )):--base-ops=all,-moe_align --ops=all --port=31300" > $O/step.log 2>&1
  echo "step done at $(el)s"; tail -8 $O/step.log ;;
f)
  rows=8x8x257x64x4096,64x8x257x64x16704,128x8x257x64x17216,256x8x257x64x18240
  RES=$O/variants BENCH_ARGS="--replays 10" DEADLINE=$(( LIMIT - 60 )) bash kernels/dev/bench_variants.sh moe_align \
    $WS/jit/moe_align $rows int32 default= wide512=-DASTRA_WIDE_TWO_MIN_NUMEL=512 wide1024=-DASTRA_WIDE_TWO_MIN_NUMEL=1024 \
    > $O/variants.log 2>&1
  echo "variants done at $(el)s"; tail -9 $O/variants.log | grep -v "^  wrote" ;;
esac
