#!/usr/bin/env bash
# The MoE ops on one GPU with SGLang installed (issue 15): what kernels/gpu_run.sh cannot do, because
# their production is SGLang's installed callable (moe_router, moe_grouped_router: Triton / JIT) or a
# torch.compile'd path (moe_combine at <= 32 tokens, `--baseline installed`).
#
#   bash kernels/gpu_moe.sh [phases]     phases (comma-separated, default all of them, in this order):
#     router    extract moe_router --variant installed; check; bench --shapes decode; validate
#     grouped   the same for moe_grouped_router (skipped when the op folder is absent)
#     align     check + bench decode of moe_align (int32) against the carried jit workspace, and against
#               SGLang's installed moe_align_block_size (--baseline installed)
#     combine   bench decode of moe_combine against the installed small-batch path (--baseline installed)
#
# Needs: the wheelhouse installed into $SITE (e2e/device_install.sh), the carried workspaces
# ($ALIGN_WS, $COMBINE_WS: default astra-work/gpu_ws/jit/moe_align, astra-work/sgl/moe_combine).
# Each phase has its own time limit ($PHASE_S, default 150 s); the router and combine benches time $DTYPE
# (default bf16, what the gates of Qwen3-MoE and DeepSeek-V3 emit: about 3.5 s a row, and every dtype of
# the router corpus did not fit in 150 s on the H200). Results: $OUT (or ./moe-gpu-out): moe-results.tgz
# (every JSON, plot and log, re-packed after each phase so a time-out keeps what ran) and summary.txt.
# SHAPES_<op> (e.g. SHAPES_moe_router=1x128x8,8x128x8) replaces an op's bench shapes (default: decode; the
# installed routers take about 35 s a row through torch, so one model's rows fit a phase, the corpus does not).
set -uo pipefail
phases=${1:-router,grouped,align,combine}
SITE=${SITE:-/tmp/e2e-site}; PHASE_S=${PHASE_S:-150}; DTYPE=${DTYPE:-bf16}
REPO=$(pwd); RES=${RES:-${OUT:-./moe-gpu-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
ALIGN_WS=$REPO/${ALIGN_WS:-astra-work/gpu_ws/jit/moe_align}; COMBINE_WS=$REPO/${COMBINE_WS:-astra-work/sgl/moe_combine}
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export ASTRA_CACHE_DIR=${ASTRA_CACHE_DIR:-/tmp/e2e-cache/astra} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/e2e-cache/triton}
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/e2e-cache/tvm-ffi}
R=$(mktemp -d /tmp/astra-moe.XXXX); WS=$R/ws; mkdir -p "$WS"
# from outside the checkout: the installed astra_sglang (it maps the patch and e2e packages)
astra() { local t=$1 log=$2; shift 2; (cd "$R" && timeout -s INT -k 20 "$t" python3 -m astra_sglang.cli "$@") \
    > "$R/$log.log" 2>&1; local rc=$?; echo "rc=$rc" >> "$R/$log.log"; return $rc; }
shapes_of() { local v=SHAPES_$1; echo "${!v:-decode}"; }
summary() { echo "$1" | tee -a "$R/summary.txt"; }
line() { grep -E '^(PASS|FAIL|error|geomean|[0-9]+ passed)' "$R/$1.log" | head -2 | tr '\n' ' ' | cut -c1-200; }
installed_op() {    # op: extract its installed variant, check, bench decode, validate
    local op=$1
    astra "$PHASE_S" "extract_$op" extract "$op" --variant installed --out "$WS" --force
    summary "extract $op: $(tail -1 "$R/extract_$op.log") $(line "extract_$op")"
    [ -f "$WS/$op/manifest.json" ] || return 1
    astra "$PHASE_S" "check_$op" check "$op" --workspace "$WS/$op" --candidate "$REPO/kernels/$op/kernel.cu" -v \
        --json "$R/check_$op.json"; summary "check $op: $(line "check_$op")"
    astra "$PHASE_S" "decode_$op" bench "$op" --workspace "$WS/$op" --candidate "$REPO/kernels/$op/kernel.cu" \
        --shapes "$(shapes_of $op)" --dtype "$DTYPE" --out "$R/decode_$op.json"; summary "decode $op: $(line "decode_$op")"
    astra "$PHASE_S" "validate_$op" validate --ops "$op"; summary "validate $op: $(line "validate_$op")"
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD; } \
    | tee "$R/env.txt"
for ph in ${phases//,/ }; do
    echo "=== $(date -u +%T) $ph"
    case $ph in
    router) installed_op moe_router ;;
    grouped)
        if [ -d "$REPO/kernels/moe_grouped_router" ]; then installed_op moe_grouped_router
        else summary "grouped: no kernels/moe_grouped_router (skipped)"; fi ;;
    align)
        astra "$PHASE_S" check_moe_align check moe_align --workspace "$ALIGN_WS" --candidate "$REPO/kernels/moe_align/kernel.cu" \
            --dtype int32 -v; summary "check moe_align: $(line check_moe_align)"
        astra "$PHASE_S" decode_moe_align bench moe_align --workspace "$ALIGN_WS" --candidate "$REPO/kernels/moe_align/kernel.cu" \
            --dtype int32 --shapes "$(shapes_of moe_align)" --out "$R/decode_moe_align.json"; summary "decode moe_align: $(line decode_moe_align)"
        astra "$PHASE_S" decode_moe_align_installed bench moe_align --workspace "$ALIGN_WS" \
            --candidate "$REPO/kernels/moe_align/kernel.cu" --dtype int32 --shapes "$(shapes_of moe_align)" --baseline installed \
            --out "$R/decode_moe_align_installed.json"
        summary "decode moe_align vs installed: $(line decode_moe_align_installed)" ;;
    combine)
        astra "$PHASE_S" decode_moe_combine_installed bench moe_combine --workspace "$COMBINE_WS" \
            --candidate "$REPO/kernels/moe_combine/kernel.cu" --shapes "$(shapes_of moe_combine)" --dtype "$DTYPE" --baseline installed \
            --out "$R/decode_moe_combine_installed.json"
        summary "decode moe_combine vs installed: $(line decode_moe_combine_installed)" ;;
    *) summary "unknown phase $ph (router, grouped, align, combine)" ;;
    esac
    cp "$R/summary.txt" "$RES/summary.txt"
    tar -C "$R" --exclude=ws -czf "$RES/moe-results.tgz" .
done
echo "results in $RES/moe-results.tgz"
