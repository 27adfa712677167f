"""The CPU self-check of the fused q/k ops that write q into its own buffer q_out (gemma_qknorm_rope,
dense_rope_store, qknorm_rope_store, qknorm_rope): the patch's OpState (self_check "first") around a torch stand-in
for the kernel, the spec's fp64 reference rounded once (what a right kernel writes) or garbage. Each test file stubs
SGLang's sequence, computes the expected result and asserts what its op leaves (q never written)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Sequence


def run_self_check(spec, adapter, canon: Dict[str, Any], tmp_path: Path, kernel_ok: bool,
                   written: Sequence[str] = ("q_out", "k"), wrong: Sequence[str] = ("q_out", "k")):
    """The patch's first call of canon's shape class, on the CPU: OpState.prepare(canon), then execute with the
    adapter's sequence as the self-check's expected result. The stand-in kernel writes the outputs in `written` from
    the reference; where not kernel_ok, those in `wrong` get 3.0 instead. -> the OpState (last_check, disabled)."""
    import torch

    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState, TorchBackend

    def kernel(v, dims, scalars):
        ref = spec.reference({n: x.double() for n, x in v.items() if isinstance(x, torch.Tensor)}, dims, scalars)
        for n in written:
            v[n].copy_(torch.full_like(v[n], 3.0) if not kernel_ok and n in wrong else ref[n].to(v[n].dtype))

    st = OpState(spec, adapter, TorchBackend("cpu stand-in", kernel, devices=("cpu",), dtypes=("bf16",)),
                 CounterFile(tmp_path / "c", [spec.name]), self_check="first")
    views, dims, dt = st.prepare(canon)
    st.execute(views, dims, dt, adapter.sequence)
    return st
