#!/usr/bin/env bash
# Extract ops' production workspaces here, on the CPU, from the offline wheelhouse's wheels, to carry to a GPU machine
# that has no SGLang installed: kernel work (check, bench, bench_variants.sh, gpu_run.sh) then needs no wheelhouse
# staging there (2026-11-27, ninth session: four GPU calls in one hold, 5 MiB carried, instead of 26 staging calls).
#
#   bash kernels/dev/workspaces_from_wheels.sh WHEELDIR OUT OP[=VARIANT] ...
#   bash kernels/dev/workspaces_from_wheels.sh .whl/wh26/wheels astra-work/ws fused_add_rmsnorm rope=jit
#
# WHEELDIR holds the sglang, flashinfer_python and apache_tvm_ffi wheels (e2e/build_wheelhouse.py's wheels/). Each op
# lands in OUT/<variant>/<op> (default variant: the registry's first, what SGLang runs on Hopper), the layout
# kernels/gpu_run.sh reads with WS=OUT. --no-build: the GPU machine's check or bench builds it. Then, on the GPU machine
# (carry OUT): WS=OUT OPS="..." bash kernels/gpu_run.sh check,decode
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: bash kernels/dev/workspaces_from_wheels.sh WHEELDIR OUT OP[=VARIANT] ..." >&2; exit 2; }
wheels=$1 out=$2; shift 2
src=$(mktemp -d /tmp/astra-wheel-src.XXXX)
trap 'rm -rf "$src"' EXIT
for name in sglang flashinfer_python apache_tvm_ffi; do
  whl=$(ls "$wheels"/${name}-[0-9]*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { echo "error: no ${name} wheel in $wheels" >&2; exit 2; }
  mkdir -p "$src/$name" && unzip -qo "$whl" -d "$src/$name"
done
AS="python3 -m astra_sglang.cli"
ops_json=""
for spec in "$@"; do
  op=${spec%%=*} variant=${spec#*=}
  if [ "$variant" = "$spec" ]; then  # the registry's first extract variant (the registry read once)
    [ -n "$ops_json" ] || ops_json=$($AS ops --json)
    variant=$(python3 -c 'import json, sys
ops = {r["op"]: r for r in json.loads(sys.argv[2])}
op = sys.argv[1]
if op not in ops or not ops[op]["extract"]:
    sys.exit(f"error: {op}: no such op with an extract variant (astra-sglang ops lists them)")
print(ops[op]["extract"][0])' "$op" "$ops_json")
  fi
  if [ -f "$out/$variant/$op/manifest.json" ]; then echo "kept $out/$variant/$op (already there)"; continue; fi
  $AS extract "$op" --variant "$variant" --arch sm_90 --no-build --out "$out/$variant" \
    --sglang-src "$src/sglang" --flashinfer-src "$src/flashinfer_python" --tvm-ffi-src "$src/apache_tvm_ffi" \
    | tail -1
done
du -sh "$out"
