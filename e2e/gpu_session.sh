#!/usr/bin/env bash
# One GPU session, in phases (comma-separated), run from the repo root on the GPU node:
#   install   wheelhouse in $WHEELS -> $SITE (e2e/device_install.sh)
#   smoke     plain sglang.launch_server, small config, one token-id request (e2e/smoke.py)
#   ab        astra-sglang e2e on $AB_MODEL (an e2e/configs name, default llama3-8b): baseline vs patched
#             (the serving proof of results/2026-11-27-h200 §7: AB_MODEL=qwen3-8b AB_ARGS="--ops all --calibrate
#             --workload bs1:8:128:128:1 --workload c4:16:128:128:4 --rounds 5 --max-total-tokens 16384")
#   validate  astra-sglang validate (SGLang's layers with and without the patch); $VALIDATE_ARGS narrows it: every
#             op in fp16 and bf16 outgrows one call (7 ops in bf16 took 224 s on the H200, 2026-11-27)
# Results go to $RES (default $OUT or ./e2e-gpu-out). Each phase has its own time limit.
set -uo pipefail
phases=${1:-install,smoke,ab,validate}
WHEELS=${WHEELS:-/tmp/e2e-wheels}; SITE=${SITE:-/tmp/e2e-site}
RES=${RES:-${OUT:-./e2e-gpu-out}}; mkdir -p "$RES"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/e2e-cache/tvm-ffi} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/e2e-cache/triton}
export ASTRA_SGLANG_CACHE=${ASTRA_SGLANG_CACHE:-/tmp/e2e-cache/astra}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOGS=/tmp/e2e-logs; mkdir -p "$LOGS"
REPO=$(pwd); RES=$(cd "$RES" && pwd)
# astra-sglang commands run from $LOGS: in the checkout, ./astra_sglang would shadow the installed
# package, which alone maps astra_sglang.patch.
astra() { local t=$1; shift; (cd "$LOGS" && timeout -s INT -k 30 "$t" python3 -m astra_sglang.cli "$@"); }
AB_ARGS=${AB_ARGS:-}; VALIDATE_ARGS=${VALIDATE_ARGS:-}
ts() { date -u +%H:%M:%S; }
status=0
for ph in ${phases//,/ }; do
    echo "=== $(ts) phase $ph"
    case $ph in
    install)
        # a warm machine of back-to-back device calls keeps /tmp: install once
        if [ -d "$SITE/sglang" ]; then bash e2e/device_install.sh astra "$SITE"; continue; fi
        timeout 240 bash e2e/device_install.sh install "$WHEELS" "$SITE" || { echo "install failed"; exit 1; }
        (cd "$LOGS" && python3 -c "import torch, sglang, sgl_kernel; print('torch', torch.__version__, 'sglang', sglang.__version__, torch.cuda.get_device_name())") 2>&1 | tail -3
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
        ;;
    smoke)
        timeout -s INT -k 20 ${SMOKE_TIMEOUT:-300} python3 e2e/smoke.py --log "$LOGS/smoke-server.log" \
            --timeout $(( ${SMOKE_TIMEOUT:-300} - 30 )) || status=1
        ;;
    ab)
        astra ${AB_TIMEOUT:-560} e2e --model-path "$REPO/e2e/configs/${AB_MODEL:-llama3-8b}" --out "$LOGS/ab" $AB_ARGS 2>&1 \
            | tee "$LOGS/ab.log" || status=1
        for f in results.json report.md ab.png summary.json summary-aa.json aa.png; do [ -f "$LOGS/ab/$f" ] && cp "$LOGS/ab/$f" "$RES/"; done
        ;;
    validate)
        astra ${VALIDATE_TIMEOUT:-540} validate $VALIDATE_ARGS 2>&1 | tee "$LOGS/validate.log" || status=1
        ;;
    *) echo "unknown phase $ph"; status=2 ;;
    esac
done
tar -C "$LOGS" -czf "$RES/logs.tar.gz" . 2>/dev/null
echo "=== $(ts) done (status $status)"
exit $status
