#!/bin/bash
# 2026-12-01 (thirty-seventh session), one H200 (nvidia-h200), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md). This
# session also ran session 36's parts V, S and P (`bash results/2026-12-01-h200/session36/run.sh V|S|P`). Parts here:
#   bash run.sh A   moe_align's validate in its own dtype (int32; session 36's V asked for bf16, which it has not),
#                   then rope_store and kv_store re-timed (bf16 decode, in context, today's timer): their last
#                   numbers predate the timer's fixes
#   bash run.sh B   the norm family in fp16 (issue 14's evidence is bf16 at serving sites): decode bench, in context
#                   between the GEMMs serving runs each op between (bench --sites serving, the default)
#   bash run.sh C   gelu_and_mul (off by default) in a served model: astra-sglang profile of Gemma-7B (Gemma-1 calls
#                   GeluAndMul("none")) with every default op plus gelu_and_mul, batch 1 (gate_up_gelu takes the
#                   decode MLP; gelu_and_mul the prefill's) and 4 (above gate_up_gelu's 1-2 tokens: gelu_and_mul's)
#   bash run.sh B2  NOT RUN (prepared): part B between the GEMMs a patched server runs (NEIGHBOURS=astra: astra's
#                   linear where it takes the GEMM), as issue 14's bf16 numbers were timed; B used cuBLAS GEMMs
#   bash run.sh F1  NOT RUN (prepared for the next session): issue 15's prefill corpora (1k-16k tokens), none measured
#                   yet: rope, rope_store, kv_store, qknorm_rope, qknorm_rope_store, dense_rope_store (bf16)
#   bash run.sh F2  NOT RUN: the same for the MoE ops with prefill shapes: moe_router, moe_gate, moe_combine (bf16),
#                   moe_grouped_router (its serving fp32), moe_align (int32; rows over 2,048 ids are SGLang's by design)
#   bash run.sh G   NOT RUN: moe_grouped_router's whole decode corpus in its serving fp32 with the shipped defaults
#                   (the warp router without a shared column, the CTA kernel with one): check, then decode in context
set -uo pipefail
PART=${1:?A, B, B2, C, F1, F2 or G}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s37}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site
case $PART in
A)
  (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops moe_align --dtypes int32 \
     --json $O/validate-moe_align.json) > $O/validate-moe_align.log 2>&1
  echo "validate moe_align rc=$? at $(el)s: $(tail -1 $O/validate-moe_align.log | cut -c1-200)"
  xz -f $O/validate-moe_align.json 2>/dev/null
  OPS="rope_store kv_store" EXTRACT=1 DTYPES=bf16 DEADLINE=$(( ${LIMIT:-570} - 120 - $(el) )) RES=$O/bench \
    bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cat $O/bench/summary.txt 2>/dev/null | cut -c1-250 ;;
B|B2)
  [ $PART = B2 ] && export NEIGHBOURS=astra
  OPS="fused_add_rmsnorm qknorm gemma_rmsnorm gemma_fused_add_rmsnorm gemma_post_attention_norms rmsnorm" EXTRACT=1 \
    DTYPES=fp16 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
C)
  (cd /tmp && timeout $(( ${LIMIT:-570} - 15 - $(el) )) python3 -m astra_sglang.cli profile --model-path \
    $OLDPWD/e2e/configs/gemma-7b --ops all,gelu_and_mul --batch-size 1,4 --out /tmp/prof-gemma-7b) > $O/profile.log 2>&1
  echo "profile rc=$? at $(el)s"; cp /tmp/prof-gemma-7b/profile.md $O/profile-gemma-7b.md 2>/dev/null
  grep -E "^### |gelu|gate_up" /tmp/prof-gemma-7b/profile.md 2>/dev/null | cut -c1-200 ;;
F1|F2)
  [ $PART = F1 ] && ops="rope rope_store kv_store qknorm_rope qknorm_rope_store dense_rope_store" \
    || ops="moe_router moe_gate moe_combine moe_grouped_router moe_align"
  OPS="$ops" EXTRACT=1 DTYPES=bf16 DEADLINE=$(( ${LIMIT:-570} - 100 - $(el) )) RES=$O/bench \
    bash kernels/gpu_run.sh prefill > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
G)
  OPS=moe_grouped_router EXTRACT=1 DTYPES=bf16 DEADLINE=$(( ${LIMIT:-570} - 100 - $(el) )) RES=$O/bench \
    bash kernels/gpu_run.sh check,decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
*) echo "error: run.sh takes A, B, B2, C, F1, F2 or G" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
