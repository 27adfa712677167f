#!/bin/bash
# 2026-12-01 (thirty-fourth session), one H200 (nvidia-h200), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md). Parts:
#   bash run.sh A   dense_rope_store on Gemma-1 (its first GPU run there): check and decode corpus in context (bf16),
#                   validate dense_rope_store and linear (its 24576-wide rows); the Gemma-7B decode-step A/B: arm A
#                   every default op but dense_rope_store, B every default op; batch 1, 2
#   bash run.sh B   served Gemma-7B, batch 1: unpatched (A, A2) against every default op (B)
#   bash run.sh C   moe_topk_experts (the router folded into the experts, new; first GPU run): check and decode corpus in
#                   context (bf16), validate (bf16, fp16); the Qwen3-30B-A3B (20 layers) decode-step A/B: arm A every
#                   default op, B the same and moe_topk_experts; batch 1, 2 (SKIP_CORPUS=1: validate and the step only)
#   bash run.sh D   served Qwen3-30B-A3B (20 layers), batch 1: unpatched (A, A2) against `--ops all,moe_topk_experts`
#   bash run.sh E   moe_topk_experts' check and decode rows after the argmax refactor; linear's 24576 rows in fp16
set -uo pipefail
PART=${1:?A, B, C, D or E}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s34}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site
case $PART in
A)
  OPS=dense_rope_store EXTRACT=1 DTYPES=bf16 RES=$O/drs bash kernels/gpu_run.sh check,decode > $O/drs.log 2>&1
  echo "dense_rope_store corpus rc=$? at $(el)s"; cut -c1-250 $O/drs/summary.txt 2>/dev/null
  grep -E "^gemma-(2b|7b)|^ *1x.*(2048|4096|8192)" $O/drs.log | head -6 | cut -c1-200
  for op in dense_rope_store linear; do
    (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops $op --dtypes bf16 \
       --json $O/validate-$op.json) > $O/validate-$op.log 2>&1
    echo "validate $op rc=$? at $(el)s: $(tail -1 $O/validate-$op.log | cut -c1-200)"
  done
  grep -iE "gemma|24576" $O/validate-*.log | head -8 | cut -c1-200
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh 'drs-gemma7b:gemma-7b:400:--base-ops=all,-dense_rope_store --ops=all' > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A4 "summary (Δ" $O/step.log | tail -4 | cut -c1-250; tail -2 $O/step.log | cut -c1-250 ;;
B)
  (cd /tmp && timeout $(( ${LIMIT:-570} - 20 - $(el) )) python3 -m astra_sglang.cli e2e \
    --model-path $OLDPWD/e2e/configs/gemma-7b --out /tmp/srv-gemma7b --ops all --calibrate \
    --workload bs1:8:128:128:1 --rounds ${ROUNDS:-3} --max-total-tokens 16384 --port 30100 > $O/served.log 2>&1)
  echo "served rc=$? at $(el)s"
  tar -C /tmp -czf $O/served-gemma7b.tar.gz --exclude="*/counters-*" srv-gemma7b 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)|identical|dense_rope_store|linear" /tmp/srv-gemma7b/report.md \
    2>/dev/null | head -12 | cut -c1-250; tail -3 $O/served.log | cut -c1-250 ;;
C)
  [ -n "${SKIP_CORPUS:-}" ] || OPS=moe_topk_experts EXTRACT=1 DTYPES=bf16 RES=$O/mtx bash kernels/gpu_run.sh check,decode > $O/mtx.log 2>&1
  echo "moe_topk_experts corpus rc=$? at $(el)s"; grep -E "^(check|decode) " $O/mtx.log | cut -c1-400
  (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops moe_topk_experts --dtypes bf16,fp16 \
     --json $O/validate-mtx.json) > $O/validate-mtx.log 2>&1
  echo "validate moe_topk_experts rc=$? at $(el)s: $(tail -1 $O/validate-mtx.log | cut -c1-200)"
  grep -E "moe_topk_experts +(bf16|fp16)" $O/validate-mtx.log | head -8 | cut -c1-200
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh 'mtx-qwen3moe:qwen3-30b-a3b-20l:420:--base-ops=all --ops=all,moe_topk_experts' \
    > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A4 "summary (Δ" $O/step.log | tail -4 | cut -c1-250; tail -2 $O/step.log | cut -c1-250 ;;
D)
  (cd /tmp && timeout $(( ${LIMIT:-570} - 20 - $(el) )) python3 -m astra_sglang.cli e2e \
    --model-path $OLDPWD/e2e/configs/qwen3-30b-a3b-20l --out /tmp/srv-mtx --ops all,moe_topk_experts --calibrate \
    --workload bs1:8:128:128:1 --rounds ${ROUNDS:-3} --max-total-tokens 16384 --port 30100 > $O/served.log 2>&1)
  echo "served rc=$? at $(el)s"
  tar -C /tmp -czf $O/served-qwen3moe.tar.gz --exclude="*/counters-*" srv-mtx 2>/dev/null
  grep -E "^\| (output throughput|TPOT mean)|identical" /tmp/srv-mtx/report.md 2>/dev/null | head -8 | cut -c1-250
  grep -o "moe_topk_experts: calls=[^;]*" /tmp/srv-mtx/report.md | head -1; tail -2 $O/served.log | cut -c1-250 ;;
E)
  # after ae113bc (moe_topk_experts' two routings share one argmax round; PTX equal up to instruction order): its check
  # and decode rows again; then linear's 24576-wide rows in fp16 (session 33 benched bf16 only)
  OPS=moe_topk_experts EXTRACT=1 DTYPES=bf16 RES=$O/mtx bash kernels/gpu_run.sh check,decode > $O/mtx.log 2>&1
  echo "moe_topk_experts corpus rc=$? at $(el)s"; grep -E "^(check|decode) " $O/mtx.log | cut -c1-300
  source kernels/astra_env.sh
  WS=/tmp/ws34e
  $AS extract linear --variant installed --arch sm_90 --out $WS/installed --no-build > $O/extract-linear.log 2>&1
  (cd /tmp && timeout 200 python3 -m astra_sglang.cli bench linear --workspace $WS/installed/linear \
     --candidate $OLDPWD/kernels/linear/kernel.cu --shapes 1x24576x3072,2x24576x3072 --dtype fp16 \
     --out $O/bench-linear-fp16.json) > $O/bench-linear-fp16.log 2>&1
  echo "linear fp16 bench rc=$? at $(el)s"; grep -E "^(1|2)x24576|geomean" $O/bench-linear-fp16.log | cut -c1-200 ;;
*) echo "error: run.sh takes A, B, C, D or E" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
