#!/usr/bin/env bash
# Tensor parallel on a multi-GPU node (issue 19), in phases, from the repo root, wheelhouse staged
# (e2e/device_install.sh stage PART, per part):
#   bash e2e/tp_session.sh [install] [step] [drill] [validate]
#   install   the wheelhouse into $SITE (e2e/device_install.sh)
#   step      decode-step A/B with --tp $TP on $STEP_MODEL (both arms resident: the 20-layer 70B shape),
#             per-rank counters and ids, each rank profiled (e2e/step_session.sh)
#   drill     three `--tp $TP` servers of $DRILL_MODEL: unpatched, patched (+ profile --url per rank),
#             patched with one rank's self-check forced to fail (e2e/tp_drill.py)
#   validate  astra-sglang validate on the 70B's per-rank widths at TP 2, in SGLang's own layers
# Results in $OUT (or ./tp-gpu-out): step-tp.tar.gz, tp-drill.tar.gz, validate-tp.log.
# NVLink multicast stays off in every process (KINDS.md).
set -uo pipefail
TP=${TP:-2}; STEP_MODEL=${STEP_MODEL:-llama3-70b-20l}; DRILL_MODEL=${DRILL_MODEL:-llama3-70b}
SITE=${SITE:-/tmp/e2e-site}
RES=${RES:-${OUT:-./tp-gpu-out}}; mkdir -p "$RES"; RES=$(cd "$RES" && pwd)
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/e2e-cache/tvm-ffi} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/e2e-cache/triton}
export ASTRA_CACHE_DIR=${ASTRA_CACHE_DIR:-/tmp/e2e-cache/astra}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RUNS=/tmp/tp-runs; mkdir -p "$RUNS"
ts() { date -u +%H:%M:%S; }
status=0
for ph in "$@"; do
    echo "=== $(ts) $ph"
    case $ph in
    install)
        timeout 300 bash e2e/device_install.sh install /tmp/e2e-wheels "$SITE" || { echo "install failed"; exit 1; }
        nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader ;;
    step)
        STEP_ARGS=${STEP_ARGS:-"--tp $TP --procs 1 --batch-size 1,8,32 --input-len 256 --output-len 32 --rounds 8 \
--warmup-rounds 1 --skip-steps 3 --profile-steps 10"} RES=$RES \
            bash e2e/step_session.sh "tp:$STEP_MODEL:${STEP_S:-330}:" || status=1 ;;
    drill)
        (cd "$RUNS" && timeout -s INT -k 30 "${DRILL_S:-540}" python3 -m astra_sglang.e2e.tp_drill \
            --model-path "$DRILL_MODEL" --tp "$TP" --arms "${ARMS:-B,C,A}" --out "$RUNS/drill" 2>&1) \
            | tee "$RUNS/drill.log" | grep -v "^\s*$" | tail -60 || status=1
        cp "$RUNS/drill.log" "$RUNS/drill/console.log" 2>/dev/null
        tar -C "$RUNS" --exclude="drill/*/run" -czf "$RES/tp-drill.tar.gz" drill 2>/dev/null ;;
    validate)
        # Llama-3-70B at TP 2: norms over hidden 8192 (not sharded), SiLU over 28672 / 2 = 14336 per rank
        (cd "$RUNS" && timeout "${VALIDATE_S:-240}" python3 -m astra_sglang.cli validate --ops silu_and_mul,fused_add_rmsnorm,rmsnorm \
            --dtypes bf16 --shapes "${VALIDATE_SHAPES:-1x8192,8x8192,64x8192,1x14336,8x14336,64x14336}" 2>&1) \
            | tee "$RES/validate-tp.log" | tail -30 || status=1 ;;
    *) echo "unknown phase $ph (install, step, drill, validate)"; status=2 ;;
    esac
done
echo "=== $(ts) done (status $status)"
exit $status
