#!/usr/bin/env bash
# The checkbench GPU run (issue 3): production kernels and bad candidates through `check`, paper shapes
# through `bench`, plus ncu and compute-sanitizer smoke runs. Run from the repository root on a GPU
# machine with pre-extracted workspaces in .cbwork/ (extract --arch sm_90 --out .cbwork, carried along).
set -uo pipefail
OUTDIR=${OUT:-/tmp/checkbench-out}
R=/tmp/checkbench; rm -rf $R; mkdir -p $R/check $OUTDIR
export PYTHONUNBUFFERED=1 ASTRA_CACHE_DIR=/tmp/astra-cache ASTRA_TEST_WORKSPACES=$PWD/.cbwork ASTRA_RESULTS_DIR=$R/check
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

t "setup"
python3 -c "import astra_sglang.kernels" 2>/dev/null || \
  python3 -m pip install -q --no-deps --no-build-isolation -e . >$R/pip.log 2>&1 || true
if ! python3 -c "import astra_sglang.kernels" 2>/dev/null; then  # fall back to a package farm
  F=/tmp/astra_pkg/astra_sglang; mkdir -p $F
  for f in astra_sglang/*; do ln -sf $PWD/$f $F/; done
  ln -sfn $PWD/extract $F/extract; ln -sfn $PWD/kernels $F/kernels; ln -sfn $PWD/patch $F/patch
  export PYTHONPATH=/tmp/astra_pkg${PYTHONPATH:+:$PYTHONPATH}
fi
AS="python3 -m astra_sglang.cli"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader;
  nvcc --version | tail -1; python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)";
  which ncu compute-sanitizer; } > $R/env.txt 2>&1; cat $R/env.txt

t "prebuild"
python3 results/2026-11-21-h200/checkbench/prebuild.py .cbwork 2>&1 | tee $R/prebuild.log | tail -25

t "check: production kernels, bad and good candidates (pytest -m gpu, 2 workers)"
timeout 330 python3 -m pytest -q -m gpu -n 2 -p no:cacheprovider tests/test_check_bad_candidates.py -rA 2>&1 \
  | tee $R/pytest.log | grep -E "PASSED|FAILED|ERROR|passed|failed|error" | tail -30

t "bench: paper shapes fp16+bf16, production vs the shipped kernel"
for op in silu_and_mul fused_add_rmsnorm merge_state; do
  cand=kernels/$op/kernel.cu; c=(); [ -f $cand ] && c=(--candidate $cand)
  timeout 150 $AS bench $op --workspace .cbwork/$op "${c[@]}" --shapes paper --dtype fp16,bf16 --replays 30 \
    --out $R/bench_$op.json 2>$R/bench_$op.err | tee $R/bench_$op.txt
  tail -3 $R/bench_$op.err
done
t "bench: A/A (production against itself) for the noise flag"
timeout 100 $AS bench silu_and_mul --workspace .cbwork/silu_and_mul --candidate .cbwork/silu_and_mul/baseline.cu \
  --shapes paper --dtype fp16 --replays 30 --out $R/bench_silu_and_mul_AA.json 2>$R/bench_AA.err | tee $R/bench_AA.txt

t "ncu on one shape"
timeout 120 $AS bench silu_and_mul --workspace .cbwork/silu_and_mul --candidate tests/bad_candidates/ok_silu_simple.cu \
  --shapes 64x8192 --dtype fp16 --replays 5 --ncu --no-plot --out $R/ncu_silu.json 2>$R/ncu.err | tail -4; tail -3 $R/ncu.err

t "compute-sanitizer: a correct candidate (0 errors) and a write past the end (memcheck must see it)"
timeout 150 $AS check silu_and_mul --workspace .cbwork/silu_and_mul --candidate tests/bad_candidates/ok_silu_simple.cu \
  --shapes 16x4096 --dtype fp16 --sanitize --json $R/check/sanitize_ok_silu.json -v 2>$R/sanitize.err | tail -4
timeout 120 python3 - <<'PY' 2>&1 | tee $R/sanitize_bad.txt
import json
from pathlib import Path
from astra_sglang.check import sanitize_run
from astra_sglang.registry import get_op
from astra_sglang.workspace import Workspace
ws = Workspace.open("silu_and_mul", path=Path(".cbwork/silu_and_mul"))
b = ws.build(Path("tests/bad_candidates/silu_write_past_end.cu"))
r = sanitize_run(get_op("silu_and_mul"), ws, f"lib:{b.library}", "memcheck", ["fp16"], 1, timeout=100)
print("memcheck on silu_write_past_end:", r["ok"], r["summary"], r["reason"])
Path("/tmp/checkbench/check/sanitize_bad_silu_write_past_end.json").write_text(json.dumps(r, indent=1))
PY

t "summary"
python3 results/2026-11-21-h200/checkbench/summarize.py $R > $R/SUMMARY.md; cat $R/SUMMARY.md | head -80
tar czf $OUTDIR/checkbench.tar.gz -C /tmp checkbench
cp $R/SUMMARY.md $R/pytest.log $OUTDIR/ 2>/dev/null
t "done"
