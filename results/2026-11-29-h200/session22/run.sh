#!/bin/bash
# 2026-11-29 (twenty-second session), one H200, from the repository root.
#   bash run.sh a   (no wheelhouse) rope's decode corpus at its serving sites, bf16 and fp16, --neighbours astra: its
#                   Qwen3-32B TP-2 rows (heads only Qwen3 has) now between a q/k-norm stand-in and a KV-store stand-in
#                   (the both-sides site of the twenty-first session, first timed here); then qknorm_rope's decode corpus
#                   at its new site (qkv -> q/k norm + rope -> SGLang's KV store -> attention), bf16 and fp16, and at
#                   bench's generic pair in the same run (bf16), where its standing number is
#   bash run.sh b   (wheelhouse staged first: .whl/wh32, bash e2e/device_install.sh stage .whl/wh32/carry/partNN, one call a
#                   part) Gemma-3-12B decode step A/B at batch 1 and 16: arm A every default op, arm B the same and rope
#                   (where --ops all would run rope: dense_rope_store and qknorm_rope(_store) decline Gemma-3). Outcome:
#                   rope is never called there (Gemma3Attention.forward_native rotates with torch ops), so the two arms ran
#                   the same kernels; the run measured the process effect of one process per arm
#   bash run.sh c   (wheelhouse staged) gemma_qknorm_rope (new today: Gemma-3's q/k norm + rope, about twenty torch launches
#                   a layer in one kernel) against SGLang's installed torch sequence: extract (installed variant), check
#                   bf16 + fp16, the decode corpus in context (--neighbours astra) and the prefill corpus chained, bf16 +
#                   fp16; validate in SGLang 0.5.17's Gemma3Attention.forward_native
#                   (first run: production's sequence was handed the harness's [tokens, stride] rows, and a 1-token case
#                   could draw position 0, an all-zero sin row: fixed, then part e)
#   bash run.sh e   (wheelhouse staged) part d, then part c's check (bf16) and decode corpus in context (bf16), in one call
#   bash run.sh d   (wheelhouse staged) Gemma-3-12B decode step A/B at batch 1 and 16: arm A every default op but
#                   gemma_qknorm_rope, arm B every default op
# Workspaces extracted on the CPU from the sglang 0.5.17, flashinfer-python 0.6.15.post1 and apache-tvm-ffi 0.1.11 wheels,
# carried as astra-work/ws: bash kernels/dev/workspaces_from_wheels.sh WHEELDIR astra-work/ws rope=jit qknorm_rope=jit
set -uo pipefail
PART=${1:?a, b, c, d or e}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
O=/tmp/s22/$PART; mkdir -p $O
export WS=astra-work/ws
LIMIT=${LIMIT:-570}
case $PART in
a)
  RES=$O/sites NEIGHBOURS=astra DTYPES=bf16,fp16 OPS="rope qknorm_rope" DEADLINE=$(( LIMIT - 150 )) \
    bash kernels/gpu_run.sh decode > $O/sites.log 2>&1
  echo "serving sites done at $(el)s"; cut -c1-400 $O/sites/summary.txt
  source kernels/astra_env.sh
  timeout $(( LIMIT - 10 - $(el) )) $AS bench qknorm_rope --workspace $WS/jit/qknorm_rope \
    --candidate kernels/qknorm_rope/kernel.cu --shapes decode --dtype bf16 --replays 8 --neighbours astra --sites generic \
    --no-plot --out $O/generic_qknorm_rope.json > $O/generic_qknorm_rope.log 2>&1
  echo "generic qknorm_rope rc=$? at $(el)s"; grep -E "^geomean|^rows:|in context|error" $O/generic_qknorm_rope.log \
    | cut -c1-300 | tail -4 ;;
b)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  STEP_ARGS="--procs 1 --batch-size 1,16 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O/gemma3 DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh \
    "gemma3-12b-rope:gemma3-12b:$(( LIMIT - 30 - $(el) )):--base-ops=all --ops=all,rope --port=31700" > $O/gemma3.log 2>&1
  echo "step gemma3 done at $(el)s"; tail -6 $O/gemma3.log ;;
