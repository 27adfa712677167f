#!/usr/bin/env bash
# The decode-step A/B's noise floor on one GPU, then an A/B measured against it:
#   1. A/A: two unpatched arms, $PROCS worker processes each (no profile);
#   2. A/B: --ops all against unpatched, same processes per arm, with the A/A run's CI half-widths as
#      the noise floor (--aa-floor), profiled after the timed rounds;
# then one short table (Δ, 95% CI, ±, floor, verdict). Llama-3-8B shape, batch 1 and 32 by default.
# From the repo root on the GPU node, wheelhouse staged (e2e/device_install.sh stage PART, per part):
#   bash e2e/step_noise.sh            # installs first; INSTALL= to skip; results in $OUT (or ./step-gpu-out)
# Budget: $DEADLINE_S (default 560 s) for the whole call; each run's own limit is cut to fit.
set -uo pipefail
MODEL=${MODEL:-llama3-8b}; PROCS=${PROCS:-3}
AA_S=${AA_S:-230}; AB_S=${AB_S:-290}
export STEP_ARGS=${STEP_ARGS:---batch-size 1,32 --input-len 256 --output-len 32 --rounds 12 --warmup-rounds 1 \
--skip-steps 3 --procs $PROCS --profile-steps 10}
export PYTHONPATH=${SITE:-/tmp/e2e-site}${PYTHONPATH:+:$PYTHONPATH}     # astra_sglang as installed there
T0=$(date +%s); DEADLINE_S=${DEADLINE_S:-560}
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
gpu_state() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
    --format=csv,noheader 2>/dev/null | sed "s/^/  gpu ($1): /"; }
if [ -n "${INSTALL-install}" ]; then bash e2e/step_session.sh install || exit 1; fi
gpu_state start
# the patched arm's kernels, built (cached) while the A/A runs: B's workers start that much sooner
export ASTRA_CACHE_DIR=${ASTRA_CACHE_DIR:-/tmp/e2e-cache/astra}
(cd /tmp && timeout 240 nice -n 19 python3 -c "
from astra_sglang.patch import patchable_ops
from astra_sglang.patch.apply import build_kernel
for op in patchable_ops():
    try:
        build_kernel(op)
    except Exception as e:
        print('prebuild', op, e)
" > /tmp/astra-prebuild.log 2>&1) &
PREBUILD=$!
DEADLINE_S=$(left) bash e2e/step_session.sh "aa:$MODEL:$AA_S:--aa --no-profile"
rc=$?
wait $PREBUILD; tail -3 /tmp/astra-prebuild.log
AA=/tmp/step-runs/step-aa/summary.json
gpu_state "after A/A"
if [ -f "$AA" ]; then FLOOR="--aa-floor $AA"; else FLOOR=""; echo "no A/A summary: the A/B runs without a floor"; fi
DEADLINE_S=$(left) bash e2e/step_session.sh "ab:$MODEL:$AB_S:$FLOOR" || rc=1
gpu_state end
echo "=== A/A then A/B ($MODEL, $PROCS processes per arm)"
(cd /tmp/step-runs && python3 -m astra_sglang.e2e.step_stats A/A=step-aa A/B=step-ab) | tee "${OUT:-./step-gpu-out}/step-noise-table.txt"
exit $rc
