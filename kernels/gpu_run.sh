#!/usr/bin/env bash
# The numbers in kernels/<op>/RESULTS.md: `astra-sglang check` and `astra-sglang bench` of each shipped
# kernel against its production kernel, on one GPU, in one run.  From the repository root:
#
#   bash kernels/gpu_run.sh [phases]        phases: check,paper,corpus (comma-separated; default all)
#   OPS="merge_state" bash kernels/gpu_run.sh corpus      (a subset of the ops)
#   VARIANT_merge_state=flashinfer bash kernels/gpu_run.sh (another production variant for one op)
#
# The ops are every op in the registry with a shipped kernel (`astra-sglang ops --json`), each against
# its first extract variant (what SGLang runs on Hopper; `astra-sglang ops` lists them).  Workspaces
# come from `astra-sglang extract OP --variant V --arch sm_90 --out .gpu_ws/V` (WS overrides the root;
# merge_state's sgl_kernel variant needs an sgl-kernel checkout, see extract --list).
# Results go to $RES (default $OUT or ./kernels-gpu-out): JSON + plots per op and phase, and one
# tarball of them all (results-<phases>.tgz); keep them under results/<date>-<gpu>/kernels/<op>/.
set -uo pipefail
phases=${1:-check,paper,corpus}
WS=${WS:-.gpu_ws}
RES=${RES:-${OUT:-./kernels-gpu-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
R=$(mktemp -d /tmp/astra-kernels.XXXX)
source kernels/astra_env.sh
# op=variant for every op with a shipped kernel, from the registry
mapfile -t PAIRS < <($AS ops --json | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    if r["kernel"] and r["extract"]:
        print(r["op"] + "=" + r["extract"][0])')
declare -A VARIANT=()
for p in "${PAIRS[@]}"; do VARIANT[${p%%=*}]=${p#*=}; done
[ ${#VARIANT[@]} -gt 0 ] || { echo "error: the registry lists no op with a shipped kernel" >&2; exit 2; }
for ph in ${phases//,/ }; do case $ph in check|paper|corpus) ;; *) echo "error: unknown phase $ph (phases: check, paper, corpus)" >&2; exit 2 ;; esac; done
for op in ${OPS:-}; do [ -n "${VARIANT[$op]:-}" ] || { echo "error: unknown op $op (ops: ${!VARIANT[*]})" >&2; exit 2; }; done
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; } | tee "$R/env.txt"
status=0
for ph in ${phases//,/ }; do
  for op in ${OPS:-$(printf '%s\n' "${!VARIANT[@]}" | sort)}; do
    v=VARIANT_$op; v=${!v:-${VARIANT[$op]}}
    ws=$WS/$v/$op
    [ -f "$ws/manifest.json" ] || { echo "no workspace $ws (astra-sglang extract $op --variant $v --arch sm_90 --out $WS/$v)"; status=1; continue; }
    cand=(--workspace "$ws" --candidate "kernels/$op/kernel.cu")
    t "$ph $op ($v)"
    case $ph in
      check)  timeout 300 $AS check $op "${cand[@]}" --json "$R/check_$op.json" || status=1 ;;
      paper)  timeout 300 $AS bench $op "${cand[@]}" --shapes paper --replays 30 --out "$R/paper_$op.json" || status=1 ;;
      corpus) timeout 540 $AS bench $op "${cand[@]}" --shapes corpus --replays 8 --out "$R/corpus_$op.json" || status=1 ;;
    esac
  done
done
tgz=$RES/results-${phases//,/-}.tgz
tar -C "$R" -czf "$tgz" . && t "results in $tgz"
exit $status
