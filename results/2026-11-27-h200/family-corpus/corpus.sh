#!/bin/bash
# 2026-11-27 (H200, sixth session): issue 14's corpus on the current kernels: check, then the decode corpus
# (chained and in context, bf16) of the norm/activation family. Run from the repository root on the GPU machine
# after validate_step.sh (which installed the wheelhouse into /tmp/e2e-site).
set -uo pipefail
[ -d /tmp/e2e-site/sglang ] || { timeout 240 bash e2e/device_install.sh install >/tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 1; }; }
PYTHONPATH=/tmp/e2e-site EXTRACT=1 DTYPES=bf16 DEADLINE=${DEADLINE:-470} RES=$OUT \
  OPS="${OPS:-rmsnorm fused_add_rmsnorm gemma_rmsnorm gemma_fused_add_rmsnorm qknorm silu_and_mul gelu_tanh_and_mul}" \
  bash kernels/gpu_run.sh check,decode > $OUT/run.log 2>&1
echo "rc=$?"; cat $OUT/summary.txt