c)
  OP=gemma_qknorm_rope
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
  source kernels/astra_env.sh; echo "installed at $(el)s"
  $AS extract $OP --variant installed --arch sm_90 --out $WS/installed --no-build > $O/extract.log 2>&1 \
    || { tail -3 $O/extract.log; exit 1; }
  timeout 150 $AS check $OP --workspace $WS/installed/$OP --candidate kernels/$OP/kernel.cu --dtype bf16,fp16 \
    --json $O/check.json > $O/check.log 2>&1
  echo "check rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)" $O/check.log | head -3
  (cd /tmp && timeout 100 $AS validate --ops $OP --dtypes bf16,fp16 --json $O/validate.json) > $O/validate.log 2>&1
  echo "validate rc=$? at $(el)s: $(tail -1 $O/validate.log)"
  timeout $(( LIMIT - 100 - $(el) )) $AS bench $OP --workspace $WS/installed/$OP --candidate kernels/$OP/kernel.cu \
    --shapes decode --dtype bf16,fp16 --replays 8 --neighbours astra --out $O/decode.json > $O/decode.log 2>&1
  echo "decode rc=$? at $(el)s"; grep -E "^geomean|^rows:|error" $O/decode.log | cut -c1-300 | tail -4
  timeout $(( LIMIT - 10 - $(el) )) $AS bench $OP --workspace $WS/installed/$OP --candidate kernels/$OP/kernel.cu \
    --shapes prefill --dtype bf16,fp16 --no-context --out $O/prefill.json > $O/prefill.log 2>&1
  echo "prefill rc=$? at $(el)s"; grep -E "^geomean|^rows:|error" $O/prefill.log | cut -c1-300 | tail -3 ;;
d)
  bash e2e/device_install.sh ensure > $O/ensure.log 2>&1 || { tail -5 $O/ensure.log; exit 1; }
  echo "installed at $(el)s"
  STEP_ARGS="--procs 1 --batch-size 1,16 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O/gemma3 DEADLINE_S=$(( LIMIT - $(el) )) bash e2e/step_session.sh \
    "gemma3-12b-qknr:gemma3-12b:$(( LIMIT - 30 - $(el) )):--base-ops=all,-gemma_qknorm_rope --ops=all --port=31800" \
    > $O/gemma3.log 2>&1
  echo "step gemma3 done at $(el)s"; tail -6 $O/gemma3.log ;;
e)
  LIMIT=380 bash $0 d; mkdir -p $O; mv /tmp/s22/d $O/d
  OP=gemma_qknorm_rope
  export PYTHONPATH=/tmp/e2e-site TVM_FFI_CACHE_DIR=/tmp/e2e-cache/tvm-ffi TRITON_CACHE_DIR=/tmp/e2e-cache/triton
  source kernels/astra_env.sh
  $AS extract $OP --variant installed --arch sm_90 --out $WS/installed --no-build > $O/extract.log 2>&1 \
    || { tail -3 $O/extract.log; exit 1; }
  timeout 50 $AS check $OP --workspace $WS/installed/$OP --candidate kernels/$OP/kernel.cu --dtype bf16 \
    --json $O/check.json > $O/check.log 2>&1
  echo "check rc=$? at $(el)s"; grep -E "^(PASS|FAIL|error)" $O/check.log | head -3
  timeout $(( ${E_LIMIT:-480} - $(el) )) $AS bench $OP --workspace $WS/installed/$OP --candidate kernels/$OP/kernel.cu \
    --shapes decode --dtype bf16 --replays 8 --neighbours astra --out $O/decode.json > $O/decode.log 2>&1
  echo "decode rc=$? at $(el)s"; grep -E "^geomean|^rows:|error" $O/decode.log | cut -c1-300 | tail -4 ;;
*) echo "error: run.sh takes a, b, c, d or e" >&2; exit 2 ;;
esac
