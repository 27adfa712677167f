#!/bin/bash
# 2026-11-28 (eleventh session): gemma_post_attention_norms in SGLang 0.5.17 itself. The wheelhouse is staged first
# (python3 e2e/build_wheelhouse.py --out .whl/wh27 --chunk-mib auto --lock e2e/wheelhouse/lock.txt on the CPU; one
# device call per part: bash e2e/device_install.sh stage .whl/wh27/carry/partNN). From the repository root:
#   bash b_serve.sh validate   install, then `astra-sglang validate` of the op in SGLang's own Gemma2DecoderLayer
#   bash b_serve.sh step       the decode-step A/B on Gemma-2-9B (dummy weights): everything on by default (base)
#                              against that plus the op; greedy tokens compared
set -uo pipefail
PART=${1:?validate or step}
O=/tmp/s11/$PART; mkdir -p $O
bash e2e/device_install.sh ensure || exit 1
export PYTHONPATH=/tmp/e2e-site PYTHONUNBUFFERED=1
if [ "$PART" = validate ]; then
  (cd /tmp && timeout -s INT -k 20 400 python3 -m astra_sglang.cli validate --ops gemma_post_attention_norms \
    --dtypes bf16,fp16 --json $O/validate.json) 2>&1 | tee $O/validate.log | tail -25
else
  STEP_ARGS="--procs 1 --batch-size 1,2 --input-len 256 --output-len 32 --rounds 4 --warmup-rounds 1 --skip-steps 3 \
--profile-steps 10 --mem-fraction-static 0.5" RES=$O DEADLINE_S=540 \
    bash e2e/step_session.sh 'gemma2-9b:gemma2-9b:420:--base-ops=all --ops=all,gemma_post_attention_norms' \
    > $O/step.log 2>&1
  tail -30 $O/step.log
fi
tar -C /tmp/s11 -cJf $OUT/$PART.tar.xz $PART
