#!/bin/bash
# 2026-11-29 (eighteenth session).
#   bash run.sh a   (1x H200, no wheelhouse) the activations' narrow blocks for small problems (ASTRA_MIN_THREADS 32, the new
#                   default: a problem of fewer 256-thread blocks than SMs runs in 32-128-thread blocks) against the old
#                   launch (-DASTRA_MIN_THREADS=256: 256-thread blocks always), compile-time variants
#                   (kernels/dev/bench_variants.sh), both orders, bf16, in context at each row's serving site
#                   (bench --sites serving, the default) between the GEMMs a patched server runs (--neighbours astra):
#                   the rows whose launch changes (1-token rows, narrow 16-256-token rows) and one that does not (16 x 14336)
#   bash run.sh b   (1x H200, no wheelhouse) the three activations as shipped: check, then their decode corpora at their
#                   serving sites, bf16, --neighbours astra (kernels/gpu_run.sh check,decode)
#   bash run.sh c gemma|qwen|llama|moe|all|all2   (1x H200, wheelhouse staged first: .whl/wh32, one device call per part,
#                   bash e2e/device_install.sh stage .whl/wh32/carry/partNN) decode step A/B at batch 16 and 64, arm A every
#                   default op but the model's residual norms, arm B every default op: Gemma-2-9B without
#                   gemma_post_attention_norms, gemma_rmsnorm and gemma_fused_add_rmsnorm; Qwen3-8B and Llama-3-8B without
#                   fused_add_rmsnorm; (moe) the 20-layer Qwen3-30B-A3B shape without moe_gate, moe_router, moe_align, moe_combine;
#                   (all) Gemma-2-9B and Llama-3-8B, (all2) Qwen3-8B and the MoE shape: arm A unpatched SGLang, arm B every
#                   default op (all2 ran with e2e/neighbours' fix, 3c3068b: its reports' with-consumers prediction is the new one)
#   bash run.sh d   (1x H200, no wheelhouse) bench --sites serving for moe_combine (c97ee0d+): each Qwen3-MoE decode row behind the
#                   experts' down GEMM and before astra's norm and the next layer's qkv GEMM (sites.moe_output_sites), and
#                   at bench's generic pair, same run; bf16, --neighbours astra, against the JIT topk_sum (jit_topk_sum)
# Workspaces extracted on the CPU from the sglang 0.5.17, flashinfer-python 0.6.15.post1 and apache-tvm-ffi 0.1.11 wheels,
# carried as astra-work/ws:
#   bash kernels/dev/workspaces_from_wheels.sh WHEELDIR astra-work/ws silu_and_mul=jit gelu_tanh_and_mul=jit gelu_and_mul=jit
set -uo pipefail
PART=${1:?a, b, c or d}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s18/$PART; mkdir -p $O
export WS=astra-work/ws
LIMIT=${LIMIT:-540}
case $PART in
a)
  variants() {  # OP SHAPES SECONDS: narrow blocks (default) against 256-thread blocks, both orders
    RES=$O/$1 BENCH_ARGS="--neighbours astra" BOTH_ORDERS=1 DEADLINE=$3 \
      bash kernels/dev/bench_variants.sh $1 $WS/jit/$1 $2 bf16 default= b256=-DASTRA_MIN_THREADS=256 > $O/$1.log 2>&1
    echo "$1 done at $(el)s"; }
  variants silu_and_mul 1x14336,1x6912,1x3584,1x256,16x3584,16x7168,16x256,64x256,256x256,16x14336 190
  variants gelu_tanh_and_mul 1x14336,1x21504,1x5376,16x5376,16x14336 90
  variants gelu_and_mul 1x16384,1x24576,1x12288,16x12288 75
  for op in silu_and_mul gelu_tanh_and_mul gelu_and_mul; do tail -16 $O/$op.log | grep -v "^  wrote"; done ;;
b)
  RES=$O/corpus NEIGHBOURS=astra DTYPES=bf16 DEADLINE=$(( LIMIT - 40 )) OPS="silu_and_mul gelu_tanh_and_mul gelu_and_mul" \
    bash kernels/gpu_run.sh check,decode > $O/corpus.log 2>&1
  echo "corpus at $(el)s"; cut -c1-300 $O/corpus/summary.txt ;;
c)
  case ${2:?gemma, qwen, llama, moe, all or all2} in
    gemma) spec=("gemma2-9b-norms:gemma2-9b:$(( LIMIT - 60 )):--base-ops=all,-gemma_post_attention_norms,-gemma_rmsnorm,-gemma_fused_add_rmsnorm --ops=all --port=30500") ;;
    qwen) spec=("qwen3-8b-norm:qwen3-8b:$(( LIMIT - 60 )):--base-ops=all,-fused_add_rmsnorm --ops=all --port=30600") ;;
    llama) spec=("llama3-8b-norm:llama3-8b:$(( LIMIT - 60 )):--base-ops=all,-fused_add_rmsnorm --ops=all --port=30700") ;;
    moe) spec=("qwen3-30b-a3b-20l-moe:qwen3-30b-a3b-20l:$(( LIMIT - 60 )):--base-ops=all,-moe_gate,-moe_router,-moe_align,-moe_combine --ops=all --port=30800") ;;
    all) spec=("gemma2-9b-all:gemma2-9b:240:--base-ops=none --ops=all --port=30900"
               "llama3-8b-all:llama3-8b:200:--base-ops=none --ops=all --port=31000") ;;
    all2) spec=("qwen3-8b-all:qwen3-8b:200:--base-ops=none --ops=all --port=31100"
                "qwen3-30b-a3b-20l-all:qwen3-30b-a3b-20l:220:--base-ops=none --ops=all --port=31200") ;;
    *) echo "error: part c takes gemma, qwen, llama, moe, all or all2" >&2; exit 2 ;;
  esac
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  STEP_ARGS="--procs 1 --batch-size 16,64 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O/$2 DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh "${spec[@]}" \
    > $O/$2.log 2>&1
  echo "step done at $(el)s"; tail -8 $O/$2.log ;;
d)
  source kernels/astra_env.sh
  rows=1x8x2048,8x8x2048,32x8x2048,64x8x2048,256x8x2048,1x8x4096,8x8x4096,32x8x4096,64x8x4096,256x8x4096
  for rule in serving generic; do
    timeout $(( LIMIT / 2 - 10 )) $AS bench moe_combine --workspace $WS/jit_topk_sum/moe_combine \
      --candidate kernels/moe_combine/kernel.cu --shapes $rows --dtype bf16 --replays 8 --neighbours astra \
      --sites $rule --no-plot --out $O/decode_moe_combine_$rule.json > $O/$rule.log 2>&1
    echo "sites $rule done at $(el)s"; grep -E "^geomean|^rows:|^sites:|in context" $O/$rule.log | cut -c1-300 | tail -6
  done ;;
esac
