#!/bin/bash
# 2026-12-01 (thirty-fifth session), two H200s (nvidia-h200-x2), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md). Parts:
#   bash run.sh F   moe_topk_experts at TP > 1 (877ef3e): check and decode corpus in context (bf16; the corpus now holds
#                   each rank's shard at TP 2, 4, 8), validate (bf16); then the step of part S (its first try ran out
#                   of time while the TP-2 workers started: part S runs it alone)
#   bash run.sh S   the Qwen3-30B-A3B (20 layers) decode-step A/B at --tp 2: arm A every default op but
#                   moe_topk_experts, B every default op; batch 1, 2
#   bash run.sh G   served Qwen3-30B-A3B (48 layers) at --tp 2, batch 1: unpatched (A, A2) against every default op (B)
#   bash run.sh N   NOT RUN in this session (no device time left; for the next, on one H200): kernel 2's routing by
#                   all 256 threads (-DASTRA_K2_RANK_ROUTE=1, built and spill-free on CPU): check with it, both orders
#                   of the shipped and the variant at 1 token (tp1 and tp2 shards, in context), then the Qwen3-30B-A3B
#                   (20 layers) step A/B of the variant against the shipped kernel; batch 1
set -uo pipefail
PART=${1:?F, S, G or N}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s35}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site
case $PART in
F)
  [ -n "${SKIP_CORPUS:-}" ] || OPS=moe_topk_experts EXTRACT=1 DTYPES=bf16 RES=$O/mtx bash kernels/gpu_run.sh check,decode > $O/mtx.log 2>&1
  echo "moe_topk_experts corpus rc=$? at $(el)s"; grep -E "^(check|decode) " $O/mtx.log | cut -c1-400
  grep -E "^ *[12]x(2048|4096)x" $O/mtx.log | head -12 | cut -c1-200
  (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops moe_topk_experts --dtypes bf16 \
     --json $O/validate-mtx.json) > $O/validate-mtx.log 2>&1
  echo "validate moe_topk_experts rc=$? at $(el)s: $(tail -1 $O/validate-mtx.log | cut -c1-200)"
  xz -f $O/validate-mtx.json 2>/dev/null ;&
S)
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--tp 2 --procs 1 --batch-size 1,2 --input-len 256 \
--output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh "mtx-tp2:qwen3-30b-a3b-20l:${STEP_S:-420}:--base-ops=all,-moe_topk_experts --ops=all" > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A4 "summary (Δ" $O/step.log | tail -4 | cut -c1-250; tail -2 $O/step.log | cut -c1-250 ;;
G)
  (cd /tmp && timeout $(( ${LIMIT:-570} - 20 - $(el) )) python3 -m astra_sglang.cli e2e --tp 2 \
    --model-path $OLDPWD/e2e/configs/qwen3-30b-a3b --out /tmp/srv-tp2 --ops all --calibrate \
    --workload bs1:8:128:128:1 --rounds ${ROUNDS:-3} --max-total-tokens 16384 --port 30100 > $O/served.log 2>&1)
  echo "served rc=$? at $(el)s"
  tar -C /tmp -czf $O/served-tp2.tar.gz --exclude="*/counters-*" srv-tp2 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)|identical" /tmp/srv-tp2/report.md 2>/dev/null | head -8 \
    | cut -c1-250
  grep -oE "(moe_topk_experts|moe_gate|linear): calls=[^;]*" /tmp/srv-tp2/report.md | head -3; tail -2 $O/served.log | cut -c1-250 ;;
N)
  OPS=moe_topk_experts EXTRACT=1 DTYPES=bf16 RES=$O/shipped bash kernels/gpu_run.sh check > $O/shipped.log 2>&1
  V=/tmp/mtx-rank.cu; { echo "#define ASTRA_K2_RANK_ROUTE 1"; cat kernels/moe_topk_experts/kernel.cu; } > $V
  source kernels/astra_env.sh
  (cd /tmp && timeout 300 python3 -m astra_sglang.cli check moe_topk_experts --workspace $OLDPWD/.gpu_ws/installed/moe_topk_experts \
     --candidate $V -v --json $O/check-rank.json) > $O/check-rank.log 2>&1
  echo "check rank rc=$? at $(el)s: $(grep -E '^(PASS|FAIL|error)' $O/check-rank.log | head -1 | cut -c1-200)"
  RES=$O/variants BOTH_ORDERS=1 DEADLINE=200 bash kernels/dev/bench_variants.sh moe_topk_experts \
    .gpu_ws/installed/moe_topk_experts 1x2048x768x128x8,1x2048x384x128x8 bf16 shipped= rank="-DASTRA_K2_RANK_ROUTE=1" \
    > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; tail -12 $O/variants.log | cut -c1-200
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 1 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh "rank-qwen3moe:qwen3-30b-a3b-20l:300:--base-ops=all --ops=all --candidate moe_topk_experts=$V" \
    > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A3 "summary (Δ" $O/step.log | tail -3 | cut -c1-250 ;;
*) echo "error: run.sh takes F, S, G or N" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
