#!/usr/bin/env bash
# Lay out carried workspaces the way kernels/gpu_run.sh reads them ($WS/<variant>/<op>), then run it:
#
#   ROOTS="astra-work/e2ws/sglang_0_5_17 astra-work/e1ws" WS=/tmp/ws bash kernels/gpu_workspaces.sh [phases]
#
# Every workspace (a folder with manifest.json) directly under each root in ROOTS is copied to
# $WS/<its variant>/<its op>; the first root holding an op wins (list the SGLang version you serve
# first). Copies, so a run never touches the carried originals. The rest of the environment
# (OPS, DTYPES, DEADLINE, VARIANT_<op>, RES) goes to gpu_run.sh unchanged.
set -uo pipefail
ROOTS=${ROOTS:-"astra-work/e2ws/sglang_0_5_17 astra-work/e1ws astra-work/gpu_ws/jit astra-work/sgl"}
export WS=${WS:-/tmp/ws}
mkdir -p "$WS"
declare -A seen=()
for root in $ROOTS; do
  [ -d "$root" ] || { echo "no workspace root $root (skipped)"; continue; }
  for m in "$root"/*/manifest.json; do
    [ -f "$m" ] || continue
    read -r op variant < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["op"], d["variant"])' "$m")
    [ -z "${seen[$op]:-}" ] || continue
    seen[$op]=1
    rm -rf "$WS/$variant/$op"; mkdir -p "$WS/$variant"; cp -a "$(dirname "$m")" "$WS/$variant/$op"
    echo "workspace $op ($variant) <- $(dirname "$m")"
    # gpu_run.sh takes the registry's first variant unless told: name the one that was carried
    export "VARIANT_$op=$variant"
  done
done
[ ${#seen[@]} -gt 0 ] || { echo "error: no workspace under ${ROOTS}" >&2; exit 2; }
exec bash kernels/gpu_run.sh "$@"
