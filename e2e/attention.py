"""The attention backend e2e's servers and step workers run.

Without --attention-backend, SGLang picks its own for the GPU and model: FA3 on Hopper, for dense and MLA models
alike (server_args.py `_get_default_attn_backend`, 0.5.17), which loads sgl_kernel's flash_ops library. The offline
wheelhouse (e2e/build_wheelhouse.py) trims that 1 GB library, so a server started from it needs another backend,
and e2e used to pass triton always. `auto` (the default) passes triton only where flash_ops is missing and nothing
otherwise, so an A/B runs the attention the user's own server runs; a backend name is passed as given.
"""
from __future__ import annotations

import subprocess
from typing import List, Optional, Sequence, Tuple

AUTO = "auto"
FALLBACK = "triton"

# run by the servers' Python: is sgl_kernel's FA3 library there? (found without importing sgl_kernel, which loads CUDA)
_PROBE = ("import importlib.util, pathlib, sys\n"
          "s = importlib.util.find_spec('sgl_kernel')\n"
          "sys.exit(0 if s and s.origin and any(pathlib.Path(s.origin).parent.glob('flash_ops*.so')) else 1)\n")


def has_fa3(python: str, timeout: float = 60.0) -> bool:
    """Whether `python`'s sgl_kernel ships flash_ops, the FA3 library SGLang's Hopper default needs."""
    try:
        return subprocess.run([python, "-c", _PROBE], capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def named_in(server_args: Sequence[str]) -> Optional[str]:
    """The backend a launch_server argument list names itself (`--attention-backend X` or `=X`; the last wins, as in
    SGLang's argparse), or None."""
    found = None
    for i, a in enumerate(server_args):
        if a == "--attention-backend" and i + 1 < len(server_args):
            found = server_args[i + 1]
        elif a.startswith("--attention-backend="):
            found = a.split("=", 1)[1]
    return found


def attention_flags(choice: str, python: str, server_args: Sequence[str] = ()) -> Tuple[List[str], str]:
    """(launch_server flags, the line a report shows) for --attention-backend CHOICE, the servers running `python`;
    a backend the user's own server arguments name (e2e's --server-arg) is the one that runs and the one reported."""
    own = named_in(server_args)
    if own is not None:
        return [], f"{own} (--server-arg)"
    choice = (choice or AUTO).strip()
    if choice != AUTO:
        return ["--attention-backend", choice], choice
    if has_fa3(python):
        return [], "SGLang's default for the GPU and model (fa3 on Hopper)"
    return ["--attention-backend", FALLBACK], (f"{FALLBACK} (auto: this sgl_kernel has no FA3 library, as in the "
                                               "trimmed offline wheelhouse)")
