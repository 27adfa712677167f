#!/bin/bash
# 2026-11-27 (eighth session), a 2-GPU call: the server A/B at --tp 2 with today's defaults (gate_up_silu takes
# TP > 1: its first GPU run there), as results/2026-11-27-h200x2/server ran it with linear: SGLang unpatched (A)
# against --ops all (B), llama3-70b-20l, dummy weights. From the repository root on the GPU machine:
#   bash c_tp2.sh [ROUNDS] [TIMEOUT]
set -uo pipefail
R=${1:-3}; T=${2:-520}
REPO=$(pwd)
bash e2e/device_install.sh ensure >/dev/null || exit 1
export PYTHONPATH=/tmp/e2e-site ASTRA_CACHE_DIR=/tmp/e2e-cache/astra TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi \
  TRITON_CACHE_DIR=/tmp/e2e-cache/triton PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
cd /tmp
timeout $T python3 -m astra_sglang.cli e2e --tp 2 --model-path $REPO/e2e/configs/llama3-70b-20l --out /tmp/ab-tp2 \
  --ops all --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds $R --max-total-tokens 16384 \
  > $OUT/ab-tp2.log 2>&1; echo "ab-tp2 rc=$?"
tar -C /tmp -czf $OUT/ab-tp2.tar.gz --exclude="*/counters-*" ab-tp2 2>/dev/null
grep -E "^\| (output throughput|TPOT mean)|identical|gate_up_silu: calls" /tmp/ab-tp2/report.md 2>/dev/null \
  | sed 's/.*\(gate_up_silu: calls=[0-9]* captured=[0-9]* fallbacks=[0-9]* checks_passed=[0-9]* checks_failed=[0-9]*\).*/\1/' | head -12
tail -3 $OUT/ab-tp2.log
