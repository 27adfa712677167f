#!/bin/bash
# 2026-11-27e, moe_align (issue 15) on one H200, from the repository root (astra-work/dev/s38.sh):
#   bash run.sh 380            the whole decode corpus (63 rows): its in-context phase failed on every row
#                              (torch cannot fill or GEMM int32; fixed in timer.Neighbours): bench-63-chained.log, decode-63-chained.json.xz
#   SHAPES=<35 rows of 1/8/64/128/256 tokens, listed in bench.log> bash run.sh 420    after the fix: bench.log, decode.json.xz
# --- astra-work/dev/prelude.sh ---
# sourced by every device script: install SGLang once per warm machine, then astra from this checkout
REPO=$(pwd)
PART=$(ls -d .whl/wh26/carry*/part* 2>/dev/null | tail -1)
if [ ! -d /tmp/e2e-site/sglang ]; then
  [ -n "$PART" ] && bash e2e/device_install.sh stage $PART >/dev/null
  timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
# --- astra-work/dev/s38.sh ---
# moe_align (issue 15): check + decode corpus bench (chained and in context) vs the extracted 0.5.17 JIT port.
set -uo pipefail
A="python3 -m astra_sglang.cli"; WS=/tmp/ws-ma
(cd /tmp && timeout 120 $A extract moe_align --variant jit --arch sm_90 --out $WS --force > $OUT/extract.log 2>&1); echo "extract rc=$?"
(cd /tmp && timeout 120 $A check moe_align --workspace $WS/moe_align --candidate $REPO/kernels/moe_align/kernel.cu --dtype int32 > $OUT/check.log 2>&1); echo "check rc=$?"; tail -3 $OUT/check.log
(cd /tmp && timeout ${1:-360} $A bench moe_align --workspace $WS/moe_align --candidate $REPO/kernels/moe_align/kernel.cu --dtype int32 --shapes ${SHAPES:-decode} --out $OUT/decode.json > $OUT/bench.log 2>&1); echo "bench rc=$?"; tail -30 $OUT/bench.log
