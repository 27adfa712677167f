#!/bin/bash
# 2026-12-02 (forty-first session), one H200 (nvidia-h200), from the repository root. The standard trimmed wheelhouse
# (`python e2e/build_wheelhouse.py --out .whl/wh --lock e2e/wheelhouse/lock.txt --chunk-mib auto`: five 28.5 MiB parts
# beside the sparse checkout, no FA3: nothing here serves) was staged with `bash e2e/device_install.sh stage
# .whl/wh/carry/partNN`, except for the parts marked "carried", which need only workspaces extracted here on the CPU
# (`bash kernels/dev/workspaces_from_wheels.sh .whl/wh/wheels astra-work/ws silu_and_mul=jit gelu_and_mul=jit
# gelu_tanh_and_mul=jit`, carry astra-work).
# This session ran session 40's prepared parts, each with OUT=/tmp/s41 (the folder of this record):
#   bash results/2026-12-02-h200/session40/run.sh C            -> C/   (carried)
#   LIMIT=370 bash results/2026-12-02-h200/session40/run.sh A  -> A/   (carried)
#   LIMIT=480 bash results/2026-12-02-h200/session40/run.sh P  -> P/   (check failed one fp32 case: see P2)
#   LIMIT=530 bash results/2026-12-02-h200/session40/run.sh D  -> D/
#   bash results/2026-12-02-h200/session40/run.sh V            -> V/
#   LIMIT=420 bash results/2026-12-02-h200/session40/run.sh B3 -> B3/  (three of four ops before its deadline)
# Parts here (as run, each as one inline command of the same lines):
#   bash run.sh P2  moe_combine's check against the installed sgl_kernel after 2f265cc (fp32 `alone` tolerance)
#   bash run.sh A2  gelu_tanh_and_mul at 2-16 tokens again, more widths (carried)
#   bash run.sh B4  gemma_post_attention_norms fp16 between astra's linears, 48 replays (B3 had no time for it)
#   bash run.sh B5  gemma_fused_add_rmsnorm the same way (the sixth norm's fp16 corpus at 48 replays)
#   bash run.sh P3  moe_combine's 64-256-token decode rows against the installed sgl_kernel at its serving sites
#                   between astra's linears, 48 replays (LIMIT=240, a second hold): every 256-token row faster, so the
#                   adapter now takes 129-256 tokens
#   bash run.sh M   NOT RUN (prepared): moe_combine's new 129-256-token band in SGLang: validate (bf16, fp16), then a
#                   decode-step A/B of the 20-layer Qwen3-30B-A3B at batch 160, arm A every default op but moe_combine,
#                   arm B all of them (the only calls that differ are the combine's 160-token ones)
set -uo pipefail
PART=${1:?P2, A2, B4, B5, P3 or M}
case $PART in P2|A2|B4|B5|P3|M) ;; *) echo "error: run.sh takes P2, A2, B4, B5, P3 or M" >&2; exit 2 ;; esac
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s41}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
case $PART in
A2) ;;
*) bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
   bash e2e/device_install.sh astra > $O/astra.log 2>&1  # the checkout's astra, not the first install's
   export PYTHONPATH=/tmp/e2e-site ;;
esac
case $PART in
P2)
  OPS=moe_combine VARIANT_moe_combine=installed EXTRACT=1 DTYPES=bf16 RES=$O/bench bash kernels/gpu_run.sh check \
    > $O/bench.log 2>&1
  echo "check rc=$? at $(el)s"; cut -c1-300 $O/bench/summary.txt 2>/dev/null ;;
A2)
  NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=100 BENCH_ARGS="--replays 48" RES=$O \
    bash kernels/dev/bench_variants.sh gelu_tanh_and_mul astra-work/ws/jit/gelu_tanh_and_mul \
    2x14336,3x14336,4x14336,6x14336,8x14336,10x14336,12x14336,3x21504,6x21504,12x21504,16x21504 bf16 default= \
    > $O/variants.log 2>&1
  echo "A2 rc=$?"; grep -v '^ *·' $O/variants.log | tail -16 | cut -c1-120 ;;
B4|B5)
  op=gemma_post_attention_norms; [ $PART = B5 ] && op=gemma_fused_add_rmsnorm
  OPS=$op EXTRACT=1 DTYPES=fp16 NEIGHBOURS=astra REPLAYS=48 DEADLINE=230 RES=$O/bench \
    bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$?"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
P3)
  OPS=moe_combine VARIANT_moe_combine=installed EXTRACT=1 DTYPES=bf16 NEIGHBOURS=astra REPLAYS=48 \
    DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
M)
  (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops moe_combine --dtypes bf16,fp16 \
     --json $O/validate-moe_combine.json) > $O/validate-moe_combine.log 2>&1
  echo "validate moe_combine rc=$? at $(el)s: $(tail -1 $O/validate-moe_combine.log | cut -c1-200)"
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 160 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh "mc160-qwen3moe:qwen3-30b-a3b-20l:${STEP_S:-400}:--base-ops=all,-moe_combine --ops=all" \
    > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A3 "summary (Δ" $O/step.log | tail -3 | cut -c1-250 ;;
esac
echo "part $PART done at $(el)s"
