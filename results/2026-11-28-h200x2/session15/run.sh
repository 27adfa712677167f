#!/bin/bash
# 2026-11-28 (fifteenth session), 2x H200. The wheelhouse is staged first (.whl/wh30, built at 580eeda with
# python3 e2e/build_wheelhouse.py --out .whl/wh30 --chunk-mib auto --lock e2e/wheelhouse/lock.txt; one device call per
# part: bash e2e/device_install.sh stage .whl/wh30/carry/partNN), then back to back, carrying astra-work/ws
# (extracted on the CPU: astra-sglang extract OP --sglang 0.5.17 --arch sm_90 --out astra-work/ws/VARIANT --no-build):
#   bash run.sh f   GPU 0: where the in-context floor comes from. kernels/dev/floor_probe.py with bench's neighbours
#                   (producer 4096 -> H, consumer H -> 4096) and with the model's own pairs around fused_add_rmsnorm
#                   (o_proj -> gate_up, down_proj -> qkv of Llama-3-8B and Qwen3-8B); then fused_add_rmsnorm's decode
#                   corpus with bench's neighbours and with Llama-3-8B's o_proj -> gate_up.
#                   GPU 1: qknorm's trigger-before-wait (-DASTRA_QKN_TRIG_FIRST=1) on its decode corpus, both orders;
#                   then gelu_and_mul's check on odd widths above 256 tokens (its P=2 path)
#   bash run.sh s   GPU 0: server A/B Qwen3-8B, SGLang unpatched against --ops all, with the A/A control (--calibrate),
#                   batch 1, linear's down_proj rules included. GPU 1: every shipped op's check (EXTRACT=1), after check
#                   began judging the cases production does not take against the fp64 reference alone (aba84c1), and
#                   gelu_and_mul's odd widths above 256 tokens again (production refused them all in part f)
#   bash run.sh t   GPU 0: server A/B Llama-3-8B, as part s. GPU 1: gelu_and_mul's and gelu_tanh_and_mul's check after their
#                   fp32 floor took production's own fast-math error (part s failed them on 7 x 1001 fp32), then the
#                   Gemma-2-9B server A/B, as part s
#   bash run.sh c   (4x H200) server A/Bs at concurrency 4 (16 prompts, 128 in / 128 out), as part s, one model a GPU:
#                   Qwen3-8B, Llama-3-8B, Gemma-2-9B, and the Qwen3-30B-A3B-shaped MoE model (20 layers)
#   bash run.sh n   (1x H200, no wheelhouse: bench needs no SGLang) fused_add_rmsnorm at 1-4 tokens in context, the
#                   neighbour GEMMs cuBLAS (--neighbours cublas) and then astra's linear (--neighbours astra), in one call
set -uo pipefail
PART=${1:?f, s, t, c or n}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s15/$PART; mkdir -p $O
export WS=astra-work/ws
if [ $PART = n ]; then
  source kernels/astra_env.sh; AS="python3 -m astra_sglang.cli"; fw=$WS/flashinfer/fused_add_rmsnorm
  for nb in cublas astra; do
    timeout 100 $AS bench fused_add_rmsnorm --workspace $fw --candidate kernels/fused_add_rmsnorm/kernel.cu --dtype bf16 \
      --shapes 1x4096,1x5120,1x7168,1x8192,2x4096,4x4096,4x5120 --replays 20 --neighbours $nb --no-recheck \
      --out $O/fanorm-$nb.json > $O/fanorm-$nb.log 2>&1
    echo "neighbours $nb rc=$? at $(el)s"; grep -E "^ *[0-9]+x|geomean|in context: the op|floor" $O/fanorm-$nb.log | cut -c1-220
  done
  tar -C /tmp/s15 -cJf $OUT/$PART.tar.xz $PART; exit 0
