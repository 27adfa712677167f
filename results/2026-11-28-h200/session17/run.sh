#!/bin/bash
# 2026-11-28 (seventeenth session).
#   bash run.sh a   (2x H200, no wheelhouse) the plain launch (-DASTRA_PDL=0; qknorm -DASTRA_QKN_PDL=0) against the
#                   shipped PDL launch, compile-time variants (kernels/dev/bench_variants.sh), both orders, on a subset of
#                   each op's decode corpus (1, 16, 64, 256 tokens), bf16, in context between the GEMMs a patched server
#                   runs (--neighbours astra); one GPU per list of ops. LIMIT=seconds caps the whole part.
#   bash run.sh b   (4x H200, wheelhouse staged first: .whl/wh31, one device call per part,
#                   bash e2e/device_install.sh stage .whl/wh31/carry/partNN) the plain-launch rule (ASTRA_PLAIN_BYTES) as
#                   shipped (git apply plain-rule.diff first: the rule in nine kernels, never committed to kernels/;
#                   astra-work/old holds the kernels before it): GPUs 0 and 1 the decode corpora of the ops it changed, bf16, in context between the GEMMs a
#                   patched server runs (NEIGHBOURS=astra); GPU 2 decode step A/B on Llama-3-8B at batch 16 and 64, arm A
#                   the kernels before the rule (astra-work/old: git show 389c062:kernels/OP/kernel.cu, installed from a
#                   copy of the repository), arm B the rule (--candidate OP=kernels/OP/kernel.cu); GPU 3 moe_combine's plain
#                   launch (astra-work/cand/moe_combine_plain.cu: its kernel.cu after #define ASTRA_PDL 0) against the
#                   shipped one on qwen3-30b-a3b-20l at batch 1 and 8 (--base-ops all --ops all --candidate moe_combine=F)
#   bash run.sh d   (1x H200, no wheelhouse) part b's Llama-3-8B graph put the norm behind two producers: o_proj (nvjet,
#                   K 4096) before gate_up (N 28672), and down_proj (split-K nvjet + cublasLt splitKreduce, K 14336) before
#                   qkv (N 6144). The same two sites in bench (--producer-k / --consumer-width), fused_add_rmsnorm 16, 64, 256
#                   x 4096, shipped (PDL) against the plain launch, both orders: does bench then see what the graph saw?
#   bash run.sh e   (1x H200, no wheelhouse) bench --sites serving, its first GPU run: fused_add_rmsnorm's decode corpus,
#                   bf16, --neighbours astra, timed between the GEMM pairs a dense model runs it between, and again
#                   between bench's generic pair (--sites generic), in one run; then check of merge_state and moe_combine
#                   against their sgl_kernel variants (astra-work/ws/sgl_kernel, extracted from a partial SGLang checkout:
#                   astra-sglang extract OP --variant sgl_kernel --sglang-src astra-work/sglang-src --arch sm_90
#                   --out astra-work/ws/sgl_kernel --no-build)
#   bash run.sh f   (1x H200, no wheelhouse) the activations' decode corpora at their serving site (gate_up -> down_proj of
#                   the dense model of that width; bench --sites serving, the default since d52dd4e), bf16, --neighbours
#                   astra; silu_and_mul and gelu_tanh_and_mul again at bench's generic pair (--sites generic), same run
#   bash run.sh g   (1x H200, no wheelhouse) gemma_post_attention_norms's decode corpus at its serving sites (o_proj -> gate_up,
#                   down_proj -> qkv of the Gemma model of that width), bf16, --neighbours astra, and at the generic pair
# Workspaces extracted on the CPU, carried as astra-work/ws:
#   astra-sglang extract OP --variant V --sglang 0.5.17 --arch sm_90 --out astra-work/ws/V --no-build
set -uo pipefail
PART=${1:?a, b, d, e, f or g}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s17/$PART; mkdir -p $O
export WS=astra-work/ws
LIMIT=${LIMIT:-540}
case $PART in
a)
  variants() {  # OP VARIANT SHAPES PLAIN_FLAG: shipped (PDL) against plain launch, both orders
    RES=$O/$1 BENCH_ARGS="--neighbours astra" BOTH_ORDERS=1 DEADLINE=$(( LIMIT - 60 - $(el) )) \
      bash kernels/dev/bench_variants.sh $1 $WS/$2/$1 $3 bf16 default= pdl0="$4" > $O/$1.log 2>&1
    echo "$1 done at $(el)s"; }
  ( export CUDA_VISIBLE_DEVICES=1
    variants gemma_fused_add_rmsnorm flashinfer 1x3584,16x3584,64x3584,256x3584,64x5376,256x5376 -DASTRA_PDL=0
    variants qknorm jit 1x32x8x128x6144x6144,16x32x8x128x6144x6144,64x32x8x128x6144x6144,16x16x2x128x2560x2560,64x16x2x128x2560x2560,256x16x2x128x2560x2560 -DASTRA_QKN_PDL=0
    variants gelu_tanh_and_mul jit 1x14336,16x14336,64x14336,256x14336,64x10752,256x21504 -DASTRA_PDL=0 ) &
  variants fused_add_rmsnorm flashinfer 1x4096,16x4096,64x4096,256x4096,16x7168,64x7168 -DASTRA_PDL=0
  variants rmsnorm flashinfer 1x4096,16x4096,64x4096,256x4096,64x2880,256x2880 -DASTRA_PDL=0
  variants gemma_rmsnorm flashinfer 1x3584,16x3584,64x3584,256x3584,64x5376,256x5376 -DASTRA_PDL=0
  variants silu_and_mul jit 1x14336,16x14336,64x14336,256x14336,16x256,64x6912 -DASTRA_PDL=0
  wait
  for d in $O/*/; do tail -12 ${d%/}.log | grep -v "^  wrote"; done ;;
e)
  source kernels/astra_env.sh
  mkdir -p $O/sites
  for rule in serving generic; do
    timeout 200 $AS bench fused_add_rmsnorm --workspace $WS/flashinfer/fused_add_rmsnorm \
      --candidate kernels/fused_add_rmsnorm/kernel.cu --shapes decode --dtype bf16 --replays 8 --neighbours astra \
      --sites $rule --no-plot --out $O/sites/decode_fused_add_rmsnorm_$rule.json > $O/sites/$rule.log 2>&1
    echo "sites $rule done at $(el)s"; tail -14 $O/sites/$rule.log | grep -v "^  wrote" | cut -c1-300
  done
  RES=$O/check VARIANT_merge_state=sgl_kernel VARIANT_moe_combine=sgl_kernel OPS="merge_state moe_combine" \
    bash kernels/gpu_run.sh check > $O/check.log 2>&1
  echo "check at $(el)s"; cat $O/check/summary.txt ;;
f)
  RES=$O/decode NEIGHBOURS=astra DTYPES=bf16 DEADLINE=200 OPS="silu_and_mul gelu_tanh_and_mul gelu_and_mul" \
    bash kernels/gpu_run.sh decode > $O/decode.log 2>&1
  echo "serving sites at $(el)s"; cut -c1-300 $O/decode/summary.txt
  source kernels/astra_env.sh; mkdir -p $O/generic
  for op in silu_and_mul gelu_tanh_and_mul; do
    [ $(el) -lt $(( LIMIT - 150 )) ] || { echo "$op generic: skipped (time)"; continue; }
    timeout $(( LIMIT - $(el) )) $AS bench $op --workspace $WS/jit/$op --candidate kernels/$op/kernel.cu --shapes decode \
      --dtype bf16 --replays 8 --neighbours astra --sites generic --no-plot --out $O/generic/decode_$op.json \
      > $O/generic/$op.log 2>&1
    echo "$op generic at $(el)s"; grep -E "^geomean|^rows:" $O/generic/$op.log | cut -c1-300
  done ;;
g)
  source kernels/astra_env.sh; mkdir -p $O/sites
  for rule in serving generic; do
    timeout 150 $AS bench gemma_post_attention_norms --workspace $WS/flashinfer/gemma_post_attention_norms \
      --candidate kernels/gemma_post_attention_norms/kernel.cu --shapes decode --dtype bf16 --replays 8 \
      --neighbours astra --sites $rule --no-plot --out $O/sites/decode_gemma_post_attention_norms_$rule.json \
      > $O/sites/$rule.log 2>&1
    echo "sites $rule done at $(el)s"; grep -E "^geomean|^rows:|^sites:" $O/sites/$rule.log | cut -c1-300
  done ;;
d)
  for site in attn:4096:28672 mlp:14336:6144; do
    IFS=: read -r name k n <<<"$site"
    RES=$O/farn-$name BENCH_ARGS="--neighbours astra --producer-k $k --consumer-width $n" BOTH_ORDERS=1 \
      DEADLINE=$(( ${LIMIT:-540} / 2 - 30 )) bash kernels/dev/bench_variants.sh fused_add_rmsnorm \
      $WS/flashinfer/fused_add_rmsnorm 16x4096,64x4096,256x4096 bf16 default= pdl0="-DASTRA_PDL=0" > $O/farn-$name.log 2>&1
    echo "site $name done at $(el)s"; tail -12 $O/farn-$name.log | grep -v "^  wrote"
  done ;;
b)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  # arm A's astra: the kernels before the rule, installed from a copy of the repository
  mkdir -p /tmp/astra-old && tar --exclude=./results --exclude=./astra-work --exclude=./.whl -cf - . | tar -xf - -C /tmp/astra-old
  for f in astra-work/old/*.cu; do op=$(basename $f .cu); cp $f /tmp/astra-old/kernels/$op/kernel.cu; done
  bash /tmp/astra-old/e2e/device_install.sh astra /tmp/e2e-site > $O/astra-old.log 2>&1 || { tail -3 $O/astra-old.log; exit 1; }
  echo "installed at $(el)s"
  R=$(pwd)
  cand() { for op in "$@"; do echo -n " --candidate $op=$R/kernels/$op/kernel.cu"; done; }
  step() {  # GPU RES_DIR BATCHES NAME:CONFIG:SECS:ARGS
    CUDA_VISIBLE_DEVICES=$1 STEP_ARGS="--procs 1 --batch-size $3 --input-len 256 --output-len 32 --rounds 4 \
--warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" RES=$2 DEADLINE_S=$(( LIMIT + 30 - $(el) )) \
      bash e2e/step_session.sh "$4" > $2.log 2>&1; echo "$(basename $2) done at $(el)s"; }
  corpora() {  # GPU NAME OPS
    CUDA_VISIBLE_DEVICES=$1 RES=$O/$2 NEIGHBOURS=astra DTYPES=bf16 DEADLINE=$(( LIMIT - 40 - $(el) )) OPS="$3" \
      bash kernels/gpu_run.sh decode > $O/$2.log 2>&1; echo "$2 done at $(el)s"; }
  corpora 0 decode-norms "fused_add_rmsnorm rmsnorm gemma_fused_add_rmsnorm gemma_rmsnorm gemma_post_attention_norms" &
  corpora 1 decode-act "qknorm silu_and_mul gelu_tanh_and_mul gelu_and_mul" &
  step 2 $O/step-llama 16,64 "llama3-8b-plain:llama3-8b:560:--base-ops all --ops all$(cand fused_add_rmsnorm rmsnorm) --port=30100" &
  step 3 $O/step-moe 1,8 "qwen3-30b-a3b-20l-combine-plain:qwen3-30b-a3b-20l:560:--base-ops all --ops all \
--candidate moe_combine=$R/astra-work/cand/moe_combine_plain.cu --port=30200" &
  wait
  for f in $O/decode-*/summary.txt; do cut -c1-300 $f; done
  for f in $O/step-*.log; do tail -8 $f; done ;;
esac
echo "all done at $(el)s"
tar -C /tmp/s17 -cJf $OUT/$PART.tar.xz $PART
