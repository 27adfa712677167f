#!/bin/bash
# 2026-12-01 (thirty-sixth session), one H200 (nvidia-h200), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md). Part N of
# this session is session 35's (`bash results/2026-12-01-h200x2/session35/run.sh N`). Parts here:
#   bash run.sh D   where moe_topk_experts' kernel 2 pays over moe_experts' (session 35's profile: +1.1-1.5 us a call):
#                   diagnostic builds, wrong on purpose and never shipped, that skip a routing (kernel 2's: fixed ids
#                   and weights; kernel 1's too), timed against the shipped kernel in context, both orders, 1 token
#   bash run.sh E   kernel 2's routing off its critical path (after D): the ids by one warp max a round over packed
#                   16-bit ranks, the weights while the first w2 vectors load; kernel 1 ranks the same way. check
#                   (bf16, fp16), then both orders against the kernel before it (OLD: that commit's kernel.cu, copied
#                   beside the checkout as old-mtx-kernel.cu) at 1 token
#   bash run.sh S   NOT RUN (no device time left): the Qwen3-30B-A3B (20 layers) decode-step A/B of part E's kernel,
#                   arm A every default op but moe_topk_experts (moe_router + moe_experts), B every default op; batch 1
#                   (session 34 measured -1.51% with the kernel before)
#   bash run.sh V   NOT RUN: validate (bf16, SGLang 0.5.17's own layers) of the ops whose last validate is missing or
#                   older than their kernel or the patch machinery: rope_store and kv_store (0.5.17's targets are
#                   torch custom ops, which the patch bound only from 4d94596 on: rope_store's one run, 2026-11-26,
#                   reached no patched callable; kv_store never ran), moe_align (its 42 passes predate the
#                   per-bucket layout and the fill)
#   bash run.sh P   NOT RUN: where the Qwen3-30B-A3B (20 layers) decode step goes with every default op
#                   (astra-sglang profile, batch 1 and 2), then Qwen3-8B at batch 1
set -uo pipefail
PART=${1:?D, E, S, V or P}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s36}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site
case $PART in
D)
  source kernels/astra_env.sh
  WS=.gpu_ws/installed
  [ -f $WS/moe_topk_experts/manifest.json ] || $AS extract moe_topk_experts --variant installed --arch sm_90 --out $WS \
    --no-build > $O/extract.log 2>&1
  K=kernels/moe_topk_experts/kernel.cu
  R2='route_window<T>(logits, num_experts, topk, wb / topk, nw / topk, fid, fw);'
  R1='e = route_rank<T>(logits + static_cast<int64_t>(slot / topk) * num_experts, num_experts, slot % topk);'
  grep -qF "$R2" $K && grep -qF "$R1" $K || { echo "error: the routing calls moved; update run.sh D"; exit 1; }
  # no kernel-2 routing: slot i takes expert 13 i mod E, weight 1/8 (distinct experts, as a real top-8)
  python3 - "$K" "$R2" "$R1" <<'PY'
import sys
src, r2, r1 = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
k2 = "fid = lane < nw ? (lane * 13) % num_experts : -1; fw = 0.125f;"
k1 = "e = ((slot % topk) * 13) % num_experts;"
open("/tmp/mtx-k2fixed.cu", "w").write(src.replace(r2, k2))
open("/tmp/mtx-k12fixed.cu", "w").write(src.replace(r2, k2).replace(r1, k1))
PY
  RES=$O/variants BOTH_ORDERS=1 DEADLINE=420 bash kernels/dev/bench_variants.sh moe_topk_experts $WS/moe_topk_experts \
    1x2048x768x128x8,1x2048x384x128x8 bf16 shipped= k2fixed=@/tmp/mtx-k2fixed.cu k12fixed=@/tmp/mtx-k12fixed.cu \
    > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; tail -16 $O/variants.log | cut -c1-220 ;;
E)
  source kernels/astra_env.sh
  OPS=moe_topk_experts EXTRACT=1 DTYPES=bf16,fp16 RES=$O/check bash kernels/gpu_run.sh check > $O/check.log 2>&1
  echo "check rc=$? at $(el)s"; grep -E "^check " $O/check.log | cut -c1-250
  RES=$O/variants BOTH_ORDERS=1 DEADLINE=$(( ${LIMIT:-570} - 150 - $(el) )) bash kernels/dev/bench_variants.sh \
    moe_topk_experts .gpu_ws/installed/moe_topk_experts 1x2048x768x128x8,1x2048x384x128x8 bf16 old=@old-mtx-kernel.cu \
    new= > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; tail -12 $O/variants.log | cut -c1-220 ;;
S)
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 1 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh "mtx-qwen3moe:qwen3-30b-a3b-20l:${STEP_S:-480}:--base-ops=all,-moe_topk_experts --ops=all" \
    > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A3 "summary (Δ" $O/step.log | tail -3 | cut -c1-250 ;;
V)
  for op in rope_store kv_store moe_align; do
    (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops $op --dtypes bf16 \
       --json $O/validate-$op.json) > $O/validate-$op.log 2>&1
    echo "validate $op rc=$? at $(el)s: $(tail -1 $O/validate-$op.log | cut -c1-200)"
    xz -f $O/validate-$op.json 2>/dev/null
  done ;;
P)
  for m in qwen3-30b-a3b-20l:1,2 qwen3-8b:1; do
    left=$(( ${LIMIT:-570} - 15 - $(el) )); [ $left -gt 120 ] || { echo "skipped ${m%%:*}: ${left}s left"; continue; }
    (cd /tmp && timeout $left python3 -m astra_sglang.cli profile --model-path $OLDPWD/e2e/configs/${m%%:*} --ops all \
      --batch-size ${m##*:} --out /tmp/prof-${m%%:*}) > $O/profile-${m%%:*}.log 2>&1
    echo "profile ${m%%:*} rc=$? at $(el)s"
    cp /tmp/prof-${m%%:*}/profile.md $O/profile-${m%%:*}.md 2>/dev/null
    grep -E "^\| " /tmp/prof-${m%%:*}/profile.md 2>/dev/null | head -30 | cut -c1-200
  done ;;
*) echo "error: run.sh takes D, E, S, V or P" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
