#!/bin/bash
# 2026-11-30 (twenty-seventh session), one H200, from the repository root, after staging the FA3 wheelhouse
# (.whl/wh33fa3, one part a call: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`). SGLang's default
# attention (fa3). The q_out ops write q into their own contiguous buffer, so fa3 need not copy a strided q.
#   bash run.sh a   GPU gates of dense_rope_store's q_out (merged last session without a GPU): extract (jit), check
#                   (bf16 + fp16), validate in SGLang's layer; the GPU tests of dense_rope_store and gemma_qknorm_rope
#                   (q_out bit-identical to in place)
#   bash run.sh g   decode-corpus benches under the q_out shapes (chained and in context): dense_rope_store on
#                   Qwen2.5-7B / Llama-3-8B heads, gemma_qknorm_rope on Gemma-3-12B heads
#   bash run.sh b   Qwen2.5-7B decode-step A/B: arm A every default op with q in place (ASTRA_DRS_Q_OUT=0, fa3 then
#                   copies the strided q), arm B every default op (q into its own buffer), two processes an arm
#   bash run.sh c   Llama-3-8B, the same A/B
#   bash run.sh q   GPU gates of qknorm_rope_store's q_out (both variants: jit for Qwen3-MoE's site, jit_dense for dense
#                   Qwen3's) and qknorm_rope's (jit): check, validate, their GPU tests (q_out bit-identical to in place)
#   bash run.sh s   Qwen3-8B decode-step A/B: arm A q in place (ASTRA_QKRS_Q_OUT=0 ASTRA_QKR_Q_OUT=0), arm B q_out
#   bash run.sh m   Qwen3-30B-A3B (20 layers), the same A/B (qknorm_rope_store's MoE site)
#   bash run.sh v OP DTYPES   validate one op alone, after a fix
set -uo pipefail
PART=${1:?a, g, b, c, q, s, m or v}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s27}/$PART; mkdir -p $O
LIMIT=${LIMIT:-570}
REPO=$(pwd)
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "installed at $(el)s"
WS=/tmp/s27-ws
extract() {  # OP VARIANT: the production workspace at $WS/VARIANT/OP
  [ -d $WS/$2/$1 ] || $AS extract $1 --variant $2 --arch sm_90 --out $WS/$2 --no-build > $O/extract-$1-$2.log 2>&1 \
    || { echo "extract $1 $2 failed"; tail -3 $O/extract-$1-$2.log; return 1; }
}
check() {  # OP VARIANT: the shipped kernel against the extracted production path
  extract $1 $2 || return 1
  timeout 240 $AS check $1 --workspace $WS/$2/$1 --candidate kernels/$1/kernel.cu --json $O/check-$1-$2.json \
    > $O/check-$1-$2.log 2>&1
  echo "check $1 $2 rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)|bit-identical" $O/check-$1-$2.log | cut -c1-200 | head -3
}
validate() {  # OP DTYPES: in SGLang's own layer
  (cd /tmp && timeout ${VT:-300} $AS validate --ops $1 --dtypes $2 --json $O/validate-$1.json) > $O/validate-$1.log 2>&1
  echo "validate $1 rc=$? at $(el)s: $(tail -1 $O/validate-$1.log | cut -c1-200)"; grep FAIL $O/validate-$1.log | head -3 | cut -c1-250
}
gate() {  # OP VARIANT DTYPES
  check $1 $2; validate $1 $3
}
bench() {  # OP VARIANT NAME SHAPES: decode rows in context (astra's neighbours) and chained
  extract $1 $2 || return 1
  timeout 200 $AS bench $1 --workspace $WS/$2/$1 --candidate kernels/$1/kernel.cu --shapes $4 --dtype bf16 --replays 8 \
    --neighbours astra --out $O/bench-$3.json > $O/bench-$3.log 2>&1
  echo "bench $3 rc=$? at $(el)s"; grep -E "^geomean|^rows:|in context|error" $O/bench-$3.log | cut -c1-300 | tail -6
}
step() {  # SPEC BATCHES: one decode-step A/B through e2e/step_session.sh
  STEP_ARGS="--procs ${PROCS:-2} --batch-size $2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh "$1" \
    > $O/step.log 2>&1
  echo "step done at $(el)s"; tail -12 $O/step.log | cut -c1-220
}
pack() { tar -C $O -czf /tmp/s27-$PART.tar.gz . && rm -rf $O/* && mv /tmp/s27-$PART.tar.gz $O/$PART.tar.gz; }  # <= 8 files back
case $PART in
a)
  source kernels/astra_env.sh
  gate dense_rope_store jit bf16,fp16
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_op_dense_rope_store.py \
    tests/test_op_gemma_qknorm_rope.py > $O/pytest.log 2>&1
  echo "pytest rc=$? at $(el)s: $(tail -1 $O/pytest.log)"; grep -E "^(FAILED|ERROR)" $O/pytest.log | head -5
  pack ;;
g)
  source kernels/astra_env.sh
  r() { local s=""; for t in 1 2 16 64 256; do s="$s,${t}x$1"; done; echo ${s#,}; }
  bench dense_rope_store jit qwen25 $(r 28x4x128x4608x4608x4608x3584)
  bench dense_rope_store jit llama3 $(r 32x8x128x6144x6144x6144x4096)
  bench gemma_qknorm_rope installed gemma3-12b $(r 16x8x256x8192x8192x4096)
  pack ;;
b)
  step 'qwen25-qout:qwen2.5-7b:540:--base-ops=all --ops=all --arm-env=A:ASTRA_DRS_Q_OUT=0' 1,2,16 ;;
c)
  step 'llama3-qout:llama3-8b:540:--base-ops=all --ops=all --arm-env=A:ASTRA_DRS_Q_OUT=0' 1,2,16 ;;
q)
  source kernels/astra_env.sh
  check qknorm_rope_store jit; check qknorm_rope_store jit_dense; check qknorm_rope jit
  validate qknorm_rope_store bf16,fp16; validate qknorm_rope bf16,fp16
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_op_qknorm_rope_store.py \
    tests/test_op_qknorm_rope.py > $O/pytest.log 2>&1
  echo "pytest rc=$? at $(el)s: $(tail -1 $O/pytest.log)"; grep -E "^(FAILED|ERROR)" $O/pytest.log | head -5
  pack ;;
s)
  step 'qwen3-8b-qout:qwen3-8b:540:--base-ops=all --ops=all --arm-env=A:ASTRA_QKRS_Q_OUT=0 --arm-env=A:ASTRA_QKR_Q_OUT=0' ${BS:-1,2,16} ;;
m)
  step 'qwen3-moe-qout:qwen3-30b-a3b-20l:540:--base-ops=all --ops=all --arm-env=A:ASTRA_QKRS_Q_OUT=0 --arm-env=A:ASTRA_QKR_Q_OUT=0' ${BS:-1,2,16} ;;
v)
  source kernels/astra_env.sh
  (cd /tmp && timeout ${VT:-150} $AS validate --ops ${2:?OP} --dtypes ${3:?DTYPES} --json $O/validate-$2.json) \
    > $O/validate-$2.log 2>&1
  echo "validate $2 rc=$? at $(el)s: $(tail -1 $O/validate-$2.log | cut -c1-200)"; grep FAIL $O/validate-$2.log | cut -c1-250 ;;
*) echo "error: run.sh takes a, g, b, c, q, s, m or v" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
