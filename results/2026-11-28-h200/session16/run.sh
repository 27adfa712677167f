#!/bin/bash
# 2026-11-28 (sixteenth session), 1x H200.
#   bash run.sh a   (no wheelhouse: check and bench need no SGLang) check of merge_state (its flashinfer variant) and
#                   moe_combine (its jit_topk_sum variant), whose sgl_kernel workspaces need an SGLang checkout, after
#                   check began judging what production refuses against the fp64 reference alone; then the norms' and
#                   activations' decode corpora in context between the GEMMs a patched server runs (NEIGHBOURS=astra:
#                   astra's linear where its adapter takes the shape, cuBLAS elsewhere), bf16
#   bash run.sh s   (wheelhouse staged first: .whl/wh30, one device call per part,
#                   bash e2e/device_install.sh stage .whl/wh30/carry/partNN) decode step A/B on Llama-3-8B at batch 1
#                   and 2: arm A every default op but fused_add_rmsnorm, arm B every default op (--base-ops
#                   all,-fused_add_rmsnorm --ops all): fused_add_rmsnorm's gain in the real graph, between astra's linears
#   bash run.sh g   (2x H200, wheelhouse as part s) the same for Gemma-2-9B's two standalone norms (arm A every default op but
#                   gemma_fused_add_rmsnorm and gemma_rmsnorm; GPU 1) and for Qwen3-8B's fused_add_rmsnorm, batch 1 and 2
#   bash run.sh m   (2x H200, wheelhouse as part s but re-split to 12 MiB parts, .whl/wh31: the tracked tree had grown
#                   past 50 MiB; LIMIT=seconds caps the benches) issue 15's losing rows, compile-time variants (bench_variants.sh):
#                   GPU 0: moe_combine's 1- and 8-token rows (SGLang's torch.compile'd route), against the installed
#                   callable too (--baseline installed): shipped, trigger after the stores (ASTRA_PDL=1), no L2 prefetch
#                   (ASTRA_PF_MAX=0u), plain launch (ASTRA_PDL=0). GPU 1: moe_grouped_router's rows without a shared
#                   column (DeepSeek-V3 and Kimi-K2 shapes, fp32 logits), the installed router extracted here: shipped
#                   against a plain launch (ASTRA_PDL=0), both orders
# Workspaces extracted on the CPU, carried as astra-work/ws:
#   astra-sglang extract OP --variant V --sglang 0.5.17 --arch sm_90 --out astra-work/ws/V --no-build
set -uo pipefail
PART=${1:?a, s, g or m}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s16/$PART; mkdir -p $O
export WS=astra-work/ws
case $PART in
a)
  RES=$O/check VARIANT_merge_state=flashinfer VARIANT_moe_combine=jit_topk_sum OPS="merge_state moe_combine" \
    bash kernels/gpu_run.sh check > $O/check.log 2>&1
  echo "check at $(el)s"; cat $O/check/summary.txt
  RES=$O/decode NEIGHBOURS=astra DTYPES=bf16 DEADLINE=$(( 500 - $(el) )) \
    OPS="fused_add_rmsnorm rmsnorm gemma_fused_add_rmsnorm gemma_rmsnorm qknorm silu_and_mul gelu_tanh_and_mul" \
    bash kernels/gpu_run.sh decode > $O/decode.log 2>&1
  echo "decode at $(el)s"; cut -c1-400 $O/decode/summary.txt ;;
s|g)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5"
  step() {  # RES_DIR NAME:CONFIG:SECS:ARGS
    STEP_ARGS=$STEP_ARGS RES=$1 DEADLINE_S=$(( 570 - $(el) )) bash e2e/step_session.sh "$2" > $1.log 2>&1; }
  if [ $PART = s ]; then step $O/step "llama3-8b-fanorm:llama3-8b:540:--base-ops=all,-fused_add_rmsnorm --ops=all"
  else  # 2x H200, one model a GPU
    CUDA_VISIBLE_DEVICES=1 step $O/step-g2 \
      "gemma2-9b-norms:gemma2-9b:540:--base-ops=all,-gemma_fused_add_rmsnorm,-gemma_rmsnorm --ops=all --port=30500" &
    step $O/step "qwen3-8b-fanorm:qwen3-8b:540:--base-ops=all,-fused_add_rmsnorm --ops=all"
    wait; tail -12 $O/step-g2.log
  fi
  tail -14 $O/step.log ;;
m)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  export PYTHONPATH=/tmp/e2e-site; source kernels/astra_env.sh; echo "installed at $(el)s"
  ( export CUDA_VISIBLE_DEVICES=1
    $AS extract moe_grouped_router --variant installed --arch sm_90 --out $WS/installed --no-build > $O/extract.log 2>&1 \
      || tail -3 $O/extract.log
    RES=$O/grouped BOTH_ORDERS=1 timeout $(( ${LIMIT:-560} - $(el) )) bash kernels/dev/bench_variants.sh moe_grouped_router \
      $WS/installed/moe_grouped_router 1x256x8x8x4x0,8x256x8x8x4x0,256x256x8x8x4x0,1x384x8x1x1x0,256x384x8x1x1x0 fp32 \
      default= pdl0="-DASTRA_PDL=0" > $O/grouped.log 2>&1
    echo "grouped router variants at $(el)s" ) &
  RES=$O/combine BENCH_ARGS="--baseline installed" timeout $(( ${LIMIT:-560} - $(el) )) bash kernels/dev/bench_variants.sh \
    moe_combine $WS/jit_topk_sum/moe_combine 1x8x2048,1x8x4096,1x8x7168,1x9x7168,1x4x2880,8x8x2048,8x4x2880 bf16 \
    default= pdl1="-DASTRA_PDL=1" pf0="-DASTRA_PF_MAX=0u" pdl0="-DASTRA_PDL=0" > $O/combine.log 2>&1
  echo "combine variants at $(el)s"; wait
  python3 - $O/combine <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    rows = json.load(open(f))["rows"]
    print(f.rsplit("/", 1)[1], " ".join(f"{r['shape']}:{r.get('context_installed_us') or 0:.2f}/{r.get('context_cand_us') or 0:.2f}"
                                        for r in rows))
PY
  tail -16 $O/combine.log; tail -14 $O/grouped.log ;;
esac
echo "all done at $(el)s"
tar -C /tmp/s16 -cJf $OUT/$PART.tar.xz $PART
