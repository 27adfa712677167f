"""The check oracle on the CPU: tolerance rules, error metric, poison, guards, shape plans, and the whole
worker pipeline with Python stand-in kernels that misbehave the way bad GPU candidates do."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.harness.cases import case_plan, select_shapes, workspace_dtypes  # noqa: E402
from astra_sglang.harness.checkjob import run_check  # noqa: E402
from astra_sglang.harness.guards import GuardedSet  # noqa: E402
from astra_sglang.harness.inputs import reference_kwargs, to_prod_abi  # noqa: E402
from astra_sglang.harness.numerics import (BASELINE_SLACK, count_poison, nonfinite_mismatch, poison_,  # noqa: E402
                                           rel_err, tolerance)
from astra_sglang.errors import AstraError  # noqa: E402
from astra_sglang.registry import get_op  # noqa: E402
from astra_sglang.spec import Shape  # noqa: E402

STANDINS = Path(__file__).resolve().parent / "check_stand_ins.py"


def impl(name: str) -> str:
    return f"py:{STANDINS}:{name}"


# ------------------------------------------------------------------ tolerance and metric


def test_tolerance_is_k_times_production_or_the_floor():
    spec = get_op("silu_and_mul")
    assert tolerance(spec, "fp16", 1e-4) == pytest.approx(2e-3)  # floor wins
    assert tolerance(spec, "fp16", 5e-3) == pytest.approx(1e-2)  # 2 x production
    assert tolerance(spec, "bf16", 0.0) == pytest.approx(1.6e-2)
    assert tolerance(spec, "fp32", None) == pytest.approx(1e-5)
    assert tolerance(spec, "fp32", float("inf")) == pytest.approx(1e-5)  # a broken production never widens it
    assert tolerance(spec, "fp16", None, alone=True) == pytest.approx(2e-3)  # no `alone` bound: the floor


def test_a_case_production_does_not_take_is_held_to_the_alone_bound_where_the_spec_has_one():
    """The fused q/k norm + rope ops round between norm and rope as production does: on a case production does not
    take they are held to production's measured worst error (families/qkv.py), not to the floor, which the
    k * production bound exceeds on most shapes."""
    spec = get_op("qknorm_rope_store")
    assert tolerance(spec, "bf16", None) == pytest.approx(0.25)  # the floor: production's own sanity bound uses it
    assert tolerance(spec, "bf16", None, alone=True) == pytest.approx(1.0)
    assert tolerance(spec, "fp16", None, alone=True) == pytest.approx(0.125)
    assert tolerance(spec, "bf16", 0.01, alone=False) == pytest.approx(0.25)


def test_a_spec_judged_normwise_passes_a_one_element_flip_and_fails_a_missing_term():
    """moe_experts sums K expert outputs it rounded first (as SGLang does): where a sum cancels, one of them rounding
    the other way makes a large elementwise error at that element alone. Its tolerance is normwise: that flip passes
    while the elementwise rule fails it, and a dropped expert fails both."""
    from astra_sglang.harness.numerics import judged
    from astra_sglang.harness.oracle import judge

    spec = get_op("moe_experts")
    assert spec.tolerance.metric == "norm"
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn((4, 512), generator=gen, dtype=torch.float64)
    ref[0, 7] = 1e-4  # a cancelled sum
    prod = ref.to(torch.float16)
    prod[1:3] = (ref[1:3] * (1 + 2e-4)).to(torch.float16)  # production's own rounding walk, spread out
    flip = ref.to(torch.float16)
    flip[0, 7] += 2 ** -10  # one expert output rounded the other way, at the cancelled element
    dims = (4, 512, 256, 8, 2)
    elementwise = {n: rel_err(v, ref) for n, v in (("flip", flip), ("prod", prod))}
    assert elementwise["flip"]["err"] > 2 * elementwise["prod"]["err"]  # the elementwise rule would fail it
    details, failures, _ = judge(spec, "t", dims, "fp16", "normal", 0, {"candidate": {"out": flip},
                                                                         "production": {"out": prod}},
                                 {"out": ref}, {"out": ref})
    assert failures == []
    row = details[0]  # the judged (normwise) errors, the elementwise maxima beside them
    assert row["metric"] == "norm" and row["cand_err"] == row["cand_norm"] and row["cand_max"] > 2 * row["prod_max"]
    wrong = ref.clone()
    wrong[2] -= 0.3 * ref[2]  # one token's expert missing
    _, failures, _ = judge(spec, "t", dims, "fp16", "normal", 0, {"candidate": {"out": wrong.to(torch.float16)},
                                                                   "production": {"out": prod}},
                           {"out": ref}, {"out": ref})
    assert failures and "normwise error" in failures[0]
    nan = flip.clone()
    nan[3, 3] = float("nan")
    assert judged(spec, rel_err(nan, ref)) == float("inf") and judged(spec, None) is None


def test_rel_err_basic_and_near_zero_elements():
    ref = torch.tensor([1.0, -2.0, 1e-6, 4.0], dtype=torch.float64)
    out = ref.to(torch.float32).clone()
    assert rel_err(out, ref)["err"] < 1e-6
    out[0] = 1.01  # 1% off on a unit element
    assert rel_err(out, ref)["err"] == pytest.approx(0.01 / (1 + 0.01 * math.sqrt((1 + 4 + 16) / 4)), rel=1e-3)
    out = ref.to(torch.float32).clone()
    out[2] = 0.0  # flushing a tiny element costs little: |r| + 0.01*rms in the denominator
    assert rel_err(out, ref)["err"] < 1e-4


def test_rel_err_nan_is_infinite_error_and_counted():
    ref = torch.ones(8, dtype=torch.float64)
    out = torch.ones(8, dtype=torch.float16)
    out[3] = float("nan")
    e = rel_err(out, ref)
    assert e["nan"] == 1 and e["err"] == float("inf")


def test_rel_err_overflow_to_inf_matches_a_reference_beyond_the_dtype_range():
    ref = torch.tensor([1e6, -1e6, 1.0], dtype=torch.float64)  # beyond fp16's 65504
    out = torch.tensor([float("inf"), float("-inf"), 1.0], dtype=torch.float16)
    assert rel_err(out, ref)["err"] == 0.0
    out = torch.tensor([float("-inf"), float("-inf"), 1.0], dtype=torch.float16)  # wrong sign
    assert rel_err(out, ref)["err"] > 1.0


def test_nonfinite_reference_positions_must_match_reference_or_production():
    ref = torch.tensor([float("-inf"), float("nan"), 2.0], dtype=torch.float64)
    assert nonfinite_mismatch(torch.tensor([float("-inf"), float("nan"), 2.0]), ref) == 0
    assert nonfinite_mismatch(torch.tensor([0.0, float("nan"), 2.0]), ref) == 1
    prod = torch.tensor([0.0, 0.0, 2.0])
    assert nonfinite_mismatch(torch.tensor([0.0, 0.0, 2.0]), ref, prod) == 0  # production's convention


def test_poison_round_trip_every_dtype():
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        t = torch.zeros(10, dtype=dt)
        poison_(t)
        assert count_poison(t) == 10 and torch.isnan(t.float()).all()
        t[:4] = 1.0
        assert count_poison(t) == 6


def test_guarded_set_detects_writes_outside_and_poisons_outputs():
    spec = get_op("silu_and_mul")
    protos = spec.make_inputs((2, 8), "fp16", torch.Generator().manual_seed(0), "normal", device="cpu")
    g = GuardedSet(spec, protos, "cpu", guard_bytes=256)
    g.load(protos)
    assert count_poison(g.views["out"]) == 16
    assert torch.equal(g.views["input"], protos["input"])
    assert g.guard_damage() == {}
    o = g.views["out"]
    torch.as_strided(o, (2,), (1,), o.storage_offset() + o.numel()).fill_(0)
    torch.as_strided(o, (1,), (1,), o.storage_offset() - 1).fill_(0)
    assert g.guard_damage() == {"out": (2, 4)}
    g.load(protos)  # guards rewritten for the next run
    assert g.guard_damage() == {}


# ------------------------------------------------------------------ shapes, dtypes, plans


def test_check_shapes_cover_edge_paper_sample_and_largest():
    spec = get_op("silu_and_mul")
    shapes = select_shapes(spec, "check")
    dims = [s.dims for s in shapes]
    assert len(dims) == len(set(dims))
    for s in spec.edge_shapes:
        assert s.dims in dims
    for s in spec.shapes("paper"):
        assert s.dims in dims
    assert any("largest" in s.tags for s in spec.edge_shapes if s.dims in dims)
    biggest = max(spec.corpus, key=lambda s: s.dims[0] * s.dims[1]).dims
    assert max(d[0] * d[1] for d in dims) >= 0.9 * biggest[0] * biggest[1]
    assert dims == sorted(dims, key=lambda d: d[0] * d[1])  # small first
    assert len(dims) < len(spec.corpus)
    assert [s.dims for s in select_shapes(spec, "paper+edge")] == [s.dims for s in spec.shapes("paper")] + [
        s.dims for s in spec.edge_shapes if s.dims not in {p.dims for p in spec.shapes("paper")}]
    assert select_shapes(spec, "3x64")[0].dims == (3, 64)


def test_case_plan_reruns_in_the_same_buffers_and_limits_big_cases():
    spec = get_op("fused_add_rmsnorm")
    plan = case_plan(spec, (16, 4096), "fp16")
    assert plan[:2] == [("normal", 0), ("normal", 1)]
    assert [d for d, _ in plan[2:]] == ["large", "uniform"]
    assert case_plan(spec, (16384, 8192), "fp16", big=1 << 20) == [("normal", 0), ("normal", 1)]


def test_workspace_dtypes():
    spec = get_op("merge_state")
    assert workspace_dtypes(spec, {"dtypes": ["fp16", "bf16"]}) == ["fp16", "bf16"]
    with pytest.raises(AstraError, match="fp32"):
        workspace_dtypes(spec, {"dtypes": ["fp16", "bf16"]}, ["fp32"])


def test_variant_conventions_for_production_only():
    spec = get_op("merge_state")
    attrs = {"lse_base": 2.0, "semantics": "flashinfer"}
    assert reference_kwargs(spec, attrs) == {"semantics": "flashinfer"}
    assert reference_kwargs(get_op("silu_and_mul"), {"max_hidden": 8192}) == {}
    t = {"s_a": torch.tensor([1.0, float("-inf")]), "s_b": torch.tensor([2.0, 0.0]), "v_a": torch.ones(1)}
    c = to_prod_abi(spec, t, attrs)
    assert c["s_a"][0].item() == pytest.approx(1 / math.log(2)) and c["s_a"][1].item() == float("-inf")
    assert c["v_a"] is t["v_a"]
    assert to_prod_abi(spec, t, {}) is t


# ------------------------------------------------------------------ the pipeline, on the CPU

SILU_SHAPES = [Shape((3, 64)), Shape((5, 136))]


def _run(op, prod, cand, shapes, dtypes, **kw):
    return run_check(get_op(op), impl(prod), impl(cand) if cand else None, shapes, dtypes, device="cpu",
                     timeout=kw.pop("timeout", 30), **kw)


def test_good_candidate_and_production_pass():
    ok, reason, failures, details, notes, dev, wr = _run("silu_and_mul", "good", "good", SILU_SHAPES, ["fp16", "bf16", "fp32"])
    assert ok and reason == "" and not failures, reason
    # every shape x dtype x (normal, normal re-run, large, uniform) x output
    assert len(details) == 2 * 3 * 4
    assert {d["dist"] for d in details} == {"normal", "large", "uniform"}
    assert all(d["cand_err"] <= d["tol"] for d in details)
    ok, reason, *_ = _run("silu_and_mul", "good", None, SILU_SHAPES, ["fp16"])
    assert ok, reason


@pytest.mark.parametrize("cand,expect", [
    ("noisy", r"candidate's out error 0\.05\d* > tolerance"),
    ("half_written", r"never wrote 96 of 192 elements of out \(poison left\)$"),
    ("past_end", r"wrote outside out: 16 guard bytes changed past the end"),
    ("before_start", r"wrote outside out: 8 guard bytes changed before the start"),
    ("writes_input", r"modified its input input \(1 elements changed\)"),
    ("one_nan", r"candidate's out has 1 NaN where the reference is finite"),
    ("cached_by_pointer", r"error .* on a re-run with fresh inputs in the same buffers \(stale result cached"),
    ("skip_repeat", r"never wrote 192 of 192 elements of out \(poison left\) on a re-run with fresh inputs"),
    ("error_code", r"candidate returned cudaError 1"),
    ("raises", r"candidate crashed the CUDA context: CUDA error: an illegal memory access"),
])
def test_bad_stand_ins_are_rejected_with_the_right_reason(cand, expect):
    import re

    ok, reason, failures, details, notes, dev, wr = _run("silu_and_mul", "good", cand, SILU_SHAPES, ["fp16"])
    assert not ok
    assert re.search(expect, reason), reason
    assert reason.startswith("3x64 fp16 normal: ")


def test_hang_and_segfault_fail_with_a_reason():
    ok, reason, failures, *_ , wr = _run("silu_and_mul", "good", "hang", SILU_SHAPES, ["fp16"], timeout=20)
    assert not ok and wr.status == "timeout"
    assert "no progress for 20s" in reason and "candidate on 3x64 fp16 normal" in reason
    ok, reason, failures, *_ , wr = _run("silu_and_mul", "good", "segfault", SILU_SHAPES, ["fp16"])
    assert not ok and wr.status == "crashed" and "SIGSEGV" in reason and "candidate on 3x64 fp16" in reason


def test_production_disagreeing_with_fp64_fails_the_baseline_check():
    ok, reason, *_ = _run("silu_and_mul", "noisy", None, SILU_SHAPES[:1], ["fp16"])
    assert not ok and "production's out disagrees with the fp64 reference" in reason
    assert f"{BASELINE_SLACK:g}× the fp16 floor" in reason


def test_fused_add_rmsnorm_in_place_outputs():
    shapes = [Shape((3, 256)), Shape((2, 1001))]
    ok, reason, failures, details, *_ = _run("fused_add_rmsnorm", "rms_good", "rms_good", shapes, ["fp16", "bf16", "fp32"])
    assert ok, reason
    assert {d["tensor"] for d in details} == {"input", "residual"}
    ok, reason, *_ = _run("fused_add_rmsnorm", "rms_good", "rms_residual_not_updated", shapes, ["bf16"])
    assert not ok and "candidate's residual error" in reason
    ok, reason, *_ = _run("fused_add_rmsnorm", "rms_good", "rms_fp16_accum", shapes, ["fp16"])
    assert not ok and "fp16 large: candidate's input error" in reason


@pytest.mark.parametrize("prod,attrs", [("merge_good", {}),
                                        ("merge_flashinfer_base2", {"lse_base": 2.0, "semantics": "flashinfer"})])
def test_merge_state_conventions_and_special_values(prod, attrs):
    shapes = [Shape((3, 4, 64)), Shape((5, 2, 128))]
    ok, reason, failures, details, notes, *_ = _run("merge_state", prod, None, shapes, ["fp16"], prod_attrs=attrs)
    assert ok, reason  # production passes against its own semantics, in its own lse base
    ok, reason, failures, details, *_ = _run("merge_state", prod, "merge_good", shapes, ["fp16", "bf16"], prod_attrs=attrs)
    assert ok, reason
    assert {d["tensor"] for d in details} == {"v_out", "s_out"}
    assert any(d["ref_nonfinite"] for d in details if d["dist"] == "inf_lse")
    ok, reason, *_ = _run("merge_state", prod, "merge_no_inf_handling", shapes, ["fp16"], prod_attrs=attrs)
    assert not ok and "inf_lse: candidate's v_out" in reason
    ok, reason, *_ = _run("merge_state", prod, "merge_lse_not_written", shapes, ["fp16"], prod_attrs=attrs)
    assert not ok and "never wrote 12 of 12 elements of s_out" in reason


def test_a_shape_production_does_not_take_is_judged_against_the_reference_alone():
    """astra may serve a shape production's variant does not take: the candidate is still judged there, at its dtype's
    floor. Only the baseline check (no candidate) skips it."""
    skip = {"5x136 fp16": "production routes it elsewhere"}
    ok, reason, failures, details, notes, *_ = _run("silu_and_mul", "good", "good", SILU_SHAPES, ["fp16"], skip=skip)
    assert ok, reason
    alone = [d for d in details if d["shape"] == "5x136"]
    assert alone and all(d["ref_only"] and d["prod_err"] is None and d["tol"] == pytest.approx(2e-3) for d in alone)
    assert notes == ["5x136 fp16: production routes it elsewhere; the candidate is judged against the fp64 reference "
                     "alone"]
    ok, reason, *_ = _run("silu_and_mul", "good", "noisy", SILU_SHAPES[1:], ["fp16"], skip=skip)
    assert not ok and "the fp16 bound where production does not take the case" in reason
    ok, reason, failures, details, notes, *_ = _run("silu_and_mul", "good", None, SILU_SHAPES, ["fp16"], skip=skip)
    assert ok and {d["shape"] for d in details} == {"3x64"}
    assert notes == ["5x136 fp16: skipped (production routes it elsewhere)"]


def test_production_refusing_a_case_at_run_time_leaves_the_candidate_judged():
    """On the H200 SGLang's JIT gelu_and_mul returned 716 on every odd width, and check said PASS with 0 comparisons."""
    ok, reason, failures, details, notes, *_ = _run("silu_and_mul", "refuses_wide", "good", SILU_SHAPES, ["fp16"])
    assert ok, reason
    assert {d["shape"] for d in details if d.get("ref_only")} == {"5x136"}
    assert any("5x136 fp16 normal: production returned cudaError 716; the candidate is judged against the fp64 "
               "reference alone" in n for n in notes)
    ok, reason, *_ = _run("silu_and_mul", "refuses_wide", "noisy", SILU_SHAPES[1:], ["fp16"])
    assert not ok and "5x136 fp16 normal: candidate's out error" in reason


