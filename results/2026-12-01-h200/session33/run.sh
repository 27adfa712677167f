#!/bin/bash
# 2026-12-01 (thirty-third session), one H200 (nvidia-h200), from the repository root, after staging the FA3
# wheelhouse (.whl/wh33fa3: `bash e2e/device_install.sh stage .whl/wh33fa3/carry/partNN`, e2e/README.md). Parts:
#   bash run.sh A   no SGLang first (the wheelhouse installs meanwhile): session 31's TMA kernel 1
#                   (variants-next.diff, quick_tma.py); then gate_up_gelu's check (bf16, fp16) and decode corpus in context (bf16),
#                   validate gate_up_gelu (Gemma-1's GemmaMLP) and moe_experts (its 2-token rows, bf16)
#   bash run.sh B   the MoE router's share of the chain (kernels/dev/moe_router_chain.py), then the Gemma-7B decode-step A/B: arm A every default op, B the same and gate_up_gelu; batch 1, 2
#   bash run.sh C   the router chain again (B's captured nothing: its launches went to the default stream), the fp16
#                   decode corpus of gate_up_gelu, a served Gemma-7B A/B: unpatched against `--ops all,gate_up_gelu`
#   bash run.sh E   linear on Gemma-7B's 24576-wide down_proj: check, the rows in context, and the step A/B with
#                   ASTRA_LINEAR_MAX_IN_FEATURES=24576 in arm B (every default op in both arms)
set -uo pipefail
PART=${1:?A, B, C or E}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
HERE=results/2026-12-01-h200/session33
S31=results/2026-11-30-h200/session31
O=${OUT:-/tmp/s33}/$PART; mkdir -p $O
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
case $PART in
A)
  (bash e2e/device_install.sh ensure > $O/ensure.log 2>&1; echo "ensure rc=$?" >> $O/ensure.log) &
  INST=$!
  source kernels/astra_env.sh
  # the TMA kernel 1 (never run before): patched into the copy, timed, patched back out
  if patch -p1 --dry-run < $S31/variants-next.diff > /dev/null; then
    patch -p1 < $S31/variants-next.diff > /dev/null
    timeout 150 python3 $S31/quick_tma.py > $O/quick_tma.log 2>&1; echo "quick_tma rc=$? at $(el)s"
    patch -R -p1 < $S31/variants-next.diff > /dev/null
  else echo "variants-next.diff does not apply"; fi
  tail -12 $O/quick_tma.log | cut -c1-200
  wait $INST; tail -1 $O/ensure.log
  export PYTHONPATH=/tmp/e2e-site
  OPS=gate_up_gelu EXTRACT=1 DTYPES=bf16 RES=$O/gug bash kernels/gpu_run.sh check,decode > $O/gug.log 2>&1
  echo "gate_up_gelu corpus rc=$? at $(el)s"; cat $O/gug/summary.txt 2>/dev/null | cut -c1-250
  (cd /tmp && timeout -s INT -k 10 90 python3 -m astra_sglang.cli validate --ops gate_up_gelu --dtypes bf16,fp16 \
     --json $O/validate-gug.json) > $O/validate-gug.log 2>&1
  echo "validate gate_up_gelu rc=$? at $(el)s: $(tail -1 $O/validate-gug.log | cut -c1-200)"
  (cd /tmp && timeout -s INT -k 10 150 python3 -m astra_sglang.cli validate --ops moe_experts --dtypes bf16 \
     --json $O/validate-moe.json) > $O/validate-moe.log 2>&1
  echo "validate moe_experts rc=$? at $(el)s: $(tail -1 $O/validate-moe.log | cut -c1-200)"
  grep -E "^ *(2|2 )|2x|\(2, " $O/validate-moe.log | head -6 | cut -c1-200 ;;
