#!/bin/bash
# 2026-11-27 (ninth session), call B: rows of up to 512 vectors at one vector per thread (kOne; was up to 256) in the
# four norms' shared row plan. check of the four (bit-identity with FlashInfer's order must hold), fused_add_rmsnorm's
# decode corpus in context for the shipped plan (ONE_MAX 512) against 1024 and the old 256 in one run, then the decode
# corpus of the other three norms. Workspaces extracted on the CPU and carried (as call A).
# From the repository root on the GPU machine:  bash b_norms.sh
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source kernels/astra_env.sh
python3 -c "import libcst" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/mini/*.whl
WS=astra-work/ws O=/tmp/ob
mkdir -p $O/checks $O/var $O/corpus
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; } | tee $O/env.txt
WS=$WS OPS="fused_add_rmsnorm gemma_rmsnorm gemma_fused_add_rmsnorm rmsnorm" RES=$O/checks bash kernels/gpu_run.sh check \
  > $O/checks/run.log 2>&1
echo "checks rc=$? at $(el)s"; cat $O/checks/summary.txt
for op in fused_add_rmsnorm gemma_rmsnorm gemma_fused_add_rmsnorm rmsnorm; do
  tar -xzOf $O/checks/results-check.tgz --wildcards "*check_$op.log" 2>/dev/null | grep -h "bit-identical to production" | head -1 \
    | sed "s/^/$op: /"
done
RES=$O/var timeout $(( 430 - $(el) )) bash kernels/dev/bench_variants.sh fused_add_rmsnorm $WS/flashinfer/fused_add_rmsnorm \
  decode bf16 default= one1024="-DASTRA_ONE_MAX=1024u" old256="-DASTRA_ONE_MAX=256u" > $O/variants.txt 2>&1
echo "variants rc=$? at $(el)s"
WS=$WS OPS="gemma_fused_add_rmsnorm gemma_rmsnorm rmsnorm" DTYPES=bf16 DEADLINE=$(( 500 - $(el) )) RES=$O/corpus \
  bash kernels/gpu_run.sh decode > $O/corpus/run.log 2>&1
echo "corpus rc=$? at $(el)s"; cat $O/corpus/summary.txt
tar -C /tmp -czf $OUT/b_norms.tgz ob
python3 - $O/var <<'PY'
import json, math, sys
res = sys.argv[1]
for name in ("default", "one1024", "old256"):
    try:
        rows = json.load(open(f"{res}/fused_add_rmsnorm_{name}.json"))["rows"]
    except (OSError, ValueError, KeyError):
        print(name, "missing"); continue
    x = [r["context_base_us"] / r["context_cand_us"] for r in rows if r.get("context_base_us") and r.get("context_cand_us")]
    print(f"fused_add_rmsnorm {name}: {len(x)} rows in context, geomean {math.exp(sum(map(math.log, x)) / len(x)):.3f}x, min {min(x):.3f}x")
PY
grep -A40 "# in context" $O/variants.txt | head -34