def test_a_check_that_compared_nothing_does_not_pass():
    ok, reason, failures, details, *_ = _run("silu_and_mul", "refuses_wide", None, SILU_SHAPES[1:], ["fp16"])
    assert not ok and not details
    assert reason.startswith("nothing was compared: 5x136 fp16 normal: production returned cudaError 716")


def test_check_candidate_static_rejection_needs_no_gpu(tmp_path):
    """check_candidate stops at the static checks before building anything."""
    import json

    from astra_sglang.build.workspace import Workspace
    from astra_sglang.harness.check import check_candidate

    ws_dir = tmp_path / "silu_and_mul"
    ws_dir.mkdir()
    (ws_dir / "manifest.json").write_text(json.dumps({
        "op": "silu_and_mul", "variant": "jit", "include_dirs": [], "flags": [], "dtypes": ["fp16", "bf16", "fp32"],
        "closure_sha256": "x", "attrs": {}}))
    cand = Path(__file__).resolve().parent / "bad_candidates" / "silu_created_stream.cu"
    res = check_candidate("silu_and_mul", Workspace.open("silu_and_mul", path=ws_dir), cand)
    assert not res.ok and res.stage == "static"
    assert "stream-create: creates a CUDA stream" in res.reason
    assert res.static and any(f["rule"] == "stream-create" for f in res.static)
    assert "FAIL silu_and_mul" in res.summary()


