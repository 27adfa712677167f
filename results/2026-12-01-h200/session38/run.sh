#!/bin/bash
# 2026-12-01 (thirty-eighth session), one H200 (nvidia-h200), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md). This
# session also ran session 37's prepared parts (`bash results/2026-12-01-h200/session37/run.sh F1|F2|G`). Part here:
#   bash run.sh H   the first GPU run of e2e's per-phase server flags (--cuda-graph-max-bs-decode, --cuda-graph-bs-decode,
#                   --disable-prefill-cuda-graph; 9c08a97 replaced 0.5.17's deprecated aliases, which 0.5.23 refuses):
#                   a served A/B (astra-sglang e2e, llama-small, one short round: `patch --serve` in both arms) and a
#                   profile (the step worker's flags), both SGLang 0.5.17
#   bash run.sh W   NOT RUN (prepared for the next session): moe_grouped_router's one-warp-a-token kernel for many
#                   tokens (-DASTRA_ROUTER_WARP_TOKENS=N, dev, off by default): check with N=1 (every call on it, shared
#                   column too), then the prefill rows that lost (and 256-token rows) timed for N = 256 and 1024
#                   against the default; fp32, production the installed biased_grouped_topk_gpu
#   bash run.sh R   NOT RUN: the activations' decode corpus (bf16, at their serving sites, between astra's linears as
#                   issue 14's numbers) with 48 replays: in context a row is now noise only while the paired 95% CI of
#                   the per-round difference holds 0 (65e8249), which more rounds narrow; at 8 it is [min, max]
#   bash run.sh P2  NOT RUN: Qwen3-8B's profile at batch 1 after d8bee06 (one unprofiled prefill first): the prefill
#                   should show no SGLang q/k norm, rope or KV-store call beside qknorm_rope_store
set -uo pipefail
PART=${1:?H, W, R or P2}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=${OUT:-/tmp/s38}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site
REPO=$PWD
case $PART in
H)
  (cd /tmp && timeout $(( ${LIMIT:-570} / 2 )) python3 -m astra_sglang.cli e2e --model-path $REPO/e2e/configs/llama-small \
    --out /tmp/flags-e2e --ops all --workload bs1:4:64:32:1 --rounds 1 --max-total-tokens 16384 --cuda-graph-max-bs 8 \
    --python python3) > $O/e2e.log 2>&1
  echo "e2e rc=$? at $(el)s"; cp /tmp/flags-e2e/report.md $O/e2e-report.md 2>/dev/null
  grep -hE "unrecognized|error:" /tmp/flags-e2e/server-*.log 2>/dev/null | head -3 | cut -c1-200
  grep -E "^\| (output throughput|TPOT mean)" /tmp/flags-e2e/report.md 2>/dev/null | cut -c1-200; tail -2 $O/e2e.log | cut -c1-200
  (cd /tmp && timeout $(( ${LIMIT:-570} - 15 - $(el) )) python3 -m astra_sglang.cli profile --model-path \
    $REPO/e2e/configs/llama-small --ops all --batch-size 1 --out /tmp/flags-prof --python python3) > $O/profile.log 2>&1
  echo "profile rc=$? at $(el)s"; cp /tmp/flags-prof/profile.md $O/profile-llama-small.md 2>/dev/null
  grep -E "^\| " /tmp/flags-prof/profile.md 2>/dev/null | head -6 | cut -c1-200; tail -2 $O/profile.log | cut -c1-200 ;;
W)
  source kernels/astra_env.sh
  WSR=.gpu_ws/installed/moe_grouped_router
  [ -f $WSR/manifest.json ] || $AS extract moe_grouped_router --variant installed --arch sm_90 --out .gpu_ws/installed \
    --no-build > $O/extract.log 2>&1 || { tail -3 $O/extract.log; exit 1; }
  { echo "#define ASTRA_ROUTER_WARP_TOKENS 1"; cat kernels/moe_grouped_router/kernel.cu; } > /tmp/router_wt1.cu
  timeout 300 $AS check moe_grouped_router --workspace $WSR --candidate /tmp/router_wt1.cu -v --json $O/check-wt1.json \
    > $O/check-wt1.log 2>&1
  echo "check (ASTRA_ROUTER_WARP_TOKENS=1) rc=$? at $(el)s: $(grep -E '^(PASS|FAIL|error)' $O/check-wt1.log | head -1 | cut -c1-160)"
  rows=256x256x9x8x4x1,1024x256x9x8x4x1,16384x256x9x8x4x1,256x384x8x1x1x0,1024x384x8x1x1x0,4096x384x8x1x1x0,16384x384x8x1x1x0
  DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/variants bash kernels/dev/bench_variants.sh moe_grouped_router $WSR \
    $rows fp32 default= wt256=-DASTRA_ROUTER_WARP_TOKENS=256 wt1024=-DASTRA_ROUTER_WARP_TOKENS=1024 > $O/variants.log 2>&1
  echo "variants rc=$? at $(el)s"; tail -14 $O/variants.log | cut -c1-200 ;;
R)
  OPS="silu_and_mul gelu_and_mul gelu_tanh_and_mul" EXTRACT=1 DTYPES=bf16 NEIGHBOURS=astra REPLAYS=48 \
    DEADLINE=$(( ${LIMIT:-570} - 90 - $(el) )) RES=$O/bench bash kernels/gpu_run.sh decode > $O/bench.log 2>&1
  echo "bench rc=$? at $(el)s"; cut -c1-330 $O/bench/summary.txt 2>/dev/null ;;
P2)
  (cd /tmp && timeout $(( ${LIMIT:-570} - 15 - $(el) )) python3 -m astra_sglang.cli profile --model-path \
    $REPO/e2e/configs/qwen3-8b --ops all --batch-size 1 --out /tmp/prof-qwen3-8b) > $O/profile.log 2>&1
  echo "profile rc=$? at $(el)s"; cp /tmp/prof-qwen3-8b/profile.md $O/profile-qwen3-8b.md 2>/dev/null
  grep -E "^### |qknorm|rope|kv_store" /tmp/prof-qwen3-8b/profile.md 2>/dev/null | head -20 | cut -c1-200 ;;
*) echo "error: run.sh takes H, W, R or P2" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
