#!/bin/bash
# 2026-12-02 (fortieth session), one H200 (nvidia-h200), from the repository root, after staging the FA3 wheelhouse
# (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md), except the parts marked
# "carried", which need only workspaces extracted here on the CPU and carried (astra-work):
#   bash kernels/dev/workspaces_from_wheels.sh .whl/wh33fa3/wheels astra-work/ws silu_and_mul=jit gelu_and_mul=jit \
#     gelu_tanh_and_mul=jit
# This session ran session 39's prepared parts, each with OUT=/tmp/s40 (the folder of this record):
#   LIMIT=450 bash results/2026-12-01-h200/session39/run.sh F    -> F/  (cut by its deadline in the decode corpus)
#   LIMIT=480 bash results/2026-12-01-h200/session39/run.sh G    -> G/  (carried)
#   LIMIT=420 bash results/2026-12-01-h200/session39/run.sh R2   -> R2/
#   LIMIT=400 bash results/2026-12-01-h200/session39/run.sh N    -> N/  (three of six ops before its deadline)
# Parts here:
#   bash run.sh N2  the three norms N had no time for (rmsnorm, gemma_fused_add_rmsnorm, gemma_post_attention_norms),
#                   bf16, between astra's linears, 48 replays (run as one inline command of the same lines)
#   bash run.sh D   NOT RUN (prepared): moe_grouped_router's fp32 decode corpus alone (F ran out of time after 11 rows)
#   bash run.sh C   NOT RUN (prepared, carried): check of gelu_and_mul and gelu_tanh_and_mul after the late-release
#                   switch was taken out of both kernels (the code they ran before 8d6f205)
#   bash run.sh V   NOT RUN (prepared): validate rmsnorm and gemma_rmsnorm in SGLang 0.5.17's layers with the
#                   129-256-token keep bands (their kept rows report n/a), bf16 and fp16
#   bash run.sh B3  NOT RUN (prepared): session 37's B2 for the other four norms, fp16, between astra's linears,
#                   48 replays (fused_add_rmsnorm, qknorm, gemma_rmsnorm, gemma_post_attention_norms)
#   bash run.sh A   NOT RUN (prepared, carried): gelu_tanh_and_mul at 2-12 tokens, the calls it serves (gate_up_gelu_tanh
#                   takes 1-2, its keep rule leaves 16-256 to SGLang) that no corpus row times, with the 1- and 16-token
#                   rows as anchors, 48 replays, both orders, between astra's linears: where its keep rule should start
#   bash run.sh P   NOT RUN (prepared): moe_combine against the installed sgl_kernel.moe_sum_reduce (the new
#                   `installed` variant, no checkout): check, then the rows fused_moe hands it (64-256-token decode,
#                   1k-16k prefill), bf16; the patch leaves them to SGLang today (max_tokens 32)
set -uo pipefail
PART=${1:?N2, D, C, V, B3, A or P}
case $PART in N2|D|C|V|B3|A|P) ;; *) echo "error: run.sh takes N2, D, C, V, B3, A or P" >&2; exit 2 ;; esac
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s40}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
case $PART in
C|A) ;;
*) bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
   export PYTHONPATH=/tmp/e2e-site ;;
esac
case $PART in
N2)
  OPS="rmsnorm gemma_fused_add_rmsnorm gemma_post_attention_norms" EXTRACT=1 DTYPES=bf16 NEIGHBOURS=astra REPLAYS=48 \
    DEADLINE=300 RES=$O/bench bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
D)
  OPS=moe_grouped_router EXTRACT=1 DTYPES=fp32 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench \
    bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
C)
  OPS="gelu_and_mul gelu_tanh_and_mul" WS=astra-work/ws RES=$O/bench bash kernels/gpu_run.sh check > $O/bench.log 2>&1
  echo "check rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
V)
  for op in rmsnorm gemma_rmsnorm; do
    (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops $op --dtypes bf16,fp16 \
       --json $O/validate-$op.json) > $O/validate-$op.log 2>&1
    echo "validate $op rc=$? at $(el)s: $(tail -1 $O/validate-$op.log | cut -c1-200)"
  done ;;
B3)
  OPS="fused_add_rmsnorm qknorm gemma_rmsnorm gemma_post_attention_norms" EXTRACT=1 DTYPES=fp16 NEIGHBOURS=astra \
    REPLAYS=48 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
A)
  NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=$(( ${LIMIT:-570} - 60 )) BENCH_ARGS="--replays 48" RES=$O \
    bash kernels/dev/bench_variants.sh gelu_tanh_and_mul astra-work/ws/jit/gelu_tanh_and_mul \
    1x14336,2x14336,4x14336,8x14336,12x14336,16x14336,4x21504,8x21504,4x15360,8x15360 bf16 default= > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; grep -v '^ *·' $O/variants.log | tail -30 | cut -c1-200 ;;
P)
  OPS=moe_combine VARIANT_moe_combine=installed EXTRACT=1 DTYPES=bf16 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) \
    RES=$O/bench bash kernels/gpu_run.sh check,decode,prefill > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
esac
echo "part $PART done at $(el)s"
