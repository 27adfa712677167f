"""`astra-sglang check` / `bench` command lines: help, usage errors as one line, verdicts as exit codes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from astra_sglang.cli import cli, main

BAD = Path(__file__).resolve().parent / "bad_candidates"


def _fake_ws(tmp_path: Path) -> Path:
    d = tmp_path / "silu_and_mul"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({
        "op": "silu_and_mul", "variant": "jit", "include_dirs": [], "flags": [], "dtypes": ["fp16", "bf16", "fp32"],
        "closure_sha256": "x", "attrs": {}, "arch": "sm_90"}))
    return d


def test_help_lists_check_and_bench():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0 and "check" in r.output and "bench" in r.output
    r = CliRunner().invoke(cli, ["check", "--help"])
    assert r.exit_code == 0 and "--candidate" in r.output and "--sanitize" in r.output
    r = CliRunner().invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0 and "--shapes" in r.output and "--ncu" in r.output and "--l2" in r.output


def test_missing_workspace_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "silu_and_mul", "--root", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no workspace for silu_and_mul")


def test_bad_dtype_is_a_usage_error(tmp_path, capsys):
    ws = _fake_ws(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["check", "silu_and_mul", "--workspace", str(ws), "--dtype", "fp8",
              "--candidate", str(BAD / "silu_created_stream.cu")])
    assert e.value.code == 2 and "fp8" in capsys.readouterr().err


def test_rejected_candidate_exits_1_with_reason_and_json(tmp_path, capsys):
    ws = _fake_ws(tmp_path)
    out = tmp_path / "res.json"
    with pytest.raises(SystemExit) as e:
        main(["check", "silu_and_mul", "--workspace", str(ws), "--candidate", str(BAD / "silu_default_stream.cu"),
              "--json", str(out)])
    assert e.value.code == 1
    text = capsys.readouterr().out
    assert text.startswith("FAIL silu_and_mul") and "default-stream" in text
    d = json.loads(out.read_text())
    assert d["ok"] is False and d["stage"] == "static" and d["candidate_sha256"]


def test_bench_static_rejection_writes_report(tmp_path, capsys):
    ws = _fake_ws(tmp_path)
    out = tmp_path / "b.json"
    with pytest.raises(SystemExit) as e:
        main(["bench", "silu_and_mul", "--workspace", str(ws), "--candidate", str(BAD / "silu_created_stream.cu"),
              "--out", str(out)])
    assert e.value.code == 1
    d = json.loads(out.read_text())
    assert d["ok"] is False and "stream-create" in d["reason"]


def test_bench_rejects_unknown_shape_selector(tmp_path, capsys):
    ws = _fake_ws(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["bench", "silu_and_mul", "--workspace", str(ws), "--shapes", "nonsense"])
    assert e.value.code == 2 and "no shapes tagged" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--consumer-width", "--producer-k"])
def test_bench_rejects_a_neighbour_size_below_one(tmp_path, capsys, flag):
    ws = _fake_ws(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["bench", "silu_and_mul", "--workspace", str(ws), flag, "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1] == f"error: {flag} must be at least 1, not 0"
    assert not (ws / "bench").exists()


def test_bench_rejects_unknown_neighbours(tmp_path, capsys):
    ws = _fake_ws(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["bench", "silu_and_mul", "--workspace", str(ws), "--neighbours", "nvjet"])
    assert e.value.code == 2 and "--neighbours" in capsys.readouterr().err
    from astra_sglang.errors import AstraError
    from astra_sglang.harness.bench import bench
    from astra_sglang.build.workspace import Workspace

    with pytest.raises(AstraError, match="--neighbours must be cublas or astra, not 'nvjet'"):
        bench("silu_and_mul", Workspace.open("silu_and_mul", path=ws), None, neighbours="nvjet")
    with pytest.raises(AstraError, match="--sites must be serving or generic, not 'model'"):
        bench("silu_and_mul", Workspace.open("silu_and_mul", path=ws), None, sites="model")


def test_bench_api_keeps_the_dtypes_the_workspace_has(tmp_path):
    from astra_sglang.harness.bench import bench
    from astra_sglang.errors import AstraError
    from astra_sglang.build.workspace import Workspace

    d = tmp_path / "merge_state"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({
        "op": "merge_state", "variant": "flashinfer", "include_dirs": [], "flags": [], "dtypes": ["fp16", "bf16"],
        "closure_sha256": "x", "attrs": {"lse_base": 2.0, "semantics": "flashinfer"}, "arch": "sm_90"}))
    ws = Workspace.open("merge_state", path=d)
    with pytest.raises(AstraError, match="none of the dtypes fp32"):
        bench("merge_state", ws, None, dtypes=("fp32",))
    bad = tmp_path / "bad.cu"
    bad.write_text("void f(){ cudaDeviceSynchronize(); }\n")
    rep = bench("merge_state", ws, bad, dtypes=("fp16", "fp32"))  # static rejection: no build, no GPU
    assert not rep.ok and "host-sync" in rep.reason


def test_bench_default_shapes_are_paper_else_decode():
    """bench without --shapes: the paper's shapes where an op has them; the MoE ops have none, so decode
    (it stopped with an error before)."""
    from astra_sglang.harness.cases import default_bench_shapes, select_shapes
    from astra_sglang.registry import get_op

    for op, want in (("silu_and_mul", "paper"), ("moe_router", "decode"), ("moe_align", "decode")):
        spec = get_op(op)
        assert default_bench_shapes(spec) == want and select_shapes(spec, want), op
