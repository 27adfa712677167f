"""e2e/attention.py: which attention backend e2e's servers run. `auto` asks the servers' own Python whether its
sgl_kernel ships flash_ops (SGLang's FA3 default on Hopper needs it), here against real package directories on
PYTHONPATH; a named backend passes through."""
from __future__ import annotations

import sys

import pytest

from astra_sglang.e2e.attention import attention_flags, has_fa3, named_in


def _sgl_kernel(root, with_fa3: bool):
    pkg = root / "sgl_kernel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the probe must not import sgl_kernel')\n")
    (pkg / "common_ops.abi3.so").write_bytes(b"")
    if with_fa3:
        (pkg / "flash_ops.abi3.so").write_bytes(b"")
    return root


@pytest.mark.parametrize("with_fa3", [True, False])
def test_auto_follows_the_servers_sgl_kernel(tmp_path, monkeypatch, with_fa3):
    monkeypatch.setenv("PYTHONPATH", str(_sgl_kernel(tmp_path, with_fa3)))
    assert has_fa3(sys.executable) is with_fa3
    flags, label = attention_flags("auto", sys.executable)
    if with_fa3:
        assert flags == [] and label.startswith("SGLang's default")
    else:
        assert flags == ["--attention-backend", "triton"] and "no FA3 library" in label


def test_no_sgl_kernel_or_no_python_means_triton(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))   # an empty dir: no sgl_kernel (unless installed here)
    if not has_fa3(sys.executable):
        assert attention_flags("auto", sys.executable)[0] == ["--attention-backend", "triton"]
    assert not has_fa3(str(tmp_path / "no-such-python"))


def test_a_named_backend_passes_through_without_a_probe():
    assert attention_flags("fa3", "/no/such/python") == (["--attention-backend", "fa3"], "fa3")
    assert attention_flags(" flashinfer ", "/no/such/python")[0] == ["--attention-backend", "flashinfer"]


def test_a_backend_in_the_users_server_args_is_the_one_reported():
    """e2e --server-arg=--attention-backend=X: X runs (e2e adds no flag of its own) and the report names it."""
    assert named_in(["--tp-size", "2", "--attention-backend", "flashinfer"]) == "flashinfer"
    assert named_in(["--attention-backend=fa3", "--attention-backend", "triton"]) == "triton"
    assert named_in(["--attention-backend"]) is None and named_in([]) is None
    assert attention_flags("auto", "/no/such/python", ["--attention-backend=fa3"]) == ([], "fa3 (--server-arg)")
    assert attention_flags("triton", "/no/such/python", ["--attention-backend", "fa3"])[0] == []
