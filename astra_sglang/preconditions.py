"""What a command needs, checked up front: every missing piece named at once, before anything
is written, downloaded or launched.

    require("gpu", "cuda_torch")             # check / bench
    require("nvcc", sources_need)            # extract: a callable returning None or the problem(s)

`require` raises one AstraError with one `error:` line per missing piece (exit 2). Names are
the keys of CHECKS; a callable need returns None (satisfied), a message, or a list of messages.
Each check is cheap and side-effect free: nothing here imports sglang (its __init__ pulls in
CUDA), and torch is imported only when a torch-related need is asked for.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Union

from .errors import AstraError

Problem = Optional[Union[str, Sequence[str]]]
Need = Union[str, Callable[[], Problem]]

# Where the README tells a new user how to get each piece (kept in one place).
TORCH_HINT = "see README \"Set up\" (`pip install -e \".[test,torch]\"`), or use the torch your SGLang install brings"


def _torch():
    """The torch module, or None when it does not import (any error: a broken install counts as none)."""
    try:
        import torch  # noqa: F401

        return torch
    except Exception:
        return None


def check_torch() -> Problem:
    if _torch() is None:
        return f"torch is not installed in this Python ({sys.executable}): {TORCH_HINT}"
    return None


def check_cuda_torch() -> Problem:
    torch = _torch()
    if torch is None:
        return check_torch()
    if getattr(torch.version, "cuda", None) is None:
        return (f"torch {torch.__version__} is a CPU-only build: this command needs a CUDA build of torch "
                "(the one SGLang installs, or `pip install torch` on a GPU machine)")
    return None


def _nvidia_smi_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (subprocess.SubprocessError, OSError):
        return 0
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def check_gpu() -> Problem:
    # A CUDA torch answers for the devices this process can use (CUDA_VISIBLE_DEVICES included);
    # without one, nvidia-smi says whether a GPU is there at all.
    torch = _torch()
    if torch is not None and getattr(torch.version, "cuda", None) is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return None
        except Exception:
            pass
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "no NVIDIA GPU visible to torch" + (f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else "") \
            + ": run it on a machine with a GPU"
    if _nvidia_smi_gpus() == 0:
        return "no NVIDIA GPU found (nvidia-smi lists none): run it on a machine with a GPU"
    return None


def check_sglang() -> Problem:
    try:
        found = importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return (f"SGLang is not installed in this Python ({sys.executable}): `pip install sglang` "
                "(its version pins torch: see README)")
    return None


def check_nvcc() -> Problem:
    from .build import find_nvcc

    try:
        find_nvcc()
    except AstraError as e:
        return list(e.messages)
    return None


def check_pip() -> Problem:
    try:
        found = importlib.util.find_spec("pip") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"pip is not installed in this Python ({sys.executable}): `python -m ensurepip` (--download runs pip)"
    return None


def check_openai_key() -> Problem:
    if not os.environ.get("OPENAI_API_KEY"):
        return ("OPENAI_API_KEY is not set: export it, or point --base-url at an OpenAI-compatible server, "
                "or replay a script with --model scripted:FILE")
    return None


CHECKS: Dict[str, Callable[[], Problem]] = {
    "torch": check_torch,
    "cuda_torch": check_cuda_torch,
    "gpu": check_gpu,
    "sglang": check_sglang,
    "nvcc": check_nvcc,
    "pip": check_pip,
    "openai_key": check_openai_key,
}


def missing(*needs: Need) -> List[str]:
    """Every problem among `needs`, in order, each once."""
    out: List[str] = []
    for need in needs:
        if isinstance(need, str):
            if need not in CHECKS:
                raise ValueError(f"unknown precondition {need!r}; known: {', '.join(CHECKS)}")
            problem = CHECKS[need]()
        else:
            problem = need()
        if problem is None:
            continue
        for p in ([problem] if isinstance(problem, str) else list(problem)):
            if p and p not in out:
                out.append(p)
    return out


def require(*needs: Need) -> None:
    """Raise one AstraError naming every missing piece (one `error:` line each); return if none."""
    problems = missing(*needs)
    if problems:
        raise AstraError(*problems)
