"""The JIT activation launchers extract and build from what the GPU machines serve: SGLang 0.5.17 with the
flashinfer-python it pins, 0.6.15.post1. That FlashInfer's act_and_mul_kernel (sgl-kernel's fallback for hidden
sizes the 16-byte vector does not divide) has no vec_size parameter and no __launch_bounds__; 0.7.2's has both."""
import subprocess

import pytest

from astra_sglang.registry import get_op

JIT_ACTIVATIONS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("op", JIT_ACTIVATIONS)
def test_jit_activation_builds_from_sglang_0_5_17_and_its_flashinfer(op, wheel_sources, sglang_0_5_17_source,
                                                                     flashinfer_0_6_15_source, tmp_path):
    from astra_sglang.build import Arch
    from astra_sglang.build.workspace import Workspace
    from astra_sglang.extract import discover, extract

    spec = get_op(op)
    roots = discover(sglang_0_5_17_source, flashinfer_0_6_15_source, wheel_sources["tvm"])
    extract(spec, roots, tmp_path / op, Arch(9, 0), variant="jit")
    ws = Workspace.open(op, path=tmp_path / op)
    assert ws.manifest["sources"]["flashinfer"]["version"] == "0.6.15.post1"
    # the old fallback: the launcher takes its no-vec_size branch (production faults on those widths)
    assert ws.manifest["launch_facts"]["ACT_VEC_PARAM"] == ""
    assert "ACT_LAUNCH_BOUNDS" not in ws.manifest["launch_facts"]
    assert "return cudaErrorMisalignedAddress;" in ws.baseline.read_text()
    res = ws.build()
    assert res.ok, res.log[-2000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    assert spec.symbol in syms


@pytest.mark.wheels
@pytest.mark.parametrize("op", JIT_ACTIVATIONS)
def test_flashinfer_0_7_fallback_keeps_its_vector_template(op, wheel_sources, sglang_0_5_17_source):
    from astra_sglang.extract import discover
    from astra_sglang.extract.extractor import _check_facts

    caps = _check_facts(get_op(op).variant("jit"), discover(sglang_0_5_17_source, wheel_sources["flashinfer"],
                                                            wheel_sources["tvm"]))
    assert caps["ACT_VEC_PARAM"] == ", uint32_t vec_size" and caps["ACT_LAUNCH_BOUNDS"] == "256"