def test_run_check_returns_a_checkrun_that_still_unpacks_as_the_old_tuple():
    run = _run("silu_and_mul", "good", "half_written", SILU_SHAPES[:1], ["fp16"])
    assert not run.ok and "poison left" in run.reason and run.failures[0] == run.reason
    assert run.details == [] or all("shape" in d for d in run.details)
    ok, reason, failures, details, notes, device, wr = run
    assert (ok, reason, wr) == (run.ok, run.reason, run.worker) and device == run.device == "cpu"


def test_format_check_prints_results_with_in_graph_and_stream_rows():
    """The in-graph and stream cases are pass/fail rows without errors: the worst-error table skips them
    (the 2026-11-23 H200 call crashed here after every check had run, exit 1 for all ops)."""
    from astra_sglang.harness.results import CheckResult, format_check

    num = {"shape": "16x4096", "dtype": "bf16", "dist": "normal", "run": "1", "tensor": "out",
           "cand_err": 0.002, "prod_err": 0.004, "tol": 0.016, "ok": True}
    graph = {"shape": "16x4096", "dtype": "bf16", "dist": "normal", "run": "graph-0", "tensor": "*",
             "cand_err": None, "prod_err": None, "tol": None, "ok": True}
    stream = dict(graph, run="stream")
    res = CheckResult(ok=True, reason="", details=[num, graph, stream], op="rmsnorm")
    text = format_check(res, verbose=True)
    assert text.startswith("PASS rmsnorm") and "cand 0.002  prod 0.004  tol 0.016" in text
    assert [d["tensor"] for d in res.worst()] == ["out"]
    only = CheckResult(ok=True, reason="", details=[graph, stream], op="rmsnorm")
    assert format_check(only).startswith("PASS rmsnorm") and only.worst() == []


