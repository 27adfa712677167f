"""`astra-sglang ops` and what `--ops all` patches (CPU)."""
import json

from astra_sglang.cli import main


def test_ops_json_lists_every_registered_op_with_its_parts(capsys):
    from astra_sglang.registry import op_names

    main(["ops", "--json"])
    rows = {r["op"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(op_names())
    for r in rows.values():
        assert r["missing"] == [], (r["op"], r["missing"])
        assert r["extract"] and r["kernel"] and r["patch"] and r["validate"]


def test_all_leaves_out_ops_whose_adapter_says_why_but_naming_them_patches_them():
    from astra_sglang.patch import patchable_ops
    from astra_sglang.errors import AstraError
    from astra_sglang.patch.config import default_ops, parse_ops
    from astra_sglang.registry import op_part

    known = patchable_ops()
    off = [o for o in known if getattr(op_part(o, "adapter"), "DEFAULT_OFF", "")]
    assert "kv_store" in off  # 0.93x in context on the H200: not patched unless named
    everything = parse_ops("all", known, default_ops(known))
    assert not set(off) & set(everything) and "fused_add_rmsnorm" in everything
    assert parse_ops("kv_store", known, default_ops(known)) == ["kv_store"]
    # the defaults plus an op that is off by default
    assert parse_ops("all,kv_store", known, default_ops(known)) == everything + ["kv_store"]
    assert parse_ops("all, fused_add_rmsnorm", known, default_ops(known)) == everything
    # '-op' takes one out: a step A/B of every default op but one (moe_combine's 1-token calls, 2026-11-27)
    assert parse_ops("all,-moe_combine", known, default_ops(known)) == [o for o in everything if o != "moe_combine"]
    assert parse_ops("all,kv_store,-kv_store", known, default_ops(known)) == everything
    with pytest.raises(AstraError, match="unknown op"):
        parse_ops("all,-nope", known, default_ops(known))
    with pytest.raises(AstraError, match="unknown op"):
        parse_ops("all,nope", known, default_ops(known))


def test_counters_name_the_tp_rank_sglang_gives_a_worker(tmp_path):
    """patch --counters shows each process's TP rank (SGLang titles a worker sglang::scheduler_TP<r>;
    setproctitle rewrites /proc/self/cmdline, which a child started under that name shows too)."""
    import subprocess
    import sys

    code = ("import importlib; c = importlib.import_module('astra_sglang.patch.counters'); "
            "f = c.CounterFile(__import__('pathlib').Path(%r), ['silu_and_mul']); f.bump('silu_and_mul', 'calls'); "
            "f.set_status('silu_and_mul', state='active'); print(c.process_rank())" % str(tmp_path))
    out = subprocess.run(["bash", "-c", f'exec -a "sglang::scheduler_TP1" {sys.executable} -c "$0"', code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "TP1"
    from astra_sglang.patch.counters import format_table, read_counters

    procs = read_counters(tmp_path)
    assert [p.rank for p in procs] == ["TP1"]
    assert "TP1" in format_table(procs)


def test_check_and_bench_name_an_unknown_op_and_a_missing_gpu_before_any_work(tmp_path, monkeypatch, capsys, request):
    """On a machine without a GPU: unknown op first; then every missing GPU piece, exit 2, no bench JSON."""
    import pytest

    from astra_sglang.preconditions import missing

    monkeypatch.chdir(tmp_path)
    for cmd in (["check", "no_such_op"], ["bench", "no_such_op"]):
        with pytest.raises(SystemExit) as e:
            main(cmd)
        assert e.value.code == 2
        assert "unknown op 'no_such_op'" in capsys.readouterr().err
    if not missing("gpu", "cuda_torch"):
        pytest.skip("this machine has a GPU")
    from astra_sglang.build import Arch
    from astra_sglang.extract import discover, extract
    from astra_sglang.registry import get_op

    src = request.getfixturevalue("wheel_sources")
    extract(get_op("silu_and_mul"), discover(src["sglang"], src["flashinfer"], src["tvm"]),
            tmp_path / "astra-work" / "silu_and_mul", Arch(9, 0))
    with pytest.raises(SystemExit) as e:
        main(["bench", "silu_and_mul", "--out", str(tmp_path / "out" / "b.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("error:") >= 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


import pytest  # noqa: E402


@pytest.mark.nvcc
@pytest.mark.wheels
def test_the_first_check_after_extract_reuses_extracts_build(tmp_path, wheel_sources):
    """extract builds in a temporary folder and moves the workspace into place; the build cache key counts
    include dirs inside the workspace relative to it, so the moved workspace's build is found again."""
    from astra_sglang.build.workspace import Workspace

    w = wheel_sources
    main(["extract", "silu_and_mul", "--sglang-src", str(w["sglang"]), "--flashinfer-src", str(w["flashinfer"]),
          "--tvm-ffi-src", str(w["tvm"]), "--arch", "sm_90", "--out", str(tmp_path)])
    res = Workspace.open("silu_and_mul", path=tmp_path / "silu_and_mul").build()
    assert res.ok and res.cached


def test_validate_and_e2e_check_their_arguments_before_anything_else(tmp_path, monkeypatch, capsys):
    import pytest

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["validate", "--ops", "silu_and_mul", "--dtypes", "fp8"])
    assert e.value.code == 2 and "has no dtype fp8" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["e2e", "--model-path", "llama3-8b", "--ops", "silu_and_mul", "--workload", "w:4:60000:60000:1"])
    assert e.value.code == 2 and "exceed --max-total-tokens" in capsys.readouterr().err
    assert not (tmp_path / "e2e-out").exists()
