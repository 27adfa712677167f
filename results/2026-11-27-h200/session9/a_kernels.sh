#!/bin/bash
# 2026-11-27 (ninth session), call A: no SGLang install (the workspaces were extracted on the CPU from the 0.5.17 wheels:
# `astra-sglang extract OP --variant V --sglang-src ... --flashinfer-src ... --tvm-ffi-src ... --out astra-work/ws/V`,
# carried with the call).
#  1. check: rope, rope_store, qknorm_rope, qknorm_rope_store with the rotation's fma form pinned (X=1 Y=2) and the
#     normed value rounded as production rounds it, against the old forms: how many comparisons are bit-identical;
#     fused_add_rmsnorm with a decode row split over a cluster (dev flags), for correctness and bit-identity.
#  2. bench (in context, with the floor): fused_add_rmsnorm's cluster split of decode rows, pull and push exchange,
#     and one vector per thread, against the shipped kernel.
# The cluster flags (ASTRA_CL_SMALL, ASTRA_CL_PUSH) were removed from kernels/fused_add_rmsnorm/kernel.cu afterwards: to
# rerun them, apply fused_add_rmsnorm_cluster_variant.patch (beside this script) to the kernel of 2aa35c2
# (`git show 2aa35c2:kernels/fused_add_rmsnorm/kernel.cu`, then `patch -p1`). The `one` variant is today's shipped plan.
# From the repository root on the GPU machine:  bash a_kernels.sh
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source kernels/astra_env.sh
python3 -c "import libcst" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/mini/*.whl
WS=astra-work/ws O=/tmp/o
mkdir -p $O/checks $O/var
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; } | tee $O/env.txt
ck() {  # ck NAME OP WORKSPACE [FLAG=V ...]: check kernels/OP/kernel.cu with FLAGs defined first
  local name=$1 op=$2 ws=$3; shift 3
  local f=$O/checks/$name.cu; : > $f
  for d in "$@"; do echo "#define ${d%%=*} ${d#*=}" >> $f; done; cat kernels/$op/kernel.cu >> $f
  timeout 420 $AS check $op --workspace $ws --candidate $f --seed 7 --json $O/checks/$name.json > $O/checks/$name.log 2>&1
  echo "rc=$?" >> $O/checks/$name.log
}
J=${CHECK_JOBS:-6}
run_ck() { while [ "$(jobs -rp | wc -l)" -ge $J ]; do sleep 1; done; ck "$@" & }
run_ck rope rope $WS/jit/rope
run_ck rope_xy00 rope $WS/jit/rope ASTRA_ROPE_X=0 ASTRA_ROPE_Y=0
run_ck rope_store rope_store $WS/jit/rope_store
run_ck rope_store_xy00 rope_store $WS/jit/rope_store ASTRA_ROPE_X=0 ASTRA_ROPE_Y=0
run_ck qknorm_rope qknorm_rope $WS/jit/qknorm_rope
run_ck qknorm_rope_old qknorm_rope $WS/jit/qknorm_rope ASTRA_QKN_ROUND=0 ASTRA_ROPE_X=0 ASTRA_ROPE_Y=0
run_ck qknorm_rope_store qknorm_rope_store $WS/jit/qknorm_rope_store
run_ck qknorm_rope_store_old qknorm_rope_store $WS/jit/qknorm_rope_store ASTRA_QKN_ROUND=0 ASTRA_ROPE_X=0 ASTRA_ROPE_Y=0
run_ck qknorm_rope_store_r1xy00 qknorm_rope_store $WS/jit/qknorm_rope_store ASTRA_ROPE_X=0 ASTRA_ROPE_Y=0
run_ck farn_cl4 fused_add_rmsnorm $WS/flashinfer/fused_add_rmsnorm ASTRA_CL_SMALL=4
run_ck farn_cl4p fused_add_rmsnorm $WS/flashinfer/fused_add_rmsnorm ASTRA_CL_SMALL=4 ASTRA_CL_PUSH=1
run_ck farn_cl8p fused_add_rmsnorm $WS/flashinfer/fused_add_rmsnorm ASTRA_CL_SMALL=8 ASTRA_CL_PUSH=1
wait
echo "checks done at $(el)s"
for f in $O/checks/*.log; do
  n=$(basename $f .log)
  printf '%-26s %s | %s\n' "$n" "$(grep -E '^(PASS|FAIL)' $f | head -1 | cut -c1-50)" "$(grep -h 'bit-identical to production' $f | head -1 | cut -c1-90)"
done | tee $O/checks.txt
RES=$O/var timeout $(( 570 - $(el) )) bash kernels/dev/bench_variants.sh fused_add_rmsnorm $WS/flashinfer/fused_add_rmsnorm \
  ${SHAPES:-1x4096,16x4096,64x4096,1x5120,1x7168,1x8192,1x1536,16x3584} bf16 default= \
  cl2="-DASTRA_CL_SMALL=2" cl4="-DASTRA_CL_SMALL=4" cl2p="-DASTRA_CL_SMALL=2 -DASTRA_CL_PUSH=1" \
  cl4p="-DASTRA_CL_SMALL=4 -DASTRA_CL_PUSH=1" cl8p="-DASTRA_CL_SMALL=8 -DASTRA_CL_PUSH=1" one="-DASTRA_ONE_MAX=1024u" \
  > $O/variants.txt 2>&1
echo "variants rc=$? at $(el)s"
tar -C /tmp -czf $OUT/a_kernels.tgz o
cat $O/variants.txt | tail -24