def test_check_reports_how_much_of_the_candidate_is_bit_identical_to_production():
    """Within tolerance is not identical: check counts, per output, the elements equal to production's bit for
    bit (NaN matching NaN) and prints the least identical output (Gemma-2's norms passed every check yet flipped
    greedy tokens through last-bit differences)."""
    import torch

    from astra_sglang.harness.oracle import identical_fraction
    from astra_sglang.harness.results import CheckResult, format_check

    p = torch.tensor([1.0, 2.0, float("nan"), 4.0], dtype=torch.bfloat16)
    assert identical_fraction(p.clone(), p) == 1.0
    c = p.clone()
    c[3] = 4.03125  # the next bf16 after 4.0: one element, one last bit
    assert identical_fraction(c, p) == 0.75
    assert identical_fraction(c.float(), p) is None and identical_fraction(c[:2], p) is None
    rows = [{"shape": "1x3584", "dtype": "bf16", "dist": "normal", "run": 0, "tensor": t, "cand_err": 0.001,
             "prod_err": 0.004, "tol": 0.016, "ok": True, "identical": f} for t, f in (("out", 0.9921875),
                                                                                       ("residual", 1.0))]
    text = format_check(CheckResult(ok=True, reason="", details=rows, op="gemma_fused_add_rmsnorm"))
    assert "bit-identical to production: 1 of 2 output comparisons; the least out bf16 1x3584: 99.22%" in text
    assert "bit-identical to production: 1 of 1 output comparisons\n" in format_check(
        CheckResult(ok=True, reason="", details=rows[1:], op="gemma_fused_add_rmsnorm")) + "\n"


