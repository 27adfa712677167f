"""kernels/dev/bench_variants.sh's tables, from bench JSONs already written (SUMMARY_ONLY=1: no GPU, nothing built):
per row and per variant, and each variant's geomean and minimum over the rows every variant has, which is how a
session compares compile-time variants (results/2026-11-27-h200/session9)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "kernels" / "dev" / "bench_variants.sh"


def _row(shape, prod, cand, cprod=None, ccand=None):
    return {"shape": shape, "dtype": "bf16", "prod_us": prod, "cand_us": cand,
            "context_base_us": cprod, "context_cand_us": ccand}


def _run(res: Path, *args: str, op="rmsnorm"):
    env = {**os.environ, "SUMMARY_ONLY": "1", "RES": str(res)}
    return subprocess.run(["bash", str(SCRIPT), op, "ws", "decode", "bf16", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _summary(out, basis: str, rows: int, variants: int):
    """The `variants` lines under bench_variants.sh's footer for `basis` ("chained", "in context"), split."""
    lines = out.stdout.splitlines()
    head = f"# {basis}, over the {rows} rows every variant has: geomean (min) of production over the variant"
    return [x.split() for x in lines[lines.index(head) + 1:][:variants]]


def test_summary_gives_each_variant_s_geomean_and_minimum_over_shared_rows(tmp_path):
    (tmp_path / "rmsnorm_a.json").write_text(json.dumps({"rows": [
        _row("1x4096", 2.0, 1.0, 2.0, 1.6), _row("16x4096", 2.0, 2.0, 4.0, 2.0), _row("64x4096", 3.0, 1.5)]}))
    (tmp_path / "rmsnorm_b.json").write_text(json.dumps({"rows": [
        _row("1x4096", 2.0, 2.0, 2.0, 2.0), _row("16x4096", 2.0, 1.0, 4.0, 4.0)]}))
    out = _run(tmp_path, "a=", "b=-DX=1")
    assert out.returncode == 0, out.stderr
    assert _summary(out, "chained", 2, 2) == [["a", "1.414x", "(1.000x)"], ["b", "1.414x", "(1.000x)"]]
    assert _summary(out, "in context", 2, 2) == [["a", "1.581x", "(1.250x)"], ["b", "1.000x", "(1.000x)"]]
    assert not list(tmp_path.glob("*.log"))  # nothing was benched
    # the same as a plot (in context, where bench timed it; matplotlib is a dependency)
    assert f"plot: {tmp_path}/rmsnorm_variants.png" in out.stdout
    assert (tmp_path / "rmsnorm_variants.png").read_bytes()[:4] == b"\x89PNG"


def test_an_unknown_op_is_one_error_line(tmp_path):
    out = _run(tmp_path, "a=", op="no_such_op")
    assert out.returncode == 2 and out.stderr.startswith("error: no kernels/no_such_op/kernel.cu")
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_row_with_a_non_positive_in_context_time_is_left_out_not_a_crash(tmp_path):
    """qknorm_rope_store 1x16x2x128 (H200, 2026-11-27): a hiccup gave one variant an in-context time of -3.18 µs,
    and the summary died on log() of a negative ratio. The row is now left out of that basis's shared rows."""
    (tmp_path / "rmsnorm_a.json").write_text(json.dumps({"rows": [
        _row("1x4096", 2.0, 1.0, 2.0, 1.0), _row("16x4096", 2.0, 1.0, 1.4, -3.18)]}))
    (tmp_path / "rmsnorm_b.json").write_text(json.dumps({"rows": [
        _row("1x4096", 2.0, 2.0, 2.0, 2.0), _row("16x4096", 2.0, 2.0, 4.0, 2.0)]}))
    out = _run(tmp_path, "a=", "b=")
    assert out.returncode == 0, out.stderr
    assert _summary(out, "in context", 1, 2) == [["a", "2.000x", "(2.000x)"], ["b", "1.000x", "(1.000x)"]]


def test_both_orders_reads_each_variant_again_as_name_2(tmp_path, monkeypatch):
    """BOTH_ORDERS=1 benches the list again reversed, each as NAME.2; the summary then has all four columns."""
    for name, c in (("a", 1.0), ("b", 2.0), ("b.2", 2.0), ("a.2", 1.25)):
        (tmp_path / f"rmsnorm_{name}.json").write_text(json.dumps({"rows": [_row("1x4096", 2.0, c, 2.0, c)]}))
    monkeypatch.setenv("BOTH_ORDERS", "1")
    out = _run(tmp_path, "a=", "b=-DX=1")
    assert out.returncode == 0, out.stderr
    assert [c[:2] for c in _summary(out, "in context", 1, 4)] == [["a", "2.000x"], ["b", "1.000x"], ["b.2", "1.000x"],
                                                                   ["a.2", "1.600x"]]


def test_past_the_deadline_a_variant_is_skipped_and_the_tables_still_print(tmp_path):
    """Session 16's part m ran under an outer `timeout`, which cut off the tables with every JSON written. DEADLINE
    skips the variants that would start late (nothing is built or benched here: DEADLINE=0) and still prints."""
    (tmp_path / "rmsnorm_a.json").write_text(json.dumps({"rows": [_row("1x4096", 2.0, 1.0, 2.0, 1.6)]}))
    (tmp_path / "rmsnorm_b.json").write_text(json.dumps({"rows": [_row("1x4096", 2.0, 2.0, 2.0, 2.0)]}))
    env = {**os.environ, "DEADLINE": "0", "RES": str(tmp_path)}
    env.pop("SUMMARY_ONLY", None)
    out = subprocess.run(["bash", str(SCRIPT), "rmsnorm", "ws", "decode", "bf16", "a=", "b=-DX=1"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "a: skipped (deadline 0s)" in out.stdout and "b: skipped (deadline 0s)" in out.stdout
    assert "in context: --neighbours cublas, bench's default" in out.stdout  # says which GEMMs were around the op
    assert not list(tmp_path.glob("*.log"))  # nothing was benched
    assert _summary(out, "in context", 1, 2) == [["a", "1.250x", "(1.250x)"], ["b", "1.000x", "(1.000x)"]]


def test_a_deadline_that_is_not_whole_seconds_is_one_error_line(tmp_path):
    env = {**os.environ, "DEADLINE": "8m", "RES": str(tmp_path)}
    env.pop("SUMMARY_ONLY", None)
    out = subprocess.run(["bash", str(SCRIPT), "rmsnorm", "ws", "decode", "bf16", "a="], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == "error: DEADLINE takes whole seconds, not '8m'"
    assert not list(tmp_path.glob("*.log"))


def test_neighbours_names_the_gemms_and_an_unknown_one_is_one_error_line(tmp_path):
    """Session 20's parts b and c timed variants between cuBLAS GEMMs by default, not the ones a patched server runs."""
    base = {**os.environ, "DEADLINE": "0", "RES": str(tmp_path)}
    base.pop("SUMMARY_ONLY", None)

    def run(env):
        return subprocess.run(["bash", str(SCRIPT), "rmsnorm", "ws", "decode", "bf16", "a="], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    out = run({**base, "NEIGHBOURS": "astra"})
    assert out.returncode == 0 and "in context: --neighbours astra" in out.stdout, out.stderr
    out = run({**base, "NEIGHBOURS": "vllm"})
    assert out.returncode == 2 and out.stderr.strip() == "error: NEIGHBOURS takes astra or cublas, not 'vllm'"
    assert not list(tmp_path.glob("*.log"))
