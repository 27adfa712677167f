#!/usr/bin/env bash
# The numbers in kernels/<op>/RESULTS.md: `astra-sglang check` and `astra-sglang bench` of each shipped
# kernel against its production kernel, on one GPU, in one run.  From the repository root:
#
#   bash kernels/gpu_run.sh [phases]        phases: check,paper,corpus (comma-separated; default all)
#   OPS="merge_state" bash kernels/gpu_run.sh corpus      (a subset of the ops)
#
# Workspaces come from `astra-sglang extract` into .gpu_ws/<variant>/<op> (WS overrides the root):
#   silu_and_mul      jit         (SGLang JIT ActivationKernel)
#   fused_add_rmsnorm flashinfer  (FlashInfer FusedAddRMSNorm as sgl-kernel calls it)
#   merge_state       sgl_kernel  (sgl-kernel merge_attn_states; needs an sgl-kernel checkout, see extract --list)
# Results go to $RES (default $OUT or ./kernels-gpu-out): JSON + plots per op and phase, and one
# tarball of them all (results-<phases>.tgz) for machines that bring back few files.
set -uo pipefail
phases=${1:-check,paper,corpus}
WS=${WS:-.gpu_ws}
RES=${RES:-${OUT:-./kernels-gpu-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
R=$(mktemp -d /tmp/astra-kernels.XXXX)
source kernels/astra_env.sh
declare -A VARIANT=([silu_and_mul]=jit [fused_add_rmsnorm]=flashinfer [merge_state]=sgl_kernel)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; } | tee "$R/env.txt"
status=0
for ph in ${phases//,/ }; do
  for op in ${OPS:-silu_and_mul fused_add_rmsnorm merge_state}; do
    ws=$WS/${VARIANT[$op]}/$op
    [ -f "$ws/manifest.json" ] || { echo "no workspace $ws (astra-sglang extract $op --variant ${VARIANT[$op]} --arch sm_90 --out $WS/${VARIANT[$op]})"; status=1; continue; }
    cand=(--workspace "$ws" --candidate "kernels/$op/kernel.cu")
    t "$ph $op"
    case $ph in
      check)  timeout 300 $AS check $op "${cand[@]}" --json "$R/check_$op.json" || status=1 ;;
      paper)  timeout 300 $AS bench $op "${cand[@]}" --shapes paper --replays 30 --out "$R/paper_$op.json" || status=1 ;;
      corpus) timeout 540 $AS bench $op "${cand[@]}" --shapes corpus --replays 8 --out "$R/corpus_$op.json" || status=1 ;;
      *) echo "unknown phase $ph"; status=2 ;;
    esac
  done
done
tgz=$RES/results-${phases//,/-}.tgz
tar -C "$R" -czf "$tgz" . && t "results in $tgz"
exit $status