def test_timed_graph_recheck_judges_repeated_in_place_outputs_normwise():
    """After k calls on one set an in-place output took its own rounding walk: a near-zero element may be
    off by a few ulps of the row's scale (elementwise error ~1) while the result is right; a wrong
    number of calls is wrong everywhere. Judged normwise when the graph held more than one call per set."""
    import torch

    from astra_sglang.harness.graphcheck import fresh_inputs, judge_sets, set_references

    spec = get_op("rope")
    dims = (4, 2, 1, 128, 128, 256, 128)
    fresh = fresh_inputs(spec, dims, "bf16", "normal", [7], device="cpu")
    k = 5
    refs = set_references(spec, fresh, dims, [k], None)
    walked = {n: v.clone() for n, v in fresh[0].items()}
    for n in ("q", "k"):
        walked[n] = refs[0][0][n].to(torch.bfloat16)
    q = walked["q"].float()
    i = int(q.abs().reshape(-1)[:256].argmin())  # a near-zero rotated element, moved by a few ulps of the rms
    q.reshape(-1)[i] += 0.02 * float(q.pow(2).mean().sqrt())
    walked["q"] = q.to(torch.bfloat16)
    f_elem, _ = judge_sets(spec, "production", [walked], fresh, refs, "bf16", None, "t", dims=dims)
    f_norm, errs = judge_sets(spec, "production", [walked], fresh, refs, "bf16", None, "t", dims=dims, repeats=[k])
    assert f_elem and not f_norm and errs["q"] < 0.01
    wrong = {n: v.clone() for n, v in walked.items()}
    for n in ("q", "k"):  # one call fewer than the graph held
        wrong[n] = set_references(spec, fresh, dims, [k - 1], None)[0][0][n].to(torch.bfloat16)
    f_wrong, _ = judge_sets(spec, "production", [wrong], fresh, refs, "bf16", None, "t", dims=dims, repeats=[k])
    assert f_wrong and "normwise error" in f_wrong[0]


