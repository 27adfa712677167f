#!/bin/bash
# 2026-11-28 (eleventh session): kernel-only calls (no SGLang install; production workspaces extracted on the CPU with
# `bash kernels/dev/workspaces_from_wheels.sh .whl/wh26/wheels astra-work/ws OP ...`, carried with .whl/mini, the
# libcst wheel). From the repository root on the GPU machine:
#   bash a_kernels.sh 1   gemma_post_attention_norms: check, decode (in context), prefill; then the prefill corpus of
#                         the norm/activation ops never benched there (issue 14: every row >= 1.00x)
#   bash a_kernels.sh 2   the prefill corpus of the ops whose kernels changed since their last prefill bench
#   bash a_kernels.sh 3   gelu_and_mul (part 1: 0.97x on the prefill corpus): compile-time variants on its prefill
#                         rows, both orders (run in the first wheelhouse staging call)
set -uo pipefail
PART=${1:?1, 2 or 3}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source kernels/astra_env.sh
python3 -c "import libcst" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/mini/*.whl
O=/tmp/s11/p$PART; mkdir -p $O
export WS=astra-work/ws
if [ "$PART" = 1 ]; then
  RES=$O/gpan DEADLINE=200 OPS=gemma_post_attention_norms bash kernels/gpu_run.sh check,decode,prefill > $O/gpan.log 2>&1
  echo "gemma_post_attention_norms done at $(el)s"
  RES=$O/prefill DEADLINE=$(( 520 - $(el) )) OPS="gemma_rmsnorm gemma_fused_add_rmsnorm rmsnorm gelu_tanh_and_mul gelu_and_mul" \
    bash kernels/gpu_run.sh prefill > $O/prefill.log 2>&1
elif [ "$PART" = 3 ]; then
  V=(default= i32="-DASTRA_IDX32=1" pf0="-DASTRA_PF_ALL=0" p2="-DASTRA_P_BIG=2" i32p2="-DASTRA_IDX32=1 -DASTRA_P_BIG=2")
  RES=$O/var_prefill BOTH_ORDERS=1 timeout 280 bash kernels/dev/bench_variants.sh gelu_and_mul $WS/jit/gelu_and_mul \
    4096x16384,4096x24576 fp16,bf16 "${V[@]}" > $O/variants_prefill.txt 2>&1
  echo "prefill variants rc=$? at $(el)s"
else
  RES=$O/prefill DEADLINE=500 OPS="qknorm fused_add_rmsnorm silu_and_mul" bash kernels/gpu_run.sh prefill > $O/prefill.log 2>&1
fi
echo "all done at $(el)s"
tar -C /tmp/s11 -cJf $OUT/p$PART.tar.xz p$PART
cat $O/*/summary.txt 2>/dev/null
for f in $O/variants_*.txt; do [ -f $f ] && { echo "== $(basename $f .txt)"; grep -A8 "over the" $f; }; done
