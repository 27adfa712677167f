#!/bin/bash
# 2026-11-27d: the shipped moe_align has never been benched (issue 15): check + decode corpus bench (chained and in
# context) against the extracted 0.5.17 JIT port; then the host cost per patched eager call (norm/act and linear).
set -uo pipefail
REPO=$(pwd)
if [ ! -d /tmp/e2e-site/sglang ]; then
  bash e2e/device_install.sh stage .whl/wh26/carry17/part08 >/dev/null
  timeout 200 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }
fi
bash e2e/device_install.sh astra >/dev/null
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
A="python3 -m astra_sglang.cli"; WS=/tmp/ws-ma
(cd /tmp && timeout 120 $A extract moe_align --variant jit --arch sm_90 --out $WS --force > $OUT/extract.log 2>&1); echo "extract rc=$?"
(cd /tmp && timeout 120 $A check moe_align --workspace $WS/moe_align --candidate $REPO/kernels/moe_align/kernel.cu --dtype int32 > $OUT/check.log 2>&1); echo "check rc=$?"; tail -3 $OUT/check.log
(cd /tmp && timeout ${1:-240} $A bench moe_align --workspace $WS/moe_align --candidate $REPO/kernels/moe_align/kernel.cu --dtype int32 --shapes decode --out $OUT/decode.json > $OUT/bench.log 2>&1); echo "bench rc=$?"
(cd /tmp && timeout 60 python3 $REPO/kernels/dev/host_overhead.py > $OUT/host-overhead.txt 2>&1); echo "host rc=$?"; cat $OUT/host-overhead.txt | tail -8
(cd /tmp && timeout 60 python3 $REPO/kernels/dev/linear_tune/host_overhead.py > $OUT/host-overhead-linear.txt 2>&1); echo "host-linear rc=$?"; tail -6 $OUT/host-overhead-linear.txt
python3 - <<PY
import json; d=json.load(open('$OUT/decode.json'))
rows=d['rows']
for r in rows:
    if r['shape'].startswith(('1x','8x','64x')): print('%-26s prod %6.2f ours %6.2f chained %.2fx ctx %.2f -> %.2f %.2fx' % (r['shape'], r['prod_us'], r['cand_us'] or 0, r['chained_speedup'] or 0, r['context_base_us'] or 0, r['context_cand_us'] or 0, r['speedup'] or 0))
print('n', len(rows), 'geomean', d.get('geomean'), 'min', min((r['speedup'] or 9) for r in rows))
PY
