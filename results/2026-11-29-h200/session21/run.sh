#!/bin/bash
# 2026-11-29 (twenty-first session), one H200, from the repository root.
#   bash run.sh a   (no wheelhouse) dense_rope_store on the Qwen2.5-7B heads it patches since the twentieth session (28 q / 4 kv
#                   of 128): check, then its 4 decode rows in context between the GEMMs a patched server runs (--neighbours
#                   astra) and its 3 prefill rows chained, bf16; then kv_store's K/V load issued beside its slot's
#                   (ASTRA_KV_LOAD_FIRST=1: nvcc otherwise sinks it below the skip check) against the shipped kernel, on the
#                   six rows of the twentieth session's part d, both orders, --neighbours astra
#   bash run.sh b   (wheelhouse staged first: .whl/wh32, bash e2e/device_install.sh stage .whl/wh32/carry/partNN, one call a
#                   part) moe_grouped_router's rows without a shared column against the installed router (flashinfer's
#                   fused_topk_deepseek), fp32 logits, both orders, --neighbours astra: shipped (early release), late
#                   (ASTRA_PDL=2: release after the stores), plain (ASTRA_PDL=0)
#   bash run.sh c M (wheelhouse staged) decode step A/B at batch 1 and 16: M = qwen25, Qwen2.5-7B, arm A every default op but
#                   dense_rope_store, arm B every default op (the op's counters and the step change on a third dense family,
#                   Qwen2Attention.forward); qknorm, Qwen3-8B, arm A unpatched, arm B qknorm alone; rope, Llama-3-8B, arm A
#                   unpatched, arm B rope alone (part d's sites in SGLang's real step)
#   bash run.sh d   (no wheelhouse) qknorm and rope at their serving sites (sites.attention_input_sites, new today): qkv GEMM ->
#                   op -> SGLang's next PDL kernel (rope after the q/k norm, the KV store after rope; astra's rmsnorm stands in)
#                   -> a GEMM for the attention; decode corpus, bf16, --neighbours astra; then the same rows at bench's generic
#                   pair in the same run (--sites generic), where their standing numbers are
#   bash run.sh e   (no wheelhouse) part d's serving sites in fp16 (issue 14 asks for both dtypes)
# Workspaces extracted on the CPU from the sglang 0.5.17, flashinfer-python 0.6.15.post1 and apache-tvm-ffi 0.1.11 wheels,
# carried as astra-work/ws: bash kernels/dev/workspaces_from_wheels.sh WHEELDIR astra-work/ws dense_rope_store=jit kv_store=jit \
#   qknorm=jit rope=jit
set -uo pipefail
PART=${1:?a, b, c, d or e}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s21/$PART; mkdir -p $O
export WS=astra-work/ws
LIMIT=${LIMIT:-540}
case $PART in
a)
  source kernels/astra_env.sh
  timeout 150 $AS check dense_rope_store --workspace $WS/jit/dense_rope_store --candidate kernels/dense_rope_store/kernel.cu \
    --dtype bf16 --json $O/check_dense_rope_store.json > $O/check.log 2>&1
  echo "check rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)" $O/check.log | head -2
  timeout 150 $AS bench dense_rope_store --workspace $WS/jit/dense_rope_store --candidate kernels/dense_rope_store/kernel.cu \
    --shapes 1x28x4x128x4608x4608x4608,16x28x4x128x4608x4608x4608,64x28x4x128x4608x4608x4608,256x28x4x128x4608x4608x4608 \
    --dtype bf16 --replays 8 --neighbours astra --out $O/decode_qwen25.json > $O/decode.log 2>&1
  echo "decode rc=$? at $(el)s"; grep -E "^geomean|^rows:|in context|error" $O/decode.log | cut -c1-300 | tail -6
  timeout 120 $AS bench dense_rope_store --workspace $WS/jit/dense_rope_store --candidate kernels/dense_rope_store/kernel.cu \
    --shapes 1024x28x4x128x4608x4608x4608,4096x28x4x128x4608x4608x4608,16384x28x4x128x4608x4608x4608 \
    --dtype bf16 --no-context --out $O/prefill_qwen25.json > $O/prefill.log 2>&1
  echo "prefill rc=$? at $(el)s"; grep -E "^geomean|^rows:|error" $O/prefill.log | cut -c1-300 | tail -4
  rows=1x512x512x3072x3072,16x512x512x3072x3072,64x128x128x1280x1280,1x1024x1024x6144x6144,64x1024x1024x6144x6144,256x512x512x3072x3072
  RES=$O/kv_store NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 60 - $(el) )) bash kernels/dev/bench_variants.sh kv_store \
    $WS/jit/kv_store $rows bf16 default= first=-DASTRA_KV_LOAD_FIRST=1 > $O/kv_store.log 2>&1
  echo "kv_store variants done at $(el)s"; grep -A8 "geomean (min)" $O/kv_store.log ;;
