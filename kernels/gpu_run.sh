#!/usr/bin/env bash
# The numbers in kernels/<op>/RESULTS.md: `astra-sglang check` and `astra-sglang bench` of each shipped
# kernel against its production kernel, on one GPU, in one run.  From the repository root:
#
#   bash kernels/gpu_run.sh [phases]        phases: check,decode,prefill,paper,corpus (comma-separated;
#                                           default check,decode,prefill)
#   OPS="merge_state" bash kernels/gpu_run.sh decode      (a subset of the ops, in this order)
#   VARIANT_merge_state=flashinfer bash kernels/gpu_run.sh (another production variant for one op)
#   DTYPES=bf16 DEADLINE=480 bash kernels/gpu_run.sh       (dtypes to bench where the op has them; skip what
#                                                           would start late)
#   EXTRACT=1 bash kernels/gpu_run.sh                      (extract a missing workspace from the SGLang installed
#                                                           here first, e.g. PYTHONPATH=/tmp/e2e-site)
#   NEIGHBOURS=astra bash kernels/gpu_run.sh decode        (the in-context GEMMs a patched server runs: astra's
#                                                           linear where it takes them; bench --neighbours)
# Decode rows of an op whose spec names the GEMM pairs serving runs it between are timed between each (bench's default
# --sites serving, astra_sglang/sites.py: fused_add_rmsnorm, gemma_post_attention_norms, the activations,
# moe_combine, gemma_rmsnorm, gemma_fused_add_rmsnorm, qknorm, rope); the rest between bench's generic pair.
#
# The ops are every op in the registry with a shipped kernel (`astra-sglang ops --json`), each against
# its first extract variant (what SGLang runs on Hopper; `astra-sglang ops` lists them).  Workspaces
# come from `astra-sglang extract OP --variant V --arch sm_90 --out $WS/V` (WS defaults to .gpu_ws;
# --no-build is fine: check builds what is missing).
# check runs every op at once (correctness only, CHECK_JOBS at a time); the benches run one at a time.
# A bench that would start after DEADLINE seconds is skipped and says so; one running then gets 60 s more.
# Results go to $RES (default $OUT or ./kernels-gpu-out): one tarball (results-<phases>.tgz) of every
# JSON, plot and log, json/ (the check and bench JSONs as files, .json.xz over 10,000 bytes, the layout
# test's bound: the profile's speedup lookup reads those under results/, never a tarball) and summary.txt
# (one line per op and phase); keep them under results/<date>-<gpu>/kernels/.
set -uo pipefail
phases=${1:-check,decode,prefill}
WS=${WS:-.gpu_ws}
DEADLINE=${DEADLINE:-100000}
CHECK_JOBS=${CHECK_JOBS:-6}
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
for ph in ${phases//,/ }; do case $ph in check|decode|prefill|paper|corpus) ;; *)
  echo "error: unknown phase $ph (phases: check, decode, prefill, paper, corpus)" >&2; exit 2 ;; esac; done
for op in ${OPS:-}; do [ -n "${VARIANT[$op]:-}" ] || { echo "error: unknown op $op (ops: ${!VARIANT[*]})" >&2; exit 2; }; done
ops=${OPS:-$(printf '%s\n' "${!VARIANT[@]}" | sort)}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }; t() { echo "[$(el)s] $*"; }
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  git rev-parse --short HEAD 2>/dev/null; } | tee "$R/env.txt"
ws_of() { local v=VARIANT_$1; v=${!v:-${VARIANT[$1]}}; echo "$WS/$v/$1"; }
status=0
for op in $ops; do
  ws=$(ws_of $op)
  if [ -d "$ws" ] && [ ! -f "$ws/manifest.json" ]; then   # extract will not overwrite it
    echo "error: $ws has no manifest.json (a half-made workspace): remove it, then run again with EXTRACT=1"; status=1
    continue
  fi
  if [ ! -f "$ws/manifest.json" ] && [ -n "${EXTRACT:-}" ]; then   # from the SGLang installed on this machine
    t "extract $op (${ws%/*})"
    $AS extract $op --variant "$(basename "$(dirname "$ws")")" --arch sm_90 --out "${ws%/*}" --no-build \
      > "$R/extract-$op.log" 2>&1 || tail -3 "$R/extract-$op.log"
  fi
  [ -f "$ws/manifest.json" ] || { echo "no workspace $ws (astra-sglang extract $op --arch sm_90 --out ${WS}/<variant>, or EXTRACT=1)"; status=1; }
