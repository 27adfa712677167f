"""Activation inside SGLang's own processes, from the environment the CLI (or the Python
API with propagate=True) sets.

Two ways in, both idempotent, both inert unless ASTRA_SGLANG_OPS is set:
- SGLang's general-plugin entry point (group "sglang.srt.plugins", in 0.5.17 and 0.5.23):
  `load_plugins()` runs at the start of every scheduler/TP-worker process (and in the
  engine and detokenizer), before the model is loaded, CUDA graphs are captured or
  torch.compile runs. pyproject.toml registers `sglang_plugin` below.
- the start-up hook patch/_startup/sitecustomize.py, for installs where the entry point
  is not registered (astra_sglang only on PYTHONPATH, or SGLANG_PLUGINS excluding it):
  on a directory put first on PYTHONPATH, it activates as soon as `sglang` is imported,
  in every Python process of the server (spawned ones start with the same environment;
  forked ones inherit the patched modules).
"""
from __future__ import annotations

import logging
import os
import sys

from . import config as _cfg

log = logging.getLogger("astra_sglang.patch")


def activate_from_env(source: str = "environment"):
    """Apply the patch described by ASTRA_SGLANG_* in this process, once. Never raises:
    a failure is printed loudly and SGLang runs unpatched."""
    from . import active_patcher, apply_astra_kernels, patchable_ops

    if _cfg.disabled() or not os.environ.get(_cfg.ENV_OPS):
        return None
    p = active_patcher()
    if p is not None:
        return p
    try:
        cfg = _cfg.PatchConfig.from_env(patchable_ops())
        if not cfg.ops:
            return None
        p = apply_astra_kernels(
            cfg.ops,
            candidates=cfg.candidates,
            libs=cfg.libs,
            self_check=cfg.self_check,
            counter_dir=cfg.counter_dir,
            plan=cfg.plan,
            propagate=False,
            strict=False,
        )
        log.info("astra-sglang: activated from %s in pid %d", source, os.getpid())
        return p
    except Exception as e:  # never take SGLang down
        print(f"astra-sglang: ERROR activating the patch from {source} in pid {os.getpid()}: {e!r}; "
              "SGLang runs UNPATCHED in this process", file=sys.stderr, flush=True)
        log.exception("astra-sglang activation failed")
        return None


def sglang_plugin() -> None:
    """Entry point for SGLang's `sglang.srt.plugins` group."""
    activate_from_env("sglang plugin")
