#!/bin/bash
# 2026-11-27 (ninth session), call C: the fused norms ship ASTRA_ONE_MAX 1024 (every row of <= 1024 vectors at one vector
# per thread). check of fused_add_rmsnorm and gemma_fused_add_rmsnorm as shipped, then gemma_fused_add_rmsnorm's decode
# corpus in context, shipped against the old plan (256) in one run. Workspaces extracted on the CPU and carried.
# From the repository root on the GPU machine:  bash c_gemma_farn.sh
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source kernels/astra_env.sh
python3 -c "import libcst" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/mini/*.whl
WS=astra-work/ws O=/tmp/oc
mkdir -p $O/checks $O/var
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; } | tee $O/env.txt
WS=$WS OPS="fused_add_rmsnorm gemma_fused_add_rmsnorm" RES=$O/checks bash kernels/gpu_run.sh check > $O/checks/run.log 2>&1
echo "checks rc=$? at $(el)s"; cat $O/checks/summary.txt
for op in fused_add_rmsnorm gemma_fused_add_rmsnorm; do
  tar -xzOf $O/checks/results-check.tgz --wildcards "*check_$op.log" 2>/dev/null | grep -h "bit-identical to production" | head -1 \
    | sed "s/^/$op: /"
done
RES=$O/var timeout $(( 280 - $(el) )) bash kernels/dev/bench_variants.sh gemma_fused_add_rmsnorm \
  $WS/flashinfer/gemma_fused_add_rmsnorm decode bf16 default= old256="-DASTRA_ONE_MAX=256u" > $O/variants.txt 2>&1
echo "variants rc=$? at $(el)s"
tar -C /tmp -czf $OUT/c_gemma_farn.tgz oc
python3 - $O/var <<'PY'
import json, math, sys
for name in ("default", "old256"):
    try:
        rows = json.load(open(f"{sys.argv[1]}/gemma_fused_add_rmsnorm_{name}.json"))["rows"]
    except (OSError, ValueError, KeyError):
        print(name, "missing"); continue
    x = [r["context_base_us"] / r["context_cand_us"] for r in rows if r.get("context_base_us") and r.get("context_cand_us")]
    print(f"gemma_fused_add_rmsnorm {name}: {len(x)} rows in context, geomean {math.exp(sum(map(math.log, x)) / len(x)):.3f}x, min {min(x):.3f}x")
PY
grep -A20 "# in context" $O/variants.txt | head -20