def test_timed_graph_recheck_holds_a_case_production_does_not_take_to_the_alone_bound():
    """check's in-graph and stream re-checks judge as the eager check does: where production does not take the case
    (no production errors), the spec's `alone` bound, not the floor (the H200 failed qknorm_rope_store's jit_dense
    check on 3x5x1x64, bf16 k 0.281 > the floor 0.25, in the graph replay after the eager cases passed)."""
    import torch

    from astra_sglang.harness.graphcheck import fresh_inputs, judge_sets, set_references

    spec = get_op("qknorm_rope_store")
    dims = (3, 5, 1, 64, 448, 448, 448, 320)
    fresh = fresh_inputs(spec, dims, "bf16", "normal", [11], device="cpu")
    refs = set_references(spec, fresh, dims, [1], None)
    out = {n: v.clone() for n, v in fresh[0].items()}
    for n, r in refs[0][0].items():
        out[n] = r.to(out[n].dtype).reshape(out[n].shape)
    k = out["k"].float()
    i = int(k[0, :64].abs().argmax())  # one element of k's head off by 0.5 of its value: error 0.5
    k[0, i] *= 1.5
    out["k"] = k.to(torch.bfloat16)
    f_floor, _ = judge_sets(spec, "candidate", [out], fresh, refs, "bf16", None, "t", {}, dims=dims)
    f_alone, errs = judge_sets(spec, "candidate", [out], fresh, refs, "bf16", None, "t", {}, dims=dims, alone=True)
    assert f_floor and "k error" in f_floor[0] and "> tolerance 0.25" in f_floor[0]
    assert not f_alone and 0.25 < errs["k"] <= 1.0


