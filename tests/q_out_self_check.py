"""Shared tests of the fused q/k ops that write q into its own buffer q_out (gemma_qknorm_rope, dense_rope_store,
qknorm_rope_store, qknorm_rope).
- run_self_check: the CPU self-check, the patch's OpState (self_check "first") around a torch stand-in for the kernel,
  the spec's fp64 reference rounded once (what a right kernel writes) or garbage. Each test file stubs SGLang's
  sequence, computes the expected result and asserts what its op leaves (q never written).
- torch_qknorm, torch_rope: torch stand-ins for SGLang's JIT q/k norm and rope (their formulas, not their code), for
  the tests that stub SGLang's sequence and compute what the op should leave.
- assert_q_out_is_q_in_place: on a GPU, the shipped kernel with q_out apart and with q_out = q (the adapters'
  in-place switch) writes the same q bit for bit."""
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


def assert_q_out_is_q_in_place(spec, tmp_path: Path, monkeypatch, extra_shapes: Sequence[Sequence[int]],
                               same: Sequence[str] = ("k",)) -> None:
    """A GPU: the same inputs through spec's shipped kernel with q_out its own contiguous buffer (NaN first) and with
    q_out = q, q_out_stride = q_stride (in place): q_out equals the in-place q bit for bit, q untouched in the first,
    the outputs in `same` equal in both, the columns of q past its heads never written. Shapes: every edge shape,
    then extra_shapes. q_out_stride is every spec's last dim, q_stride its fifth."""
    import torch

    from astra_sglang.build.loader import KernelLib
    from astra_sglang.patch.apply import build_kernel

    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    lib = KernelLib(build_kernel(spec.name), spec)
    for dims in [tuple(s.dims) for s in spec.edge_shapes] + [tuple(d) for d in extra_shapes]:
        _, hq, _, d, qs = dims[:5]
        sc = spec.scalars(dims)
        for dt in spec.dtypes:
            inp = spec.make_inputs(dims, dt, torch.Generator(device="cuda").manual_seed(5), "normal", device="cuda")
            sep = {n: x.clone() for n, x in inp.items()}
            sep["q_out"].fill_(float("nan"))
            assert lib(sep, dims, dt, sc) == 0
            inplace = {n: x.clone() for n, x in inp.items()}
            inplace["q_out"] = inplace["q"]
            assert lib(inplace, dims[:-1] + (qs,), dt, sc) == 0
            torch.cuda.synchronize()
            assert torch.equal(sep["q"], inp["q"]), (dims, dt)
            assert torch.equal(sep["q_out"], inplace["q"][:, : hq * d]), (dims, dt)
            assert torch.equal(inplace["q"][:, hq * d:], inp["q"][:, hq * d:]), (dims, dt)
            for n in same:
                assert torch.equal(sep[n], inplace[n]), (dims, dt, n)


def torch_qknorm(x, w, eps):
    """A torch stand-in for SGLang's JIT q/k norm on [t, heads, d] (fp32 math, one rounding)."""
    import torch

    f = x.float()
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def torch_rope(x, cache, positions, neox: bool):
    """A torch stand-in for SGLang's JIT rope on [t, heads, d] (fp32 math, one rounding)."""
    import torch

    d = x.shape[-1]
    cs = cache[positions]
    cos, sin = cs[:, None, : d // 2], cs[:, None, d // 2:]
    f = x.float()
    if neox:
        a, b = f[..., : d // 2], f[..., d // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)
    a, b = f[..., 0::2], f[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2).to(x.dtype)
