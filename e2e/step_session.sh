#!/usr/bin/env bash
# Decode-step A/B runs on the GPU node, one per model, each under its own time limit; each run's
# output dir (traces, report, plots; not the generated model dir) is packed into
# $OUT/step-<name>.tar.gz as soon as it ends, so a later time-out loses nothing earlier.
#
#   bash e2e/step_session.sh [install] NAME:CONFIG:SECONDS:EXTRA_ARGS ...
# e.g.
#   bash e2e/step_session.sh install 'llama3-8b:llama3-8b:240:--calibrate' 'qwen3-30b-a3b:qwen3-30b-a3b:240:'
# Common arguments for every run: $STEP_ARGS (default below). Wheelhouse: see e2e/README.md.
# A run cut off by its limit keeps its results.json; its report is rebuilt from it (--analyze).
# At the end: one short table of every run's Δ, CI, noise floor and verdict.
set -uo pipefail
WHEELS=${WHEELS:-/tmp/e2e-wheels}; SITE=${SITE:-/tmp/e2e-site}
RES=${RES:-${OUT:-./step-gpu-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/e2e-cache/tvm-ffi} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/e2e-cache/triton}
export ASTRA_CACHE_DIR=${ASTRA_CACHE_DIR:-/tmp/e2e-cache/astra}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEP_ARGS=${STEP_ARGS:---batch-size 1,8,32,64 --input-len 256 --output-len 32 --rounds 6 --profile-steps 10}
REPO=$(pwd); RUNS=/tmp/step-runs; mkdir -p "$RUNS"
export ASTRA_SGLANG_RESULTS=${ASTRA_SGLANG_RESULTS:-$REPO/results}   # bench JSONs: the profile's speedups
# $DEADLINE_S: seconds from now by which every run must have ended (a run's limit is cut to fit)
T_END=$(( $(date +%s) + ${DEADLINE_S:-100000} ))
ts() { date -u +%H:%M:%S; }
if [ "${1:-}" = install ]; then
    shift
    echo "=== $(ts) install"
    timeout 300 bash e2e/device_install.sh install "$WHEELS" "$SITE" || { echo "install failed"; exit 1; }
    (cd "$RUNS" && python3 -c "import torch, sglang; print('torch', torch.__version__, 'sglang', sglang.__version__, torch.cuda.get_device_name())") 2>&1 | tail -2
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv,noheader
fi
status=0; tables=""
for spec in "$@"; do
    IFS=: read -r name cfg secs extra <<<"$spec"
    out=$RUNS/step-$name
    left=$(( T_END - $(date +%s) - 20 ))
    [ "$left" -lt "$secs" ] && secs=$left
    [ "$secs" -lt 60 ] && { echo "=== $(ts) $name skipped: ${secs}s left before the deadline"; status=1; continue; }
    echo "=== $(ts) $name ($cfg, ${secs}s): astra-sglang e2e --step --model-path $cfg --ops all $STEP_ARGS $extra"
    # run from outside the checkout: ./astra_sglang would shadow the installed package
    (cd "$RUNS" && timeout -s INT -k 30 "$secs" python3 -m astra_sglang.cli e2e --step --model-path "$cfg" \
        --ops all $STEP_ARGS $extra --out "$out" 2>&1) | tee "$RUNS/$name.log" | grep -v "^\s*$" | tail -40 || status=1
    cp "$RUNS/$name.log" "$out/console.log" 2>/dev/null
    if [ ! -f "$out/summary.json" ] && [ -f "$out/results.json" ]; then
        echo "=== $(ts) $name: no report (cut off?); rebuilding it from results.json"
        floor=$(sed -n 's/.*--aa-floor[ =]\([^ ]*\).*/\1/p' <<<"$extra")
        (cd "$RUNS" && timeout 120 python3 -m astra_sglang.cli e2e --step --analyze "$out/results.json" --out "$out" \
            ${floor:+--aa-floor "$floor"} > "$out/analyze.log" 2>&1) || status=1
    fi
    tar -C "$RUNS" --exclude="step-$name/model" --exclude="step-$name/run" -czf "$RES/step-$name.tar.gz" "step-$name" 2>/dev/null
    ls -la "$RES/step-$name.tar.gz"
    [ -f "$out/report.md" ] && sed -n '/^| base/,/^$/p' "$out/report.md" | head -14
    tables="$tables $name=$out"
done
echo "=== $(ts) summary (Δ of the GPU decode step; floor = A/A CI half-width)"
[ -n "${tables:-}" ] && (cd "$RUNS" && python3 -m astra_sglang.e2e.step_stats $tables) | tee "$RES/step-table.txt"
echo "=== $(ts) done (status $status)"
exit $status
