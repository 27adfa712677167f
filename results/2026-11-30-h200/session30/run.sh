#!/bin/bash
# 2026-11-30 (thirtieth session), 2x H200 (nvidia-h200-x2), from the repository root, after staging the FA3 wheelhouse
# (.whl/wh33fa3, two parts a call: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`). SGLang's default
# attention (fa3). Session 29's run.sh supplies the parts it already has (check + validate `c`, step `m`, served `e`,
# validate one op `v`); this one orders them around the new kernel:
#   bash run.sh R1  GPU 0: the sweep (moe_sweep.py here; ROUND=1 for the first round) | GPU 1: check moe_experts
#   bash run.sh R2  this copy's adapter at MAX_TOKENS=${MAXT:-2}, astra reinstalled; then GPU 0: the Qwen3-30B-A3B
#                   decode-step A/B at batch ${BS:-1,2} | GPU 1: validate, then bench the 1-2 token rows (chained and in
#                   context)
#   bash run.sh M   GPU 0: the Qwen3-30B-A3B decode-step A/B, every default op but moe_experts against every default
#                   op, adapter at MAXT tokens, batch ${BS:-1,2} | GPU 1: part E
#   bash run.sh E   served Qwen3-30B-A3B (20 layers), unpatched (A, A2) against every default op (B; moe_experts at
#                   MAXT tokens), batch 1 and concurrency 4, GPU 0 (E2E_EXTRA: more e2e arguments; at tensor
#                   parallel 2: `CUDA_VISIBLE_DEVICES=0,1 E2E_EXTRA="--tp 2" bash run.sh E`)
set -uo pipefail
PART=${1:?R1, R2, M or E}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
S29=results/2026-11-30-h200/session29/run.sh
O=${OUT:-/tmp/s30}/$PART; mkdir -p $O
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
maxt() { sed -i "s/^MAX_TOKENS = .*/MAX_TOKENS = ${MAXT:-2}/" kernels/moe_experts/adapter.py; grep -n "^MAX_TOKENS" kernels/moe_experts/adapter.py; }
case $PART in
R1)
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  echo "installed at $(el)s"
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 results/2026-11-30-h200/session30/moe_sweep.py $O/sweep > $O/sweep.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 SKIP_ENSURE=1 NOVAL=1 CT=240 OUT=$O bash $S29 c > $O/check.log 2>&1 &
  wait
  echo "sweep + check done at $(el)s"; tail -18 $O/sweep.log | cut -c1-420; grep -v "^\s*$" $O/check.log | tail -4 ;;
R2)
  maxt
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  export LIMIT=${LIMIT:-585}
  echo "installed at $(el)s"
  CUDA_VISIBLE_DEVICES=0 SKIP_ENSURE=1 BS=${BS:-1,2} OUT=$O bash $S29 m > $O/m.log 2>&1 &
  (
    CUDA_VISIBLE_DEVICES=1 SKIP_ENSURE=1 VT=150 OUT=$O bash $S29 v moe_experts bf16,fp16
    source kernels/astra_env.sh
    cd /tmp && CUDA_VISIBLE_DEVICES=1 timeout $(( LIMIT - 180 )) $AS bench moe_experts \
      --workspace /tmp/s29-ws/installed/moe_experts --candidate $OLDPWD/kernels/moe_experts/kernel.cu \
      --shapes 1x2048x768x128x8,2x2048x768x128x8 --dtype bf16 --replays 8 --out $O/bench.json > $O/bench.log 2>&1
    echo "bench rc=$?"; grep -E "^geomean|^rows:|in context|error" $O/bench.log | cut -c1-300 | tail -6
  ) > $O/vb.log 2>&1 &
  wait
  grep -v "^\s*$" $O/m.log | tail -14; cat $O/vb.log ;;
M)  # GPU 0: the decode-step A/B, every default op but moe_experts (A) against every default op (B) | GPU 1: part E
  maxt; bash e2e/device_install.sh astra > $O/astra.log 2>&1
  (CUDA_VISIBLE_DEVICES=0 STEP_ARGS="--procs 2 --procs-at-once 1 --batch-size ${BS:-1,2} --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" RES=$O/m DEADLINE_S=540 \
    bash e2e/step_session.sh 'moe-experts:qwen3-30b-a3b-20l:540:--base-ops=all,-moe_experts --ops=all' > $O/step.log 2>&1
   echo "step done at $(el)s"; tail -8 $O/step.log | cut -c1-220) > $O/m.log 2>&1 &
  (SKIP_INSTALL=1 CUDA_VISIBLE_DEVICES=1 PORT=30150 OUT=$O/.. bash $0 E) > $O/e.log 2>&1 &
  wait
  cat $O/m.log $O/e.log | grep -v "^\s*$" | tail -30 ;;
E)  # every default op against none: what a user's `--ops all` buys on the MoE shape now
  [ -n "${SKIP_INSTALL:-}" ] || { maxt; bash e2e/device_install.sh astra > $O/astra.log 2>&1; }
  (cd /tmp && CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout $(( ${LIMIT:-580} - 20 - $(el) )) python3 -m astra_sglang.cli e2e \
    --model-path $OLDPWD/e2e/configs/qwen3-30b-a3b-20l --out /tmp/cal-all --ops all --calibrate \
    --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds ${ROUNDS:-3} --max-total-tokens 16384 \
    --port ${PORT:-30100} ${E2E_EXTRA:-} > $O/cal-all.log 2>&1); echo "cal rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-all.tar.gz --exclude="*/counters-*" cal-all 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-all/report.md 2>/dev/null | head -8 | cut -c1-250
  tail -3 $O/cal-all.log | cut -c1-250 ;;
*) echo "error: run.sh takes R1, R2, M or E" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
