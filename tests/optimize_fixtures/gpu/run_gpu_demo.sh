#!/usr/bin/env bash
# GPU demo of `astra-sglang optimize` (issue 4): 5 rounds on silu_and_mul, the scripted model feeding
# this folder's CUDA candidates (one that does not compile, one wrong, one slower, one faster, one the
# static checks reject) through the real compile / check / bench path. Recorded in results/2026-11-22-h200/optimize/README.md.
#
# Run from the repository root on a GPU machine, with
#   WS  an extracted workspace (default .optwork/silu_and_mul, made on any machine with
#       `astra-sglang extract silu_and_mul --arch sm_90 --out .optwork`),
#   .optwhl/  wheels of openai-agents and its dependencies for the machine's Python, where the SDK is
#       not installed (e.g. `pip download --only-binary=:all: --python-version 3.12 -d .optwhl
#       openai-agents==0.4.0 openai==2.8.0`).
# Writes the run's log, report (md, json, png), best kernel and terminal output to $OUT.
set -uo pipefail
WS=${WS:-.optwork/silu_and_mul}
OUTDIR=${OUT:-/tmp/optimize-gpu-out}
RUN=${RUN:-/tmp/optimize-gpu-run}
FX=tests/optimize_fixtures/gpu
mkdir -p "$OUTDIR"
rm -rf "$RUN"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*" >&2; }

t "setup"
if ! python3 -c "import agents" 2>/dev/null && [ -d .optwhl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/optsite .optwhl/*.whl \
    && export PYTHONPATH=/tmp/optsite${PYTHONPATH:+:$PYTHONPATH}
fi
source kernels/astra_env.sh   # a plain editable install of the checkout
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  python3 -c "import sys, torch, agents, openai; from importlib.metadata import version as v
print('python', sys.version.split()[0], 'torch', torch.__version__, 'openai-agents', v('openai-agents'), 'openai', openai.__version__)"
} >&2

t "prebuild (parallel nvcc; the loop then finds every build in the workspace's cache)"
python3 - "$WS" "$RUN/prebuild" <<'PY' >&2
import shutil, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from astra_sglang.harness.timer import build_helpers
from astra_sglang.build.workspace import Workspace
ws = Workspace.open("silu_and_mul", path=Path(sys.argv[1]))
d = Path(sys.argv[2]); d.mkdir(parents=True, exist_ok=True)
fx = Path("tests/optimize_fixtures/gpu")
# the loop writes round r's candidate as candidates/rNN.cu; same text + same stem = a cache hit
srcs = {"r00.cu": ws.baseline, "r02.cu": fx / "r2_wrong.cu", "r03.cu": fx / "r3_slower.cu", "r04.cu": fx / "r4_faster.cu"}
jobs = [None]
for name, src in srcs.items():
    shutil.copy(src, d / name)
    jobs.append(d / name)
with ThreadPoolExecutor(8) as ex:
    for job, r in zip(jobs, ex.map(ws.build, jobs)):
        print("build", job.name if job else "baseline", "ok" if r.ok else "FAIL", f"{r.seconds:.1f}s")
build_helpers(ws.manifest.get("arch", "sm_90"))
PY

t "optimize"
timeout 420 python3 -m astra_sglang.cli optimize silu_and_mul --workspace "$WS" \
  --model "scripted:$FX/script.json" --rounds 5 --max-fixes 1 \
  --shapes paper --dtypes fp16 --replays 20 --final-shapes corpus+edge --run-dir "$RUN" \
  > >(tee "$OUTDIR/optimize.out") 2> >(tee "$OUTDIR/optimize.err" >&2)
rc=$?
sleep 1
t "optimize exit $rc"
for f in log.jsonl report.md report.json report.png best.cu; do
  [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUTDIR/"
done
exit $rc
