#!/bin/bash
# 2026-11-29 (twenty-third session), one H200, from the repository root, the SGLang 0.5.17 wheelhouse staged first
# (.whl/wh32: bash e2e/device_install.sh stage .whl/wh32/carry/partNN, one device call a part).
#   bash run.sh a   gemma_qknorm_rope with torch's reduction order (bit-identical to production's torch sequence):
#                   extract (installed variant), check bf16 + fp16, validate in SGLang 0.5.17's
#                   Gemma3Attention.forward_native, the decode corpus in context (bf16, --neighbours astra, 4 replays)
#                   and the prefill corpus chained (bf16 + fp16)
#   bash run.sh b   the served A/B of Gemma-3-12B (dummy weights): unpatched A, --ops all B, unpatched A2 in rotated
#                   rounds (--calibrate), batch 1 and concurrency 4, 5 rounds; only after part a's check passed
set -uo pipefail
PART=${1:?a or b}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s23}/$PART; mkdir -p $O
LIMIT=${LIMIT:-570}
REPO=$(pwd)
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
echo "installed at $(el)s"
case $PART in
a)
  OP=gemma_qknorm_rope WS=/tmp/s23-ws
  source kernels/astra_env.sh
  $AS extract $OP --variant installed --arch sm_90 --out $WS --no-build > $O/extract.log 2>&1 \
    || { tail -3 $O/extract.log; exit 1; }
  timeout 200 $AS check $OP --workspace $WS/$OP --candidate kernels/$OP/kernel.cu --dtype bf16,fp16 \
    --json $O/check.json > $O/check.log 2>&1
  echo "check rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)|bit-identical" $O/check.log | cut -c1-200 | head -3
  grep -q '^PASS' $O/check.log && touch /tmp/s23-check-passed
  (cd /tmp && timeout 100 $AS validate --ops $OP --dtypes bf16,fp16 --json $O/validate.json) > $O/validate.log 2>&1
  echo "validate rc=$? at $(el)s: $(tail -1 $O/validate.log)"
  timeout $(( LIMIT - 120 - $(el) )) $AS bench $OP --workspace $WS/$OP --candidate kernels/$OP/kernel.cu \
    --shapes decode --dtype bf16 --replays 4 --neighbours astra --out $O/decode.json > $O/decode.log 2>&1
  echo "decode rc=$? at $(el)s"; grep -E "^geomean|^rows:|error" $O/decode.log | cut -c1-300 | tail -4
  timeout $(( LIMIT - 10 - $(el) )) $AS bench $OP --workspace $WS/$OP --candidate kernels/$OP/kernel.cu \
    --shapes prefill --dtype bf16,fp16 --no-context --replays 8 --out $O/prefill.json > $O/prefill.log 2>&1
  echo "prefill rc=$? at $(el)s"; grep -E "^geomean|^rows:|error" $O/prefill.log | cut -c1-300 | tail -3 ;;
b)
  [ -f /tmp/s23-check-passed ] || { echo "error: part a's check did not pass on this machine"; exit 1; }
  M=gemma3-12b
  (cd /tmp && timeout $(( LIMIT - 20 - $(el) )) python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M \
    --out /tmp/cal-$M --ops all --calibrate --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds 5 \
    --max-total-tokens 16384 > $O/cal-$M.log 2>&1); echo "cal $M rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-$M.tar.gz --exclude="*/counters-*" cal-$M 2>/dev/null
  grep -E "^\| (output throughput|TPOT mean)" /tmp/cal-$M/report.md 2>/dev/null | head -8 | cut -c1-250
  tail -3 $O/cal-$M.log | cut -c1-250 ;;
*) echo "error: run.sh takes a or b" >&2; exit 2 ;;
esac
