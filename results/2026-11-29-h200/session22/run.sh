#!/bin/bash
# 2026-11-29 (twenty-second session), one H200, from the repository root.
#   bash run.sh a   (no wheelhouse) rope's decode corpus at its serving sites, bf16 and fp16, --neighbours astra: its
#                   Qwen3-32B TP-2 rows (heads only Qwen3 has) now between a q/k-norm stand-in and a KV-store stand-in
#                   (the both-sides site of the twenty-first session, first timed here); then qknorm_rope's decode corpus
#                   at its new site (qkv -> q/k norm + rope -> SGLang's KV store -> attention), bf16 and fp16, and at
#                   bench's generic pair in the same run (bf16), where its standing number is
#   bash run.sh b   (wheelhouse staged first: .whl/wh32, bash e2e/device_install.sh stage .whl/wh32/carry/partNN, one call a
#                   part) Gemma-3-12B decode step A/B at batch 1 and 16: arm A every default op, arm B the same and rope
#                   (where --ops all would run rope: dense_rope_store and qknorm_rope(_store) decline Gemma-3)
# Workspaces extracted on the CPU from the sglang 0.5.17, flashinfer-python 0.6.15.post1 and apache-tvm-ffi 0.1.11 wheels,
# carried as astra-work/ws: bash kernels/dev/workspaces_from_wheels.sh WHEELDIR astra-work/ws rope=jit qknorm_rope=jit
set -uo pipefail
PART=${1:?a or b}
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
*) echo "error: run.sh takes a or b" >&2; exit 2 ;;
esac
