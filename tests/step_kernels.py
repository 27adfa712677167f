"""Synthetic decode steps for the profile's CPU tests: a step is a list of (kernel name, launching torch op, its Input
Dims) tuples, in launch order."""
from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

from astra_sglang.e2e.trace import KernelEvent


def step_kernels(step: Sequence[Tuple[str, object, object]], steps: int, shapes: bool,
                 durations: Callable[[str], float]) -> List[KernelEvent]:
    """The step's kernels back to back on one stream, `steps` times (a graph replay), each `durations(name)` µs long;
    with `shapes` (an eager step) each carries its torch op's Dims where the step gives them."""
    ks, t = [], 0.0
    for _ in range(steps):
        for name, op, dims in step:
            k = KernelEvent(name, t, durations(name), stream=7)
            if shapes and dims is not None:
                k.shapes, k.torch_op = dims, op
            ks.append(k)
            t += k.dur
    return ks
