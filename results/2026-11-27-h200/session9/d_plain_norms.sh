#!/bin/bash
# 2026-11-27 (ninth session), call D: does one vector per thread up to 1024 vectors (as the fused norms now ship) help
# rmsnorm and gemma_rmsnorm too? Decode corpus in context, shipped (256) against ASTRA_ONE_MAX 1024, in one run each.
# From the repository root on the GPU machine:  bash d_plain_norms.sh
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
source kernels/astra_env.sh
python3 -c "import libcst" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/mini/*.whl
WS=astra-work/ws O=/tmp/od
mkdir -p $O/var
for op in gemma_rmsnorm rmsnorm; do
  RES=$O/var timeout $(( 290 - $(el) )) bash kernels/dev/bench_variants.sh $op $WS/flashinfer/$op decode bf16 default= \
    one1024="-DASTRA_ONE_MAX=1024u" > $O/variants_$op.txt 2>&1; echo "$op variants rc=$? at $(el)s"
done
tar -C /tmp -czf $OUT/d_plain_norms.tgz od
python3 - $O/var <<'PY'
import json, math, sys
for op in ("gemma_rmsnorm", "rmsnorm"):
    for name in ("default", "one1024"):
        try:
            rows = json.load(open(f"{sys.argv[1]}/{op}_{name}.json"))["rows"]
        except (OSError, ValueError, KeyError):
            print(op, name, "missing"); continue
        x = [r["context_base_us"] / r["context_cand_us"] for r in rows if r.get("context_base_us") and r.get("context_cand_us")]
        print(f"{op} {name}: {len(x)} rows in context, geomean {math.exp(sum(map(math.log, x)) / len(x)):.3f}x, min {min(x):.3f}x")
PY