def test_calls_seen_names_how_often_the_in_place_op_ran():
    """The timed-graph re-check's diagnosis: a set left as after 3 calls, where the graph holds 4, reads
    'closest to 3'; an untouched set reads 'closest to 0'."""
    import torch

    from astra_sglang.harness.bench import _calls_seen
    from astra_sglang.harness.graphcheck import fresh_inputs, set_references

    spec = get_op("rope")
    dims = (4, 2, 1, 128, 128, 256, 128)
    fresh = fresh_inputs(spec, dims, "bf16", "normal", [11], device="cpu")
    after3 = dict(fresh[0])
    for n in ("q", "k"):
        after3[n] = set_references(spec, fresh, dims, [3], None)[0][0][n].to(torch.bfloat16)
    assert "closest to 3 application(s)" in _calls_seen(spec, [after3], fresh, dims, 4, None, "candidate")
    assert "closest to 0 application(s)" in _calls_seen(spec, [dict(fresh[0])], fresh, dims, 4, None, "production")
    assert _calls_seen(get_op("silu_and_mul"), [{}], [{}], (1, 8), 4, None, "candidate") == ""
    # an inout the reference never defines (moe_experts' act scratch) says nothing: no diagnosis, no crash (a bench of
    # moe_experts died on `max()` of nothing here after a failed re-check)
    moe = get_op("moe_experts")
    mdims = (2, 64, 32, 8, 3)
    mfresh = fresh_inputs(moe, mdims, "bf16", "normal", [5], device="cpu")
    assert _calls_seen(moe, [dict(mfresh[0])], mfresh, mdims, 4, None, "candidate") == ""
