"""Core contracts: registry, spec shapes, arch/flag parsing, CLI error handling."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from astra_sglang.build import Arch, compile_flags, parse_arch
from astra_sglang.cli import cli, main
from astra_sglang.errors import AstraError
from astra_sglang.registry import get_op, op_names


def test_registry_lists_ops_and_rejects_unknown():
    assert "silu_and_mul" in op_names()
    with pytest.raises(AstraError, match="known ops: .*silu_and_mul"):
        get_op("no_such_op")


def test_paper_shapes_are_in_the_corpus():
    spec = get_op("silu_and_mul")
    paper = {s.dims for s in spec.shapes("paper")}
    assert (16, 4096) in paper and (512, 14336) in paper and len(paper) == 8
    assert spec.shapes("16x4096,3x1368")[1].dims == (3, 1368)
    with pytest.raises(AstraError):
        spec.shapes("16x4096x2")
    with pytest.raises(AstraError, match="AxB"):
        spec.shapes("16xab")
    # every corpus shape has a provenance
    assert all(s.source for s in spec.corpus)


def test_abi_signature_matches_argtypes():
    spec = get_op("silu_and_mul")
    sig = spec.c_signature()
    assert sig.startswith('extern "C" cudaError_t astra_silu_and_mul(')
    assert len(spec.ctypes_argtypes()) == len(spec.abi) + 1  # + stream


@pytest.mark.parametrize("text,expect", [("sm_90", (9, 0)), ("90", (9, 0)), ("9.0", (9, 0)), ("sm_100a", (10, 0))])
def test_parse_arch(text, expect):
    a = parse_arch(text)
    assert (a.major, a.minor) == expect


@pytest.mark.parametrize("bad", ["sm_70", "hopper", ""])
def test_parse_arch_rejects(bad):
    with pytest.raises(AstraError):
        parse_arch(bad)


def test_jit_flags_reproduce_sglang():
    f = compile_flags("sglang_jit", Arch(9, 0), ("--use_fast_math",))
    assert "-DSGL_CUDA_ARCH=900" in f and "-std=c++20" in f
    assert "-gencode=arch=compute_90a,code=sm_90a" in f and "--use_fast_math" in f


def test_cli_unknown_op_is_one_line_nonzero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["extract", "no_such_op", "--arch", "sm_90"])
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown op") and "silu_and_mul" in err[0]


def test_cli_help_lists_extract():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0 and "extract" in r.output
