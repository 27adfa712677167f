#!/bin/bash
# 2026-11-30 (thirty-first session), 2x H200 (nvidia-h200-x2), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`). Parts:
#   bash run.sh S   GPU 0: the sweep (moe_sweep.py here) | GPU 1: ncu of the shipped kernel, two variants, the floor
#                   and SGLang's fused_experts at 1, 2 and 4 tokens (NCU_VARIANTS); VARIANTS picks the sweep's set
#                   (round 1: VARIANTS="$ROUND1" of moe_sweep.py, NCU_VARIANTS=auto,s2b4,p1,touch; round 2: defaults)
#   bash run.sh R2  the candidate (kernel.cu with K2_DEFS, default `#define ASTRA_K2_STAGE 1`) as /tmp/moe_cand.cu:
#                   GPU 0: the sweep, then the Qwen3-30B-A3B decode-step A/B, every default op (A) against every
#                   default op with the candidate as moe_experts' kernel (B), batch ${BS:-1,2} | GPU 1: check of the
#                   candidate against SGLang's installed fused_experts
#   bash run.sh E5  GPU 0: served Qwen3-30B-A3B (20 layers), unpatched (A, A2) against every default op (B), batch 1
#                   only, ${ROUNDS:-5} rounds (session 30's 3 did not resolve it) | GPU 1: validate moe_experts, bf16 and
#                   fp16 (MAX_INTER_MULTI's first GPU run: 2-token rows of experts wider than 1024 columns declined)
#   bash run.sh T   served Qwen3-30B-A3B (20 layers) at tensor parallel 2 (both GPUs), unpatched (A, A2) against every
#                   default op (B), batch 1 and concurrency 4, ${ROUNDS:-2} rounds; decode graphs up to batch 4 and no
#                   piecewise (prefill) graphs, so three tp-2 servers start inside one call (session 30's did not)
set -uo pipefail
PART=${1:?S, R2, E5 or T}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
HERE=results/2026-11-30-h200/session31
O=${OUT:-/tmp/s31}/$PART; mkdir -p $O
bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case $PART in
S)
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  echo "installed at $(el)s"
  CUDA_VISIBLE_DEVICES=0 timeout ${ST:-300} python3 $HERE/moe_sweep.py $O/sweep > $O/sweep.log 2>&1 &
  (CUDA_VISIBLE_DEVICES=1 NCU=1 VARIANTS="${NCU_VARIANTS:-auto,st,st r16g1}" timeout ${ST:-300} ncu --target-processes all \
     --kernel-name regex:"gate_up|down_|fused_moe|touch|moe_align|count_and_sort|moe_sum|act_and_mul" \
     --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active \
     --csv --print-units base python3 $HERE/moe_sweep.py $O/ncu > $O/ncu.csv 2> $O/ncu.err
   echo "ncu rc=$?"
   python3 - $O/ncu.csv > $O/ncu.md <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
per = collections.OrderedDict()
for r in body:
    per.setdefault((r[ix["ID"]], r[ix["Kernel Name"]][:60]), {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
print("| id | kernel | µs | MB read | DRAM % peak | regs | grid | warps active % |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for (i, name), m in per.items():
    g = lambda k: m.get(k, "")
    us = float(g("gpu__time_duration.sum").replace(",", "") or 0) / 1000.0
    mb = float(g("dram__bytes_read.sum").replace(",", "") or 0) / 1e6
    print(f"| {i} | {name} | {us:.2f} | {mb:.1f} | {g('dram__throughput.avg.pct_of_peak_sustained_elapsed')} | "
          f"{g('launch__registers_per_thread')} | {g('launch__grid_size')} | {g('sm__warps_active.avg.pct_of_peak_sustained_active')} |")
PY
  ) > $O/ncu.log 2>&1 &
  wait
  echo "sweep + ncu done at $(el)s"; tail -18 $O/sweep.log | cut -c1-600; cat $O/ncu.log | head -5; wc -l $O/ncu.md ;;
R2)
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  echo "installed at $(el)s"
  { echo -e "${K2_DEFS:-#define ASTRA_K2_STAGE 1}"; cat kernels/moe_experts/kernel.cu; } > /tmp/moe_cand.cu
  head -2 /tmp/moe_cand.cu
  (CUDA_VISIBLE_DEVICES=0 timeout ${ST:-200} python3 $HERE/moe_sweep.py $O/sweep > $O/sweep.log 2>&1
   echo "sweep done at $(el)s"; tail -12 $O/sweep.log | cut -c1-700
   CUDA_VISIBLE_DEVICES=0 STEP_ARGS="--procs 2 --procs-at-once 1 --batch-size ${BS:-1,2} --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" RES=$O/m DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) \
     bash e2e/step_session.sh 'cand:qwen3-30b-a3b-20l:560:--base-ops=all --ops=all --candidate moe_experts=/tmp/moe_cand.cu' \
     > $O/step.log 2>&1
   echo "step done at $(el)s"; tail -8 $O/step.log | cut -c1-220) > $O/gpu0.log 2>&1 &
  (if [ -n "${NCU_VARIANTS:-}" ]; then  # ncu first (a short run), then the check
     CUDA_VISIBLE_DEVICES=1 NCU=1 VARIANTS="$NCU_VARIANTS" timeout 150 ncu --target-processes all \
       --kernel-name regex:"gate_up|down_|fused_moe" --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active \
       --csv --print-units base python3 $HERE/moe_sweep.py $O/ncu > $O/ncu.csv 2> $O/ncu.err; echo "ncu rc=$? at $(el)s"
   fi
   source kernels/astra_env.sh
   WS=/tmp/s31-ws
   [ -d $WS/installed/moe_experts ] || $AS extract moe_experts --variant installed --arch sm_90 --out $WS/installed \
     --no-build > $O/extract.log 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 300 $AS check moe_experts --workspace $WS/installed/moe_experts \
     --candidate /tmp/moe_cand.cu --json $O/check.json > $O/check.log 2>&1
   echo "check rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)|bit-identical|normwise" $O/check.log | cut -c1-250 | head -5
  ) > $O/gpu1.log 2>&1 &
  wait
  cat $O/gpu1.log $O/gpu0.log ;;
E5)
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  echo "installed at $(el)s"
  (cd /tmp && CUDA_VISIBLE_DEVICES=0 timeout $(( ${LIMIT:-570} - 20 - $(el) )) python3 -m astra_sglang.cli e2e \
    --model-path $OLDPWD/e2e/configs/qwen3-30b-a3b-20l --out /tmp/cal-bs1 --ops all --calibrate \
    --workload bs1:8:128:128:1 --rounds ${ROUNDS:-5} --max-total-tokens 16384 --port 30100 > $O/cal-bs1.log 2>&1
   echo "cal rc=$? at $(el)s"
   tar -C /tmp -czf $O/cal-bs1.tar.gz --exclude="*/counters-*" cal-bs1 2>/dev/null
   grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-bs1/report.md 2>/dev/null | head -8 | cut -c1-250
   tail -3 $O/cal-bs1.log | cut -c1-250) > $O/gpu0.log 2>&1 &
  (source kernels/astra_env.sh; cd /tmp && CUDA_VISIBLE_DEVICES=1 timeout 300 $AS validate --ops moe_experts \
     --dtypes bf16,fp16 --json $O/validate.json > $O/validate.log 2>&1
   echo "validate rc=$? at $(el)s: $(tail -1 $O/validate.log | cut -c1-200)"; grep -ci "n/a" $O/validate.log
  ) > $O/gpu1.log 2>&1 &
  wait
  cat $O/gpu1.log $O/gpu0.log ;;
T)
  bash e2e/device_install.sh astra > $O/astra.log 2>&1
  echo "installed at $(el)s"
  (cd /tmp && CUDA_VISIBLE_DEVICES=0,1 timeout $(( ${LIMIT:-570} - 20 - $(el) )) python3 -m astra_sglang.cli e2e \
    --model-path $OLDPWD/e2e/configs/qwen3-30b-a3b-20l --out /tmp/cal-tp2 --ops all --calibrate --tp 2 \
    --cuda-graph-max-bs 4 --server-arg=--disable-piecewise-cuda-graph \
    --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds ${ROUNDS:-2} --max-total-tokens 16384 \
    --port 30100 > $O/cal-tp2.log 2>&1)
  echo "cal rc=$? at $(el)s"
  tar -C /tmp -czf $O/cal-tp2.tar.gz --exclude="*/counters-*" cal-tp2 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)" /tmp/cal-tp2/report.md 2>/dev/null | head -8 | cut -c1-250
  grep -E "identical" /tmp/cal-tp2/report.md 2>/dev/null | head -4
  tail -4 $O/cal-tp2.log | cut -c1-250 ;;
*) echo "error: run.sh takes S, R2, E5 or T" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
