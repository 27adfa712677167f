"""The JIT launchers extract and build from SGLang 0.5.17 too: the version the GPU box serves with
(its kernels sit in an anonymous namespace and its ActivationParams lacks 0.5.23's clamp_limit)."""
import pytest

from astra_sglang.registry import get_op

JIT_ACTIVATIONS = [op for op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")]


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("op", JIT_ACTIVATIONS)
def test_jit_activation_builds_from_sglang_0_5_17(op, wheel_sources, sglang_0_5_17_source, tmp_path):
    from astra_sglang.build import Arch
    from astra_sglang.extract import discover, extract
    from astra_sglang.build.workspace import Workspace

    try:
        spec = get_op(op)
    except Exception:
        pytest.skip(f"{op} is not in the registry")
    roots = discover(sglang_0_5_17_source, wheel_sources["flashinfer"], wheel_sources["tvm"])
    extract(spec, roots, tmp_path / op, Arch(9, 0), variant="jit")
    res = Workspace.open(op, path=tmp_path / op).build()
    assert res.ok, res.log[-2000:]
