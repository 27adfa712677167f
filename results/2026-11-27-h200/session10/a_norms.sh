#!/bin/bash
# 2026-11-27/28 (tenth session): kernel-only calls (no SGLang install: production workspaces extracted on the CPU with
# `bash kernels/dev/workspaces_from_wheels.sh .whl/wh26/wheels astra-work/ws OP ...`, carried with .whl/mini, the
# libcst wheel). From the repository root on the GPU machine:
#   bash a_norms.sh 1   checks (the four norms with ASTRA_W_EARLY=1, qknorm with ASTRA_QKN_ORDER=1 and as shipped), then
#                       the decode corpus of the four norms in context, shipped against ASTRA_W_EARLY=1 (the weight
#                       loaded into registers before griddepcontrol.wait), one run per op
#   bash a_norms.sh 3   the fused norms' decode corpus again, ASTRA_W_EARLY=1 first, then as shipped, then
#                       ASTRA_W_EARLY=1 again: does part 1's fused_add_rmsnorm 1.248x -> 1.300x hold in another run
#   bash a_norms.sh 2   rmsnorm and gemma_rmsnorm's 256-token rows: PDL placement and prefetch variants; qknorm's
#                       decode corpus, shipped against SGLang's summation order; qknorm_rope_store's decode corpus,
#                       shipped against the normed value not rounded (its rounding was never timed)
# EXTRA (part 2 only): more NAME="-DFLAG=V" variants for rmsnorm's decode corpus, decided from part 1.
set -uo pipefail
PART=${1:?1, 2 or 3}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source kernels/astra_env.sh
python3 -c "import libcst" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/mini/*.whl
WS=astra-work/ws O=/tmp/s10/p$PART
mkdir -p $O/checks $O/var
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; } | tee $O/env.txt
ck() {  # ck NAME OP WORKSPACE [FLAG=V ...]: check kernels/OP/kernel.cu with FLAGs defined first
  local name=$1 op=$2 ws=$3; shift 3
  local f=$O/checks/$name.cu; : > $f
  for d in "$@"; do echo "#define ${d%%=*} ${d#*=}" >> $f; done; cat kernels/$op/kernel.cu >> $f
  timeout 300 $AS check $op --workspace $ws --candidate $f --seed 7 --json $O/checks/$name.json > $O/checks/$name.log 2>&1
  echo "rc=$?" >> $O/checks/$name.log
}
run_ck() { while [ "$(jobs -rp | wc -l)" -ge 6 ]; do sleep 1; done; ck "$@" & }
bv() {  # bv BUDGET OP WS_SUBDIR SHAPES VARIANT...
  local budget=$1 op=$2 ws=$3 shapes=$4; shift 4
  RES=$O/var timeout $budget bash kernels/dev/bench_variants.sh $op $WS/$ws/$op $shapes bf16 "$@" > $O/variants_$op$TAG.txt 2>&1
  echo "$op$TAG variants rc=$? at $(el)s"
}
if [ "$PART" = 1 ]; then
  for op in fused_add_rmsnorm gemma_fused_add_rmsnorm rmsnorm gemma_rmsnorm; do
    run_ck ${op}_wE $op $WS/flashinfer/$op ASTRA_W_EARLY=1
  done
  run_ck qknorm qknorm $WS/jit/qknorm
  run_ck qknorm_ord1 qknorm $WS/jit/qknorm ASTRA_QKN_ORDER=1
  wait; echo "checks done at $(el)s"
  TAG= bv 150 fused_add_rmsnorm flashinfer decode default= wE="-DASTRA_W_EARLY=1"
  TAG= bv 120 gemma_fused_add_rmsnorm flashinfer decode default= wE="-DASTRA_W_EARLY=1"
  TAG= bv 150 rmsnorm flashinfer decode default= wE="-DASTRA_W_EARLY=1"
  TAG= bv $(( 575 - $(el) )) gemma_rmsnorm flashinfer decode default= wE="-DASTRA_W_EARLY=1"
elif [ "$PART" = 3 ]; then
  TAG= bv 300 fused_add_rmsnorm flashinfer decode wE="-DASTRA_W_EARLY=1" default= wE2="-DASTRA_W_EARLY=1"
  TAG= bv $(( 560 - $(el) )) gemma_fused_add_rmsnorm flashinfer decode wE="-DASTRA_W_EARLY=1" default= \
    wE2="-DASTRA_W_EARLY=1"
else
  TAG=_256 bv 130 rmsnorm flashinfer 256x1536,256x2880,256x4096,256x7168 default= pdl1="-DASTRA_PDL=1" \
    pf0="-DASTRA_PF_MAX=0u" pdl1pf0="-DASTRA_PDL=1 -DASTRA_PF_MAX=0u"
  TAG=_256 bv 130 gemma_rmsnorm flashinfer 256x2304,256x3584,256x3840,256x5376 default= pdl1="-DASTRA_PDL=1" \
    pf0="-DASTRA_PF_MAX=0u" pdl1pf0="-DASTRA_PDL=1 -DASTRA_PF_MAX=0u"
  TAG= bv 140 qknorm jit decode default= ord1="-DASTRA_QKN_ORDER=1"
  TAG= bv $(( 575 - $(el) )) qknorm_rope_store jit decode default= round0="-DASTRA_QKN_ROUND=0"
fi
tar -C /tmp/s10 -cJf $OUT/p$PART.tar.xz p$PART
for f in $O/checks/*.log; do
  [ -f "$f" ] || continue
  printf '%-26s %s | %s\n' "$(basename $f .log)" "$(grep -E '^(PASS|FAIL)' $f | head -1 | cut -c1-60)" \
    "$(grep -h 'bit-identical to production' $f | head -1 | cut -c1-80)"
done | tee $O/checks.txt
for f in $O/variants_*.txt; do echo "== $(basename $f .txt)"; grep -A3 "over the" $f; done
