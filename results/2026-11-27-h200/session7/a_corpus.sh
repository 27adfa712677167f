#!/bin/bash
# 2026-11-27 (H200, seventh session), call A: install the wheelhouse, then check + decode corpus (bf16, in context)
# of dense_rope_store (Gemma-2 rows new) and the whole decode bench of moe_grouped_router alone.
# Run from the repository root on the GPU machine after staging the wheelhouse (e2e/README.md).
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
if [ ! -d /tmp/e2e-site/sglang ]; then
  timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
echo "install done at $(el)s"
export PYTHONPATH=/tmp/e2e-site EXTRACT=1 DTYPES=bf16
part() {  # part NAME OPS PHASES DEADLINE
  mkdir -p $OUT/$1
  OPS="$2" DEADLINE=$4 RES=$OUT/$1 bash kernels/gpu_run.sh $3 > $OUT/$1/run.log 2>&1
  echo "$1 rc=$? at $(el)s"; cat $OUT/$1/summary.txt
}
part drs-corpus dense_rope_store check,decode 170
part grouped-router moe_grouped_router check,decode $(( ${BUDGET:-570} - $(el) - 75 ))