fi
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site PYTHONUNBUFFERED=1 WS=astra-work/ws
echo "installed at $(el)s"
AS="python3 -m astra_sglang.cli"
case $PART in
f)
  (  # GPU 1: qknorm's trigger-before-wait, then gelu_and_mul's P=2 path on odd widths
    export CUDA_VISIBLE_DEVICES=1
    RES=$O/qknorm BOTH_ORDERS=1 timeout 330 bash kernels/dev/bench_variants.sh qknorm $WS/jit/qknorm decode \
      bf16 default= trig0="-DASTRA_QKN_TRIG_FIRST=1" > $O/qknorm.log 2>&1
    echo "qknorm variants done at $(el)s"
    RES=$O/gelu-check DEADLINE=120 EXTRACT=1 OPS="gelu_and_mul" bash kernels/gpu_run.sh check > $O/gelu-check.log 2>&1
    source kernels/astra_env.sh
    gws=$(dirname "$(ls $WS/*/gelu_and_mul/manifest.json | head -1)")
    timeout 120 $AS check gelu_and_mul --workspace "$gws" --candidate kernels/gelu_and_mul/kernel.cu --dtype bf16,fp16 \
      --shapes 1024x11009,4096x14337,300x4097,2048x2881 --json $O/check-gelu-odd.json > $O/check-gelu-odd.log 2>&1
    echo "check gelu_and_mul odd widths > 256 tokens rc=$? at $(el)s: $(tail -1 $O/check-gelu-odd.log)"
  ) &
  P="python3 kernels/dev/floor_probe.py --tokens 1,16,64,256"
  { $P                                                      > $O/probe-bench.log 2>&1
    $P --hidden 4096 --producer-k 4096 --consumer-width 28672  > $O/probe-l3-oproj-gateup.log 2>&1
    $P --hidden 4096 --producer-k 14336 --consumer-width 6144  > $O/probe-l3-down-qkv.log 2>&1
    $P --hidden 4096 --producer-k 4096 --consumer-width 24576  > $O/probe-q3-oproj-gateup.log 2>&1
    $P --hidden 4096 --producer-k 12288 --consumer-width 6144  > $O/probe-q3-down-qkv.log 2>&1
    $P --hidden 3584 --producer-k 4096 --consumer-width 28672  > $O/probe-g2-oproj-gateup.log 2>&1
  }
  echo "floor probes done at $(el)s"
  for f in $O/probe-*.log; do echo "== $(basename $f)"; cat $f; done
  source kernels/astra_env.sh
  fw=$WS/flashinfer/fused_add_rmsnorm
  RES=$O/fanorm-bench timeout 250 bash kernels/dev/bench_variants.sh fused_add_rmsnorm $fw decode bf16 default= \
    > $O/fanorm-bench.log 2>&1
  echo "fused_add_rmsnorm, bench's neighbours, at $(el)s"
  RES=$O/fanorm-l3 BENCH_ARGS="--producer-k 4096 --consumer-width 28672" timeout $(( 570 - $(el) )) \
    bash kernels/dev/bench_variants.sh fused_add_rmsnorm $fw decode bf16 default= > $O/fanorm-l3.log 2>&1
  echo "fused_add_rmsnorm, Llama-3-8B's o_proj -> gate_up, at $(el)s"
  wait; echo "GPU 1 done at $(el)s"
  for f in fanorm-bench fanorm-l3 qknorm; do echo "== $f"; tail -40 $O/$f.log | grep -v "^ *$" | tail -22; done
  tail -3 $O/gelu-check.log ;;
s)
  ( export CUDA_VISIBLE_DEVICES=1
    RES=$O/check-all DEADLINE=400 EXTRACT=1 bash kernels/gpu_run.sh check > $O/check-all.log 2>&1
    echo "check, every op, at $(el)s"
    source kernels/astra_env.sh
    gws=$(dirname "$(ls $WS/*/gelu_and_mul/manifest.json | head -1)")
    timeout 100 $AS check gelu_and_mul --workspace "$gws" --candidate kernels/gelu_and_mul/kernel.cu --dtype bf16,fp16 \
      --shapes 1024x11009,4096x14337,300x4097,2048x2881 --json $O/check-gelu-odd.json > $O/check-gelu-odd.log 2>&1
    echo "check gelu_and_mul odd widths > 256 tokens rc=$? at $(el)s: $(tail -4 $O/check-gelu-odd.log | head -1)" ) &
  ( cd /tmp && timeout 560 $AS e2e --model-path $OLDPWD/e2e/configs/qwen3-8b --out $O/server-qwen3-8b \
      --ops all --calibrate --workload bs1:8:128:128:1 --rounds 3 --max-total-tokens 16384 --port 30100 \
      > $O/server-qwen3-8b.log 2>&1
    echo "server A/B qwen3-8b rc=$? at $(el)s"; grep -i -E "startup|throughput|identical|A/A" $O/server-qwen3-8b/report.md | head -14 ) &
  wait
  cat $O/check-all/summary.txt 2>/dev/null | tail -40 ;;
t|c)
  server() {  # NAME PORT [WORKLOAD]
    ( cd /tmp && timeout 540 $AS e2e --model-path $OLDPWD/e2e/configs/$1 --out $O/server-$1 --ops all --calibrate \
        --workload ${3:-bs1:8:128:128:1} --rounds 3 --max-total-tokens 16384 --port $2 > $O/server-$1.log 2>&1
      echo "server A/B $1 rc=$? at $(el)s"; grep -i -E "startup|throughput|identical|resolved" $O/server-$1/report.md | head -14 )
  }
  if [ $PART = c ]; then
    g=0
    for m in qwen3-8b llama3-8b gemma2-9b qwen3-30b-a3b-20l; do
      CUDA_VISIBLE_DEVICES=$g server $m $(( 30100 + 300 * g )) c4:16:128:128:4 &
      g=$(( g + 1 ))
    done
    wait; echo "all done at $(el)s"; tar -C /tmp/s15 -cJf $OUT/$PART.tar.xz $PART; exit 0
  fi
  ( export CUDA_VISIBLE_DEVICES=1
    RES=$O/check-gelu DEADLINE=100 EXTRACT=1 OPS="gelu_and_mul gelu_tanh_and_mul" bash kernels/gpu_run.sh check \
      > $O/check-gelu.log 2>&1
    echo "check gelu at $(el)s"; cat $O/check-gelu/summary.txt
    server gemma2-9b 30700 ) &
  server llama3-8b 30100 &
  wait ;;
esac
echo "all done at $(el)s"
tar -C /tmp/s15 -cJf $OUT/$PART.tar.xz $PART