done
summary() { echo "$1" | tee -a "$R/summary.txt"; }
# DTYPES is the model's dtype: the op's own serving dtypes where it declares them (DeepSeek-V3's router: fp32), else
# the DTYPES it takes, else its own (moe_align: int32); cases.default_dtypes, as bench and validate choose
dtypes_of() { [ -n "${DTYPES:-}" ] || return 0; python3 -c '
import sys
from astra_sglang.harness.cases import default_dtypes
from astra_sglang.registry import get_op
spec = get_op(sys.argv[1])
print(",".join(default_dtypes(spec.dtypes, spec.serving_dtypes, sys.argv[2].split(","))))' "$1" "$DTYPES"; }
check_one() {   # check_one OP: the shipped kernel against the workspace's production -> $R/check_OP.{log,json}
  timeout 600 $AS check $1 --workspace "$(ws_of $1)" --candidate "kernels/$1/kernel.cu" -v --json "$R/check_$1.json" \
    > "$R/check_$1.log" 2>&1; echo "rc=$?" >> "$R/check_$1.log"
}
for ph in ${phases//,/ }; do
  if [ "$ph" = check ]; then
    t "check: ${ops//$'\n'/ } ($CHECK_JOBS at a time)"
    for op in $ops; do
      ws=$(ws_of $op); [ -f "$ws/manifest.json" ] || continue
      while [ "$(jobs -rp | wc -l)" -ge "$CHECK_JOBS" ]; do sleep 1; done
      check_one $op &
    done
    wait
    # Six checks at once can run the GPU out of memory on the largest cases (NOT CHECKED): run those ops again alone.
    for op in $ops; do
      grep -q "NOT CHECKED (harness out of memory)" "$R/check_$op.log" 2>/dev/null || continue
      t "check $op again, alone (out of GPU memory beside the others)"
      check_one $op
    done
    for op in $ops; do
      [ -f "$R/check_$op.log" ] || continue
      rc=$(tail -1 "$R/check_$op.log"); [ "$rc" = rc=0 ] || status=1
      summary "check $op $rc: $(grep -E '^(PASS|FAIL|error)' "$R/check_$op.log" | head -2 | tr '\n' ' ' | cut -c1-160)"
    done
    continue
  fi
  for op in $ops; do
    ws=$(ws_of $op); [ -f "$ws/manifest.json" ] || continue
    if [ "$(el)" -ge "$DEADLINE" ]; then summary "$ph $op: SKIPPED (deadline ${DEADLINE}s)"; continue; fi
    t "$ph $op"
    case $ph in paper) reps=30 ;; *) reps=${REPLAYS:-8} ;; esac
    lim=$(( DEADLINE + 60 - $(el) )); [ $lim -le 540 ] || lim=540   # a late bench still ends near the deadline
    dt=$(dtypes_of $op)
    timeout $lim $AS bench $op --workspace "$ws" --candidate "kernels/$op/kernel.cu" --shapes $ph --replays $reps \
      ${dt:+--dtype $dt} ${NEIGHBOURS:+--neighbours $NEIGHBOURS} --out "$R/${ph}_$op.json" > "$R/${ph}_$op.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    summary "$ph $op rc=$rc: $(grep -E '^geomean|^rows:|^served:|^over the floor|refused|error' "$R/${ph}_$op.log" | head -5 | tr '\n' ' ' | cut -c1-640)"
  done
done
tgz=$RES/results-${phases//,/-}.tgz
cp "$R/summary.txt" "$RES/summary.txt" 2>/dev/null
mkdir -p "$RES/json"
for f in "$R"/*.json; do
  [ -f "$f" ] || continue
  cp "$f" "$RES/json/" || continue
  if [ "$(stat -c%s "$f")" -gt 10000 ]; then xz -9f "$RES/json/${f##*/}"; fi
done
tar -C "$R" -czf "$tgz" . && t "results in $tgz"
exit $status
