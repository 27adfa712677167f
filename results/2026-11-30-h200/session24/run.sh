#!/bin/bash
# 2026-11-30 (twenty-fourth session), one H200, from the repository root, after staging the wheelhouse WITH sgl_kernel's
# FA3 library (.whl/wh33fa3, `python3 e2e/build_wheelhouse.py --keep-fa3`: 25 parts, carried 5 a call and staged with
# `for p in ...; do bash e2e/device_install.sh stage $p; done`). Every part runs SGLang's own default attention
# (`--attention-backend auto`: fa3 on Hopper), which no earlier record ran.
#   bash run.sh a   probe: flash_ops present; then the served A/B of Qwen3-8B (unpatched A, --ops all B, unpatched A2,
#                   rotated rounds, --calibrate), batch 1 and concurrency 4
#   bash run.sh b   the same for Gemma-3-12B
#   bash run.sh d   the same for Llama-3-8B (run before c)
#   bash run.sh c   linear's long rows (down_proj of Gemma-3-12B / Qwen2.5-7B / Gemma-3-27B, > the adapter's 14336):
#                   check + bench in context (--neighbours astra); then Gemma-3-12B's decode-step A/B on fa3, every
#                   default op in both arms, arm B with ASTRA_LINEAR_MAX_IN_FEATURES=21504 (linear takes down_proj)
set -uo pipefail
PART=${1:?a, b, c or d}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s24}/$PART; mkdir -p $O
LIMIT=${LIMIT:-570}
REPO=$(pwd)
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "installed at $(el)s"
served() {  # MODEL ROUNDS: every default op against none, SGLang's default attention
  local M=$1
  (cd /tmp && timeout $(( LIMIT - 20 - $(el) )) python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M \
    --out /tmp/cal-$M --ops all --calibrate --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds $2 \
    --max-total-tokens 16384 > $O/cal-$M.log 2>&1); echo "cal $M rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-$M.tar.gz --exclude="*/counters-*" cal-$M 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-$M/report.md 2>/dev/null | head -8 | cut -c1-250
  tail -3 $O/cal-$M.log | cut -c1-250
}
case $PART in
a)
  (cd /tmp && python3 -c "
import importlib.util, pathlib, torch, sglang
p = pathlib.Path(importlib.util.find_spec('sgl_kernel').origin).parent
print('torch', torch.__version__, 'sglang', sglang.__version__, torch.cuda.get_device_name())
print('flash_ops:', [f.name for f in p.glob('flash_ops*.so')], [f.stat().st_size >> 20 for f in p.glob('flash_ops*.so')], 'MiB')
from sgl_kernel.flash_attn import flash_attn_with_kvcache; print('fa3 import ok')") 2>&1 | tail -4 | tee $O/probe.log
  served qwen3-8b ${ROUNDS:-4} ;;
b)
  served gemma3-12b ${ROUNDS:-4} ;;
d)
  served llama3-8b ${ROUNDS:-4} ;;
c)
  source kernels/astra_env.sh
  WS=/tmp/s24-ws; LONG=1x15360x3840,2x15360x3840,1x18944x3584,2x18944x3584,3x18944x3584,4x18944x3584,1x21504x5376,2x21504x5376
  [ -d $WS/linear ] || $AS extract linear --variant installed --arch sm_90 --out $WS --no-build > $O/extract.log 2>&1 \
    || { tail -3 $O/extract.log; exit 1; }
  timeout 120 $AS check linear --workspace $WS/linear --candidate kernels/linear/kernel.cu --dtype bf16,fp16 \
    --shapes $LONG --json $O/check-long.json > $O/check-long.log 2>&1
  echo "check rc=$? at $(el)s: $(grep -E '^(PASS|FAIL|error)' $O/check-long.log | head -2 | cut -c1-200)"
  timeout 150 $AS bench linear --workspace $WS/linear --candidate kernels/linear/kernel.cu --shapes $LONG --dtype bf16 \
    --replays 8 --neighbours astra --out $O/bench-long.json > $O/bench-long.log 2>&1
  echo "bench rc=$? at $(el)s"; grep -E "x|geomean" $O/bench-long.log | tail -14 | cut -c1-200
  STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh \
    'gemma3-12b-linear:gemma3-12b:400:--base-ops=all --ops=all --arm-env=B:ASTRA_LINEAR_MAX_IN_FEATURES=21504' \
    > $O/step.log 2>&1
  tail -20 $O/step.log | cut -c1-220 ;;
*) echo "error: run.sh takes a, b, c or d" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
