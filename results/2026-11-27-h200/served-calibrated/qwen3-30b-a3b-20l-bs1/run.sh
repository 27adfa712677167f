#!/bin/bash
# 2026-11-27e: qwen3-30b-a3b-20l at batch 1 again, 12 rounds (5 rounds were too noisy to resolve), bs1 only:
#   bash ../run.sh qwen3-30b-a3b-20l "bs1:8:128:128:1" 12 330