b)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
  source kernels/astra_env.sh; echo "installed at $(el)s"
  $AS extract moe_grouped_router --variant installed --arch sm_90 --out $WS/installed --no-build > $O/extract.log 2>&1 \
    || { tail -3 $O/extract.log; exit 1; }
  RES=$O/grouped NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 60 - $(el) )) bash kernels/dev/bench_variants.sh \
    moe_grouped_router $WS/installed/moe_grouped_router 1x256x8x8x4x0,8x256x8x8x4x0,256x256x8x8x4x0,1x384x8x1x1x0,256x384x8x1x1x0 \
    fp32 default= late=-DASTRA_PDL=2 plain=-DASTRA_PDL=0 > $O/grouped.log 2>&1
  echo "grouped router variants done at $(el)s"; grep -A10 "geomean (min)" $O/grouped.log ;;
c)
  # c qwen25: Qwen2.5-7B, arm A every default op but dense_rope_store, arm B every default op
  # c qknorm: Qwen3-8B, arm A unpatched, arm B qknorm alone (then SGLang's rope follows it, as at its bench site)
  # c rope: Llama-3-8B, arm A unpatched, arm B rope alone (then SGLang's KV store follows it)
  case ${2:?qwen25, qknorm or rope} in
    qwen25) spec="qwen2.5-7b-rope-store:qwen2.5-7b:250:--base-ops=all,-dense_rope_store --ops=all --port=31400" ;;
    qknorm) spec="qwen3-8b-qknorm:qwen3-8b:250:--base-ops=none --ops=qknorm --port=31500" ;;
    rope) spec="llama3-8b-rope:llama3-8b:250:--base-ops=none --ops=rope --port=31600" ;;
    *) echo "error: part c takes qwen25, qknorm or rope" >&2; exit 2 ;;
  esac
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  STEP_ARGS="--procs 1 --batch-size 1,16 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O/$2 DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh "$spec" \
    > $O/$2.log 2>&1
  echo "step $2 done at $(el)s"; tail -6 $O/$2.log ;;
d)
  RES=$O/serving NEIGHBOURS=astra DTYPES=bf16 OPS="qknorm rope" DEADLINE=$(( LIMIT / 2 - 60 )) \
    bash kernels/gpu_run.sh decode > $O/serving.log 2>&1
  echo "serving sites done at $(el)s"; cut -c1-400 $O/serving/summary.txt
  source kernels/astra_env.sh
  for op in qknorm rope; do
    timeout $(( (LIMIT - 20 - $(el)) / 2 )) $AS bench $op --workspace $WS/jit/$op --candidate kernels/$op/kernel.cu \
      --shapes decode --dtype bf16 --replays 8 --neighbours astra --sites generic --no-plot --out $O/generic_$op.json \
      > $O/generic_$op.log 2>&1
    echo "generic $op rc=$? at $(el)s"; grep -E "^geomean|^rows:|in context|error" $O/generic_$op.log | cut -c1-300 | tail -4
  done ;;
e)
  RES=$O/fp16 NEIGHBOURS=astra DTYPES=fp16 OPS="qknorm rope" DEADLINE=${DEADLINE:-150} bash kernels/gpu_run.sh decode \
    > $O/fp16.log 2>&1
  echo "fp16 sites done at $(el)s"; cut -c1-400 $O/fp16/summary.txt ;;
*) echo "error: run.sh takes a, b, c, d or e" >&2; exit 2 ;;
esac
