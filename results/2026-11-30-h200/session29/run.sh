#!/bin/bash
# 2026-11-30 (twenty-ninth session), 2x H200 (nvidia-h200-x2), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3, two parts a call: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`). SGLang's
# default attention (fa3). Two parts run side by side, one GPU each: `bash run.sh pair X Y`.
#   bash run.sh a   moe_experts (new): check against SGLang's installed fused_experts, validate in SGLang's layer,
#                   bench of the decode corpus rows (chained and in context)
#   bash run.sh m   Qwen3-30B-A3B (20 layers) decode-step A/B: every default op in both arms, arm B adds moe_experts;
#                   two processes an arm, one at a time
#   bash run.sh s   moe_experts launch-shape sweep against SGLang's fused_experts_impl (moe_sweep.py)
#   bash run.sh S   the sweep, its fastest variant into this copy's kernel.cu, then m and e (batch 1 only) side by side
#   bash run.sh c   check and validate moe_experts (after a change of its defaults)
#   bash run.sh q   owed by session 28: the launcher_only GPU test, then the q_out ops' decode corpora rebenched with
#                   the 1-token copy taken out
#   bash run.sh e   Qwen3-30B-A3B (20 layers) served A/B: unpatched (A, A2) against moe_experts alone (B)
#   bash run.sh v OP DTYPES   validate one op alone, after a fix
#   bash run.sh pair X Y      X on GPU 0 and Y on GPU 1 at once (the install runs once, first)
set -uo pipefail
PART=${1:?a, m, c, s, S, q, e, v or pair}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
LIMIT=${LIMIT:-570}
REPO=$(pwd)
if [ "$PART" = pair ]; then
  mkdir -p ${OUT:-/tmp/s29}
  bash e2e/device_install.sh ensure > ${OUT:-/tmp/s29}/ensure.log 2>&1 || { tail -5 ${OUT:-/tmp/s29}/ensure.log; exit 1; }
  bash e2e/device_install.sh astra >> ${OUT:-/tmp/s29}/ensure.log 2>&1   # this checkout's astra, on a warm node too
  export LIMIT=$(( ${PAIR_LIMIT:-580} - $(el) ))   # the call's limit less the install
  echo "installed at $(el)s; each part's limit ${LIMIT}s"
  CUDA_VISIBLE_DEVICES=0 SKIP_ENSURE=1 PORT=30100 bash $0 ${2:?X} > /tmp/s29-pair-$2.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 SKIP_ENSURE=1 PORT=30150 bash $0 ${3:?Y} > /tmp/s29-pair-$3.log 2>&1 &
  wait
  for p in $2 $3; do echo "=== part $p (GPU $([ $p = $2 ] && echo 0 || echo 1))"; cat /tmp/s29-pair-$p.log; done
  exit 0
