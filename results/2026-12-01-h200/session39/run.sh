#!/bin/bash
# 2026-12-01 (thirty-ninth session), one H200 (nvidia-h200), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md), except L
# and the parts marked "carried", which need only a workspace extracted here on the CPU and carried (astra-work):
#   bash kernels/dev/workspaces_from_wheels.sh .whl/wh33fa3/wheels astra-work/ws silu_and_mul=jit gelu_and_mul=jit \
#     gelu_tanh_and_mul=jit
# This session also ran session 38's prepared parts W, R and P2 (`LIMIT=420|390|330 bash
# results/2026-12-01-h200/session38/run.sh W|R|P2`). Parts here:
#   bash run.sh W2  moe_grouped_router's one-warp-a-token kernel from 256 tokens (-DASTRA_ROUTER_WARP_TOKENS=256) on the
#                   prefill rows W had no time for (Kimi-K2 1k-16k, DeepSeek-V3 with and without the shared column)
#   bash run.sh W3  the same at 512 tokens (the band between the decode and prefill corpora)
#   bash run.sh B2  session 37's B2 cut to the two fp16 norms below 1.3x with cuBLAS neighbours, between astra's linears
#   bash run.sh L   (carried) silu_and_mul's trigger placement at 1-256 tokens: the early release (shipped then), the
#                   release after the stores keeping the prefetch (-DASTRA_TRIG_END=1), and production's placement
#                   without the prefetch (-DASTRA_PDL=1), both orders, 48 replays, between astra's linears
#   bash run.sh R2  NOT RUN (prepared): silu_and_mul's decode corpus with ASTRA_LATE_TOKENS 64u as shipped (ac94c69),
#                   48 replays, between astra's linears: the runtime switch's first GPU run (L timed the compile-time
#                   variant)
#   bash run.sh G   NOT RUN (prepared, carried): gelu_and_mul and gelu_tanh_and_mul with silu's switch, ported off by
#                   default (ASTRA_LATE_TOKENS ~0u), on from 16 or 64 tokens, on their 1-256-token rows, both orders,
#                   48 replays: whether silu's late release carries (then set the default)
#   bash run.sh F   NOT RUN (prepared): moe_grouped_router's prefill and decode corpora (fp32) with 6a86496's defaults
#                   (one warp a token from 1024 tokens; one-group calls of 257-1023 tokens SGLang's)
#   bash run.sh N   NOT RUN (prepared): the norm family's decode corpus (bf16, between astra's linears) with 48 replays,
#                   as R did for the activations: which rows the paired rule resolves slower (issue 14: every row)
set -uo pipefail
PART=${1:?W2, W3, B2, L, R2, G, N or F}
case $PART in W2|W3|B2|L|R2|G|N|F) ;; *) echo "error: run.sh takes W2, W3, B2, L, R2, G, N or F" >&2; exit 2 ;; esac
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s39}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
case $PART in
L|G) ;;
*) bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
   export PYTHONPATH=/tmp/e2e-site ;;
esac
WSR=.gpu_ws/installed/moe_grouped_router  # session 38's part W extracted it on this machine
case $PART in
W2)
  source kernels/astra_env.sh
  rows=1024x384x8x1x1x0,4096x384x8x1x1x0,16384x384x8x1x1x0,1024x256x8x8x4x0,16384x256x8x8x4x0,4096x256x9x8x4x1
  DEADLINE=370 RES=$O/variants bash kernels/dev/bench_variants.sh moe_grouped_router $WSR $rows fp32 default= \
    wt256=-DASTRA_ROUTER_WARP_TOKENS=256 > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; grep -v '^ *·' $O/variants.log | tail -24 | cut -c1-200 ;;
W3)
  source kernels/astra_env.sh
  DEADLINE=150 RES=$O/variants bash kernels/dev/bench_variants.sh moe_grouped_router $WSR \
    512x384x8x1x1x0,512x256x9x8x4x1,512x256x8x8x4x0 fp32 default= wt512=-DASTRA_ROUTER_WARP_TOKENS=512 \
    > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; grep -v '^ *·' $O/variants.log | tail -12 | cut -c1-200 ;;
B2)
  OPS="rmsnorm gemma_fused_add_rmsnorm" EXTRACT=1 DTYPES=fp16 NEIGHBOURS=astra DEADLINE=200 RES=$O/bench \
    bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
L)
  NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=190 BENCH_ARGS="--replays 48" RES=$O bash kernels/dev/bench_variants.sh \
    silu_and_mul astra-work/ws/jit/silu_and_mul 1x14336,16x12288,64x11008,64x7168,64x18944,256x13824,256x6912,256x12800 \
    bf16 default= late=-DASTRA_TRIG_END=1 pdl1=-DASTRA_PDL=1 > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; grep -v '^ *·' $O/variants.log | tail -30 | cut -c1-200 ;;
R2)
  OPS=silu_and_mul EXTRACT=1 DTYPES=bf16 NEIGHBOURS=astra REPLAYS=48 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) \
    RES=$O/bench bash kernels/gpu_run.sh check,decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
G)
  for op in gelu_and_mul gelu_tanh_and_mul; do
    case $op in gelu_and_mul) rows=16x16384,64x16384,256x16384,64x24576,256x24576,1x16384 ;;
                *) rows=16x14336,64x14336,256x14336,256x15360,16x21504,1x14336 ;; esac
    NEIGHBOURS=astra BOTH_ORDERS=1 DEADLINE=$(( ${LIMIT:-570} / 2 - 30 )) BENCH_ARGS="--replays 48" RES=$O/$op \
      bash kernels/dev/bench_variants.sh $op astra-work/ws/jit/$op $rows bf16 default= late16=-DASTRA_LATE_TOKENS=16u \
      late64=-DASTRA_LATE_TOKENS=64u \
      > $O/$op.log 2>&1
    echo "$op variants rc=$? at $(el)s"; grep -v '^ *·' $O/$op.log | tail -6 | cut -c1-200
  done ;;
N)
  OPS="fused_add_rmsnorm qknorm gemma_rmsnorm gemma_fused_add_rmsnorm gemma_post_attention_norms rmsnorm" EXTRACT=1 \
    DTYPES=bf16 NEIGHBOURS=astra REPLAYS=48 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench \
    bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
F)
  OPS=moe_grouped_router EXTRACT=1 DTYPES=fp32 DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench \
    bash kernels/gpu_run.sh check,prefill,decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
esac
echo "part $PART done at $(el)s"