B)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  # astra from the site: the checkout's editable install is not importable from kernels/dev
  PYTHONPATH=/tmp/e2e-site timeout 150 python3 kernels/dev/moe_router_chain.py > $O/router_chain.log 2>&1
  echo "router_chain rc=$? at $(el)s"; tail -12 $O/router_chain.log | cut -c1-200
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh 'gug-gemma7b:gemma-7b:540:--base-ops=all --ops=all,gate_up_gelu' > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A4 "summary (Δ" $O/step.log | tail -4 | cut -c1-250; tail -3 $O/step.log | cut -c1-250 ;;
C)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  export PYTHONPATH=/tmp/e2e-site
  timeout 120 python3 kernels/dev/moe_router_chain.py > $O/router_chain.log 2>&1
  echo "router_chain rc=$? at $(el)s"; tail -4 $O/router_chain.log | cut -c1-200
  OPS=gate_up_gelu EXTRACT=1 DTYPES=fp16 RES=$O/gug16 bash kernels/gpu_run.sh decode > $O/gug16.log 2>&1
  echo "gate_up_gelu fp16 rc=$? at $(el)s"; cut -c1-250 $O/gug16/summary.txt
  # served Gemma-7B: unpatched (A, A2) against every default op and gate_up_gelu (B), batch 1
  (cd /tmp && timeout $(( ${LIMIT:-570} - 20 - $(el) )) python3 -m astra_sglang.cli e2e \
    --model-path $OLDPWD/e2e/configs/gemma-7b --out /tmp/srv-gemma7b --ops all,gate_up_gelu --calibrate \
    --workload bs1:8:128:128:1 --rounds ${ROUNDS:-3} --max-total-tokens 16384 --port 30100 > $O/served.log 2>&1)
  echo "served rc=$? at $(el)s"
  tar -C /tmp -czf $O/served-gemma7b.tar.gz --exclude="*/counters-*" srv-gemma7b 2>/dev/null
  grep -E "^\| (attention backend|output throughput|TPOT mean)|identical|gate_up_gelu" /tmp/srv-gemma7b/report.md 2>/dev/null \
    | head -10 | cut -c1-250; tail -3 $O/served.log | cut -c1-250 ;;
E)
  # linear on Gemma-7B's 24576-wide down_proj (1-2 tokens), which its adapter leaves to cuBLAS (MAX_IN_FEATURES 21504:
  # longer rows were never measured): check and the two rows in context, then the step with the bound moved in arm B
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  export PYTHONPATH=/tmp/e2e-site
  source kernels/astra_env.sh
  WS=/tmp/ws33e; SH=1x24576x3072,2x24576x3072
  [ -f $WS/installed/linear/manifest.json ] || $AS extract linear --variant installed --arch sm_90 --out $WS/installed \
    --no-build > $O/extract.log 2>&1
  (cd /tmp && timeout 200 python3 -m astra_sglang.cli check linear --workspace $WS/installed/linear \
     --candidate $OLDPWD/kernels/linear/kernel.cu --shapes $SH --json $O/check-linear.json) > $O/check-linear.log 2>&1
  echo "check rc=$? at $(el)s: $(grep -E '^(PASS|FAIL)' $O/check-linear.log | cut -c1-200)"
  (cd /tmp && timeout 200 python3 -m astra_sglang.cli bench linear --workspace $WS/installed/linear \
     --candidate $OLDPWD/kernels/linear/kernel.cu --shapes $SH --dtype bf16 --out $O/bench-linear.json) \
     > $O/bench-linear.log 2>&1
  echo "bench rc=$? at $(el)s"; grep -E "^(1|2)x24576|geomean" $O/bench-linear.log | cut -c1-200
  RES=$O DEADLINE_S=$(( ${LIMIT:-570} - $(el) )) STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 \
--rounds 4 --warmup-rounds 1 --skip-steps 3 --profile-steps 10 --mem-fraction-static 0.5" \
    bash e2e/step_session.sh 'lin24k-gemma7b:gemma-7b:400:--base-ops=all --ops=all --arm-env B:ASTRA_LINEAR_MAX_IN_FEATURES=24576' \
    > $O/step.log 2>&1
  echo "step rc=$? at $(el)s"; grep -A4 "summary (Δ" $O/step.log | tail -4 | cut -c1-250; tail -2 $O/step.log | cut -c1-250 ;;
*) echo "error: run.sh takes A, B, C or E" >&2; exit 2 ;;
esac
echo "part $PART done at $(el)s"