fi
O=${OUT:-/tmp/s29}/$PART; mkdir -p $O
[ -n "${SKIP_ENSURE:-}" ] || bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "installed at $(el)s on GPU ${CUDA_VISIBLE_DEVICES:-all}"
WS=/tmp/s29-ws
extract() {  # OP VARIANT: the production workspace at $WS/VARIANT/OP
  [ -d $WS/$2/$1 ] || $AS extract $1 --variant $2 --arch sm_90 --out $WS/$2 --no-build > $O/extract-$1-$2.log 2>&1 \
    || { echo "extract $1 $2 failed"; tail -3 $O/extract-$1-$2.log; return 1; }
}
check() {  # OP VARIANT: the shipped kernel against the extracted production path
  extract $1 $2 || return 1
  timeout ${CT:-240} $AS check $1 --workspace $WS/$2/$1 --candidate kernels/$1/kernel.cu --json $O/check-$1-$2.json \
    > $O/check-$1-$2.log 2>&1
  echo "check $1 $2 rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)|bit-identical" $O/check-$1-$2.log | cut -c1-200 | head -3
}
bench() {  # OP VARIANT NAME SHAPES: decode rows in context between production's neighbours (cuBLAS), and chained
  extract $1 $2 || return 1
  timeout ${BT:-200} $AS bench $1 --workspace $WS/$2/$1 --candidate kernels/$1/kernel.cu --shapes $4 --dtype bf16 --replays 8 \
    --out $O/bench-$3.json > $O/bench-$3.log 2>&1
  echo "bench $3 rc=$? at $(el)s"; grep -E "^geomean|^rows:|in context|error" $O/bench-$3.log | cut -c1-300 | tail -4
}
step() {  # SPEC BATCHES: one decode-step A/B through e2e/step_session.sh
  STEP_ARGS="--procs ${PROCS:-2} --batch-size $2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5 ${STEP_EXTRA:-}" RES=$O DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh "$1" \
    > $O/step.log 2>&1
  echo "step done at $(el)s"; tail -12 $O/step.log | cut -c1-220
}
served() {  # MODEL [NAME [E2E ARGS]]: every default op against none, SGLang's default attention, 3 rotated rounds of
  local M=$1 N=${2:-$1}; shift; shift || true   # A, B, A2
  (cd /tmp && timeout $(( LIMIT - 20 - $(el) )) python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/$M \
    --out /tmp/cal-$N --ops all --calibrate ${WORKLOADS:---workload bs1:8:128:128:1 --workload c4:16:128:128:4} --rounds ${ROUNDS:-3} \
    --max-total-tokens 16384 --port ${PORT:-30100} "$@" > $O/cal-$N.log 2>&1); echo "cal $N rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-$N.tar.gz --exclude="*/counters-*" cal-$N 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-$N/report.md 2>/dev/null | head -8 | cut -c1-250
  grep -E "A vs B" /tmp/cal-$N/report.md 2>/dev/null | head -2
  tail -3 $O/cal-$N.log | cut -c1-250
}
pack() { tar -C $O -czf /tmp/s29-$PART.tar.gz . && rm -rf $O/* && mv /tmp/s29-$PART.tar.gz $O/$PART.tar.gz; }  # <= 8 files back
case $PART in
a)
  source kernels/astra_env.sh
  CT=330 check moe_experts installed
  (cd /tmp && timeout 200 $AS validate --ops moe_experts --dtypes bf16,fp16 --json $O/validate-moe_experts.json) \
    > $O/validate-moe_experts.log 2>&1
  echo "validate rc=$? at $(el)s: $(tail -1 $O/validate-moe_experts.log | cut -c1-200)"
  r() { local s=""; for t in 1 2 4 8; do s="$s,${t}x$1"; done; echo ${s#,}; }
  BT=240 bench moe_experts installed qwen3-30b-a3b $(r 2048x768x128x8)
  BT=150 bench moe_experts installed more 1x2048x384x128x8,2x2048x384x128x8,1x4096x192x128x8,2x4096x192x128x8,1x2048x1024x64x8,2x2048x1024x64x8,1x4096x3584x8x2,2x4096x3584x8x2,1x2048x1408x60x4,2x2048x1408x60x4
  pack ;;
m)  # one process an arm at a time: four 30B-A3B processes at once leave the last no KV cache at 0.5
  STEP_EXTRA="--procs-at-once 1" step 'moe-experts:qwen3-30b-a3b-20l:540:--base-ops=all --ops=all,moe_experts' ${BS:-1,2} ;;
c)  # check and validate the shipped defaults
  source kernels/astra_env.sh
  CT=${CT:-200} check moe_experts installed
  [ -z "${NOVAL:-}" ] || exit 0
  (cd /tmp && timeout 150 $AS validate --ops moe_experts --dtypes bf16,fp16 --json $O/validate-moe_experts.json) \
    > $O/validate-moe_experts.log 2>&1
  echo "validate rc=$? at $(el)s: $(tail -1 $O/validate-moe_experts.log | cut -c1-200)" ;;
s)
  timeout $(( LIMIT - 10 )) python3 results/2026-11-30-h200/session29/moe_sweep.py $O > $O/sweep.log 2>&1
  echo "sweep rc=$? at $(el)s"; tail -12 $O/sweep.log | cut -c1-400 ;;
S)  # the sweep on GPU 0, its fastest variant written into this copy's kernel.cu defaults, then m and e side by side
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 results/2026-11-30-h200/session29/moe_sweep.py $O > $O/sweep.log 2>&1
  echo "sweep rc=$? at $(el)s"; tail -14 $O/sweep.log | cut -c1-400
  for f in $(cat $O/best.txt 2>/dev/null); do n=${f#-D}; sed -i "s|^#define ${n%%=*} .*|#define ${n%%=*} ${n#*=}  // the sweep's pick|" kernels/moe_experts/kernel.cu; done
  grep -n "sweep's pick" kernels/moe_experts/kernel.cu
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  export LIMIT=$(( LIMIT - $(el) ))
  CUDA_VISIBLE_DEVICES=0 SKIP_ENSURE=1 PORT=30100 bash $0 m > $O/m.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 SKIP_ENSURE=1 PORT=30150 ROUNDS=${ROUNDS:-3} WORKLOADS="--workload bs1:8:128:128:1" bash $0 e > $O/e.log 2>&1 &
  wait
  cat $O/m.log $O/e.log | grep -v "^\s*$" | tail -40 ;;
q)
  source kernels/astra_env.sh
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu \
    "tests/test_bench_rules.py::test_the_q_out_launchers_one_token_copy_is_captured_as_bench_times_it" > $O/pytest.log 2>&1
  echo "pytest rc=$? at $(el)s: $(tail -1 $O/pytest.log)"; grep -E "^(FAILED|ERROR)" $O/pytest.log | head -5
  r() { local s=""; for t in 1 2 16 64 256; do s="$s,${t}x$1"; done; echo ${s#,}; }
  bench dense_rope_store jit qwen25 $(r 28x4x128x4608x4608x4608x3584)
  bench dense_rope_store jit llama3 $(r 32x8x128x6144x6144x6144x4096)
  bench qknorm_rope_store jit_dense qwen3-8b $(r 32x8x128x6144x6144x6144x4096)
  bench qknorm_rope_store jit qwen3-30b-a3b $(r 32x4x128x5120x5120x5120x4096)
  bench qknorm_rope jit qwen3-8b-qkr $(r 32x8x128x6144x6144x6144x4096)
  pack ;;
e)
  ROUNDS=${ROUNDS:-3} served qwen3-30b-a3b-20l moe-experts-served --ops moe_experts ;;
v)
  source kernels/astra_env.sh
  (cd /tmp && timeout ${VT:-300} $AS validate --ops ${2:?OP} --dtypes ${3:?DTYPES} --json $O/validate-$2.json) \
    > $O/validate-$2.log 2>&1
  echo "validate $2 rc=$? at $(el)s: $(tail -1 $O/validate-$2.log | cut -c1-200)"; grep FAIL $O/validate-$2.log | cut -c1-250 ;;
*) echo "error: run.sh takes a, m, c, s, S, q, e, v or pair" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
