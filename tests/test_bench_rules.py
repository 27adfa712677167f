"""Issue 12 on the CPU: marginal-time statistics, the basis rule, the impossible-number rule, the row and
report fields other stages read, and the timed-graph verification logic (refill, references, judge) with
plain tensors standing in for a replayed graph's buffers."""
from __future__ import annotations

import json

import pytest

from astra_sglang.harness.bench import unmeasurable_context
from astra_sglang.harness.results import BenchReport, BenchRow
from astra_sglang.harness.rules import (CHAINED, COPY_CEILING_MARGIN, DECODE_MAX_TOKENS, IN_CONTEXT, impossible,
                                        timing_basis)
from astra_sglang.harness.stats import marginal
from astra_sglang.harness.timer import plan_context_calls


def test_marginal_time_is_the_median_of_paired_differences_with_an_absolute_spread():
    with_op = [10.0, 10.5, 11.0, 10.2, 30.0]  # one disturbed replay
    alone = [8.0, 8.4, 9.1, 8.1, 28.0]
    m = marginal(with_op, alone)
    assert m["median"] == pytest.approx(2.0)
    assert m["samples"] == pytest.approx([2.0, 2.1, 1.9, 2.1, 2.0])
    assert m["spread"] == pytest.approx(2.1 - 1.94, abs=1e-9)  # p90 - p10, µs (not relative)
    with pytest.raises(ValueError):
        marginal([], [])


@pytest.mark.parametrize("tokens,has_ctx,basis", [(1, True, IN_CONTEXT), (DECODE_MAX_TOKENS, True, IN_CONTEXT),
                                                  (DECODE_MAX_TOKENS + 1, True, CHAINED), (16, False, CHAINED)])
def test_basis_decode_rows_use_in_context(tokens, has_ctx, basis):
    assert timing_basis((tokens, 4096), has_ctx) == basis


def test_impossible_numbers_are_refused_with_the_reason():
    # 1 MB in 0.2 µs = 5000 GB/s against a 4000 GB/s ceiling with 2% spreads
    why = impossible("candidate", 0.2, 0.02, 1_000_000, 4000.0, 0.01, 0.8)
    assert "impossible number" in why and "above the measured copy ceiling 4000 GB/s" in why and "2.0%" in why
    # within spread + margin: accepted (the H200's 103% of the copy ceiling by a 2:1 read:write kernel)
    assert impossible("candidate", 1_000_000 / (4000.0 * 1.03) / 1e3, 0.005, 1_000_000, 4000.0, 0.003, 0.1) == ""
    assert impossible("candidate", 1_000_000 / (4000.0 * (1.0 + COPY_CEILING_MARGIN + 0.03)) / 1e3, 0.02,
                      1_000_000, 4000.0, 0.01, 0.1)
    # under the graph launch floor
    why = impossible("candidate", 0.5, 0.01, 1000, 4000.0, 0.01, 1.0, 0.02)
    assert "under the graph launch floor 1.000 µs" in why
    assert impossible("production", 0.99, 0.02, 1000, 4000.0, 0.01, 1.0, 0.0) == ""  # within the spread
    assert "non-positive" in impossible("candidate", 0.0, 0.0, 1, 1.0, 0.0, 0.0)


def test_a_read_stream_is_judged_against_the_read_ceiling():
    """The H200 of 2026-11-26: a decode GEMV's weight stream at 4575 GB/s, a 4095 GB/s copy ceiling (+11.7%: above
    the read:write-mix margin) and a faster read ceiling. Refused against the copy alone, accepted with the read one,
    and a kernel beyond both (skipping work) is still refused, naming both."""
    us = 205_585_408 / (4575.0 * 1e3)
    assert "impossible number" in impossible("candidate", us, 0.003, 205_585_408, 4095.0, 0.002, 0.5)
    assert impossible("candidate", us, 0.003, 205_585_408, 4095.0, 0.002, 0.5, read_ceiling_gbps=4600.0) == ""
    why = impossible("candidate", us / 3, 0.003, 205_585_408, 4095.0, 0.002, 0.5, read_ceiling_gbps=4600.0)
    assert "impossible number" in why and "read ceiling 4600 GB/s" in why


def _row(shape="16x4096", base=2.0, cand=1.9, pc=(1.6, 1.2)):
    r = BenchRow.make(shape, "fp16", [pc[0]] * 5, [pc[1]] * 5, 1 << 20, 4000.0)
    r.set_context({"median": base, "spread": 0.05}, {"median": cand, "spread": 0.08}, 20.0,
                  timing_basis(tuple(int(x) for x in shape.split("x")), True))
    return r


def test_a_row_whose_in_context_marginal_is_not_positive_says_chained_and_is_noted():
    """qknorm_rope_store 1x16x2x128 (H200, 2026-11-27): a 53 µs hiccup gave the candidate a marginal of -3.18 µs; the
    row kept its chained speedup but still said "in-context", so a geomean "in context" mixed in a chained row."""
    r = _row("1x16x2x128", base=1.42, cand=-3.18)
    assert r.context_speedup is None and r.timing_basis == CHAINED and r.speedup == r.chained_speedup
    note = unmeasurable_context(r)
    assert "in-context timing not measured" in note and "-3.18" in note  # the footer's IN CONTEXT NOT MEASURED line
    assert unmeasurable_context(_row()) == ""
    baseline_only = BenchRow.make("1x4096", "fp16", [1.6] * 5, None, 1 << 20, 4000.0)
    baseline_only.set_context({"median": 2.0, "spread": 0.05}, None, 20.0, IN_CONTEXT)
    assert baseline_only.timing_basis == IN_CONTEXT and unmeasurable_context(baseline_only) == ""


def test_row_speedup_follows_the_basis_and_keeps_both_numbers():
    r = _row()
    assert r.chained_speedup == pytest.approx(1.6 / 1.2)
    assert r.context_speedup == pytest.approx(2.0 / 1.9)
    assert r.timing_basis == IN_CONTEXT and r.speedup == r.context_speedup
    assert r.context_spread_us == pytest.approx(0.08)
    assert not r.noise  # 0.1 µs difference > 0.08 µs spread
    big = _row("4096x4096")
    assert big.timing_basis == CHAINED and big.speedup == big.chained_speedup
    assert _row(base=2.0, cand=1.95).noise


def test_report_contract_fields_geomean_and_table_say_the_basis(tmp_path):
    rep = BenchReport(op="silu_and_mul", rows=[_row(), _row("4096x4096")], ceiling_gbps=4000.0)
    d = json.loads(rep.to_json(tmp_path / "r.json").read_text())
    for row in d["rows"]:
        for k in ("context_base_us", "context_cand_us", "context_spread_us", "context_speedup", "timing_basis", "speedup"):
            assert k in row
    assert d["rows"][0]["speedup"] == pytest.approx(2.0 / 1.9)
    assert rep.geomean == pytest.approx(((2.0 / 1.9) * (1.6 / 1.2)) ** 0.5)
    t = rep.table()
    assert "in-context" in t and "chained" in t and "basis per row" in t
    back = BenchReport.from_json(tmp_path / "r.json")
    assert back.rows[0].timing_basis == IN_CONTEXT and back.geomean == pytest.approx(rep.geomean)
    rep.rows[1].failed = "4096x4096 fp16: candidate: impossible number: ..."
    assert "REFUSED 4096x4096 fp16" in rep.table()


def test_context_plan_is_bounded():
    assert plan_context_calls(0, 1.0, 4000.0) == 256
    assert plan_context_calls(1 << 30, 100.0, 4000.0) == 4


# ------------------------------------------------------------------ timed-graph verification logic (CPU)

torch = pytest.importorskip("torch")


def _spec_and_sets(n=3, dims=(3, 64)):
    from astra_sglang.harness.graphcheck import fresh_inputs
    from astra_sglang.registry import get_op

    spec = get_op("silu_and_mul")
    fresh = fresh_inputs(spec, dims, "fp16", "normal", list(range(n)), device="cpu")
    sets = [{k: torch.empty_like(v) for k, v in t.items()} for t in fresh]
    return spec, dims, fresh, sets


def _silu(s):
    x = s["input"].float()
    d = x.shape[-1] // 2
    s["out"].copy_((torch.nn.functional.silu(x[..., :d]) * x[..., d:]).to(s["out"].dtype))


def test_refill_poisons_outputs_and_judge_accepts_an_honest_replay():
    from astra_sglang.harness.graphcheck import judge_sets, refill, set_references

    spec, dims, fresh, sets = _spec_and_sets()
    refill(spec, sets, None, fresh, None)
    assert all(torch.isnan(s["out"]).all() for s in sets)
    refs = set_references(spec, fresh, dims, [1] * len(sets), None)
    for s in sets:
        _silu(s)
    f, perr = judge_sets(spec, "production", sets, fresh, refs, "fp16", None, "t")
    assert not f and perr["out"] < 1e-2
    f, _ = judge_sets(spec, "candidate", sets, fresh, refs, "fp16", None, "t", perr)
    assert not f


def test_judge_names_the_set_a_lazy_replay_left_alone():
    from astra_sglang.harness.graphcheck import judge_sets, refill, set_references

    spec, dims, fresh, sets = _spec_and_sets()
    refill(spec, sets, None, fresh, None)
    refs = set_references(spec, fresh, dims, [1] * 3, None)
    _silu(sets[0])
    _silu(sets[2])  # set 2 of 3 never written (a graph that skips work during capture)
    f, _ = judge_sets(spec, "candidate", sets, fresh, refs, "fp16", None, "timed graph", {"out": 1e-3})
    assert f and "input set 2 of 3: candidate never wrote 192 of 192 elements of out (poison left)" in f[0]


def test_judge_catches_stale_results_from_the_previous_inputs():
    from astra_sglang.harness.graphcheck import fresh_inputs, judge_sets, refill, set_references

    spec, dims, fresh, sets = _spec_and_sets()
    old = fresh_inputs(spec, dims, "fp16", "normal", [10, 11, 12], device="cpu")
    refill(spec, sets, None, old, None)
    for s in sets:
        _silu(s)
    memo = [s["out"].clone() for s in sets]
    refill(spec, sets, None, fresh, None)  # same pointers, fresh values
    for s, m in zip(sets, memo):
        s["out"].copy_(m)  # a kernel that memoized by pointer
    refs = set_references(spec, fresh, dims, [1] * 3, None)
    f, _ = judge_sets(spec, "candidate", sets, fresh, refs, "fp16", None, "timed graph", {"out": 1e-3})
    assert f and "input set 1 of 3: candidate's out error" in f[0] and "> tolerance" in f[0]


def test_in_place_reference_applies_the_op_as_often_as_the_graph_calls_it():
    from astra_sglang.harness.graphcheck import calls_per_set
    from astra_sglang.harness.oracle import references
    from astra_sglang.registry import get_op

    assert calls_per_set(10, 4) == [3, 3, 2, 2] and sum(calls_per_set(4096, 7)) == 4096
    spec = get_op("fused_add_rmsnorm")
    gen = torch.Generator().manual_seed(0)
    dims = (2, 64)
    t = spec.make_inputs(dims, "fp32", gen, "normal", device="cpu")
    scalars = spec.scalars(dims)
    once, _ = references(spec, t, dims, scalars, None, 1)
    twice, _ = references(spec, t, dims, scalars, None, 2)
    step = {k: v.to(torch.float64) for k, v in t.items()}
    step.update(once)
    again = spec.reference(step, dims, scalars)
    for k in twice:
        assert torch.allclose(twice[k], again[k])


# ------------------------------------------------------------------ --baseline installed (CPU parts)


def test_installed_callable_is_called_through_the_adapter(tmp_path, monkeypatch):
    import sys

    from astra_sglang.harness.impl import Impl
    from astra_sglang.registry import get_op

    (tmp_path / "fake_sgl_ops.py").write_text(
        "import torch\n"
        "calls = []\n"
        "def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):\n"
        "    calls.append(eps)\n"
        "    residual += input\n"
        "    r = residual.float()\n"
        "    input.copy_((r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(input.dtype))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = get_op("fused_add_rmsnorm")
    impl = Impl("installed:fake_sgl_ops:fused_add_rmsnorm", spec)
    dims = (4, 64)
    t = spec.make_inputs(dims, "fp32", torch.Generator().manual_seed(1), "normal", device="cpu")
    ref = spec.reference({k: v.to(torch.float64) for k, v in t.items()}, dims, spec.scalars(dims))
    assert impl(t, dims, "fp32", spec.scalars(dims)) == 0
    assert sys.modules["fake_sgl_ops"].calls == [spec.scalars(dims)["eps"]]
    for k in ref:
        assert torch.allclose(t[k].double(), ref[k], rtol=1e-4, atol=1e-4)


def test_installed_baseline_needs_an_installed_sglang(monkeypatch):
    from astra_sglang.errors import AstraError
    from astra_sglang.harness.installed import resolve_installed
    from astra_sglang.registry import get_op

    spec = get_op("silu_and_mul")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(AstraError, match="--baseline installed: none of sgl_kernel"):
        resolve_installed(spec)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name.startswith("sglang.srt") else None)
    assert resolve_installed(spec) == "sglang.srt.layers.activation:silu_and_mul"


def test_report_shows_the_installed_baseline_and_its_bits():
    r = _row()
    r.set_installed([2.1, 2.0, 2.2], {"out": 0})
    rep = BenchReport(op="silu_and_mul", rows=[r], installed="sgl_kernel:silu_and_mul")
    t = rep.table()
    assert "inst µs" in t and "equal" in t and "installed baseline: sgl_kernel:silu_and_mul" in t
    r.set_installed([2.1], {"out": 3})
    assert r.installed_bitwise_equal is False and "3 differ" in rep.table()


def test_report_gives_the_candidate_over_the_installed_callable_and_the_rows_it_could_not_time():
    """--baseline installed on moe_combine (H200, 2026-11-29): the speedup columns are over the extracted baseline, so
    the footer gives the ratio people ran it for, and says which rows the installed callable was not timed on (its
    columns read "—" there, which is not a row where it lost)."""
    a, b = _row("1x4096", cand=1.0), _row("8x4096", cand=1.0)
    a.set_installed([2.0] * 3, {"out": 0})
    a.context_installed_us = 1.5
    rep = BenchReport(op="moe_combine", rows=[a, b], installed="sglang.x:moe_sum_reduce_torch_compile",
                      notes=["8x4096 fp16: installed could not be captured/run: CUDA error: operation failed"])
    t = rep.table()
    assert "over the installed baseline, chained: geomean 1.667x over 1 rows" in t        # 2.0 / 1.2
    assert "over the installed baseline, in context: geomean 1.500x over 1 rows" in t     # 1.5 / 1.0
    assert "INSTALLED NOT TIMED on 1 of 2 rows, first: 8x4096 fp16: installed could not" in t
    assert "INSTALLED NOT TIMED" not in BenchReport(op="moe_combine", rows=[a], installed="x:y").table()


def test_graph_of_warms_every_input_set_before_capture(monkeypatch):
    """A torch.compile'd installed callable recompiles on an input set its guards have not seen; inside capture that
    broke moe_combine's compiled sum on 3 of 8 rows (H200, 2026-11-29). Every set runs once eagerly first."""
    import contextlib

    from astra_sglang.harness import timer

    class _Stream:
        def wait_stream(self, other):
            pass

    phase = ["eager"]
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())

    @contextlib.contextmanager
    def capture(g):
        phase[0] = "capture"
        yield

    monkeypatch.setattr(torch.cuda, "graph", capture)
    calls = []
    timer.graph_of(lambda i: calls.append((phase[0], i)), 6, warm=3)
    assert calls[:3] == [("eager", 0), ("eager", 1), ("eager", 2)]
    assert calls[3:] == [("capture", i) for i in range(6)]
    calls.clear()
    phase[0] = "eager"
    timer.graph_of(lambda i: calls.append((phase[0], i)), 2, warm=5)   # never more warm-up calls than captured ones
    assert [c for c in calls if c[0] == "eager"] == [("eager", 0), ("eager", 1)]


@pytest.mark.gpu
def test_a_compiled_callable_is_captured_over_input_sets_of_different_kinds():
    """bench's set 0 is a view into guarded buffers, the other sets plain tensors: a torch.compile'd callable warmed
    on set 0 alone could recompile inside capture (moe_combine's installed sum, H200, 2026-11-29)."""
    from astra_sglang.harness.timer import graph_of

    f = torch.compile(lambda x, out: torch.sum(x, dim=1, out=out))
    big = torch.randn(8 + 8 * 8 * 2048, device="cuda", dtype=torch.bfloat16)
    sets = [(big[8:].view(8, 8, 2048), torch.empty(8, 2048, device="cuda", dtype=torch.bfloat16)),
            (torch.randn(8, 8, 2048, device="cuda", dtype=torch.bfloat16),
             torch.empty(8, 2048, device="cuda", dtype=torch.bfloat16))]
    g = graph_of(lambda i: f(*sets[i % 2]), 4, warm=2)
    for _, out in sets:
        out.zero_()
    g.replay()
    torch.cuda.synchronize()
    for x, out in sets:
        torch.testing.assert_close(out, x.sum(1))


@pytest.mark.gpu
def test_the_q_out_launchers_one_token_copy_is_captured_as_bench_times_it():
    """spec.launcher_only of the q_out ops (qkv.launcher_q_copy): at 1 token bench captures the launcher's copy of q's
    row into q_out alone, over its input sets, to take it out of production; the graph copies exactly q's heads."""
    from astra_sglang.harness.timer import graph_of
    from astra_sglang.registry import get_op

    spec = get_op("dense_rope_store")
    dims = next(s.dims for s in spec.corpus if s.dims[0] == 1)
    copy = spec.launcher_only(dims)
    sets = [spec.make_inputs(dims, "bf16", torch.Generator(device="cuda").manual_seed(i), device="cuda")
            for i in range(2)]
    g = graph_of(lambda i: copy(sets[i % 2]), 4, warm=2)
    w = dims[1] * dims[3]
    for s in sets:
        s["q_out"].zero_()
    g.replay()
    torch.cuda.synchronize()
    for s in sets:
        assert torch.equal(s["q_out"][:, :w], s["q"][:, :w])


class _FakeGraph:
    """Stands in for a captured in-context graph: replay() runs the producer and the op on set 0."""

    def __init__(self, fn):
        self.replay = fn


@pytest.mark.parametrize("stale,expect", [(False, ""), (True, "candidate's out error")])
def test_in_context_graph_outputs_are_checked_against_the_producers_values(monkeypatch, stale, expect):
    from astra_sglang.harness.bench import verify_context_graphs

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    spec, dims, fresh, sets = _spec_and_sets(n=1)
    s = sets[0]
    s["input"].copy_(fresh[0]["input"])
    # the producer alternates two activations (timer.Neighbours): the last call's input differs from the one before
    prev, last = (torch.randn(s["input"].shape, generator=torch.Generator().manual_seed(k)).to(s["input"].dtype)
                  for k in (5, 6))

    def honest():
        s["input"].copy_(prev)
        _silu(s)
        s["input"].copy_(last)
        _silu(s)

    def early_read():  # reads its input before the producer's write lands (PDL prefetch before the wait)
        s["input"].copy_(prev)
        _silu(s)
        _silu(s)
        s["input"].copy_(last)

    graphs = [_FakeGraph(honest), _FakeGraph(early_read if stale else honest)]
    why = verify_context_graphs(spec, graphs, [("production", None), ("candidate", None)], sets, sets, None,
                                dims, "fp16", 4)
    assert (expect in why) if expect else why == ""
    if expect:
        assert "timed in-context graph" in why


def test_copy_all_restores_every_tensor_in_place():
    """bench's restore of in-place sets before each replay: same pointers, every element, any dtype mix."""
    torch = pytest.importorskip("torch")
    from astra_sglang.harness.bench import copy_all

    src = [torch.randn(7, 5).to(torch.bfloat16), torch.randn(3), torch.arange(11, dtype=torch.int32)]
    dst = [torch.zeros_like(t) for t in src]
    ptrs = [t.data_ptr() for t in dst]
    copy_all(dst, src)
    assert [t.data_ptr() for t in dst] == ptrs and all(torch.equal(d, s) for d, s in zip(dst, src))
    copy_all([], [])


@pytest.mark.parametrize("consumer_k", [None, 96])
def test_in_context_neighbours_are_linear_layers_around_the_op(consumer_k):
    """Producer and consumer are F.linear with [out, in] weights (SGLang's linear layers, cuBLAS TN);
    --consumer-width sets the consumer's output width (a model's next GEMM)."""
    from astra_sglang.harness.timer import CONTEXT_K, Neighbours

    spec, dims, fresh, sets = _spec_and_sets(n=1, dims=(3, 64))
    s = {k: v.float() for k, v in sets[0].items()}          # CPU matmuls in fp32
    nb = Neighbours(spec, s, k=32, consumer_k=consumer_k)
    assert nb.b.shape == (128, 32) and nb.c.shape == (consumer_k or 32, 64)   # silu: in 2 x 64, out 64
    nb.produce(s, 1)
    assert torch.allclose(s["input"], nb.a[1] @ nb.b.T)
    s["out"].copy_(torch.randn_like(s["out"]))
    nb.consume(s)
    assert nb.y.shape == (3, consumer_k or 32) and torch.allclose(nb.y, s["out"] @ nb.c.T, atol=1e-5)
    assert CONTEXT_K == 4096


def test_neighbours_run_the_gemm_a_patched_server_runs_where_it_takes_the_shape():
    """bench --neighbours astra: a GEMM that does not decline the producer's (consumer's) shape runs it instead of
    F.linear, with the producer's activation, weight and the op's input as (x, w, out); `kinds` says which ran."""
    from astra_sglang.harness.timer import Neighbours

    spec, dims, fresh, sets = _spec_and_sets(n=1, dims=(3, 64))
    s = {k: v.float() for k, v in sets[0].items()}
    calls = []

    class Gemm:   # takes the producer (3 x 32 -> 128) and declines the consumer (3 x 64 -> 48)
        @staticmethod
        def declines(tokens, in_features, out_features, dtype):
            return None if (tokens, in_features, out_features) == (3, 32, 128) else "not this one"

        def __call__(self, x, w, out):
            calls.append((tuple(x.shape), tuple(w.shape), tuple(out.shape)))
            out.copy_(x @ w.T * 2)   # not F.linear's result: shows which one ran

    nb = Neighbours(spec, s, k=32, consumer_k=48, gemm=Gemm())
    assert nb.kinds == ("linear", "cuBLAS")
    nb.produce(s, 1)
    assert calls == [((3, 32), (128, 32), (3, 128))] and torch.allclose(s["input"], 2 * nb.a[1] @ nb.b.T)
    s["out"].copy_(torch.randn_like(s["out"]))
    nb.consume(s)
    assert len(calls) == 1 and torch.allclose(nb.y, s["out"] @ nb.c.T, atol=1e-5)
    assert Neighbours(spec, s, k=32).kinds == ("cuBLAS", "cuBLAS")
    strided = dict(s, input=torch.randn(3, 256)[:, ::2])   # a column view: F.linear keeps the producer
    assert Neighbours(spec, strided, k=32, consumer_k=48, gemm=Gemm()).kinds == ("cuBLAS", "cuBLAS")


def test_a_norm_after_the_op_reads_its_output_and_feeds_the_consumer_gemm():
    """sites.Site.norm_after (a MoE combine's output goes through the next layer's norm, then qkv): the norm reads the
    op's output, writes a scratch, and the consumer GEMM reads that; the op's output is left as the op wrote it."""
    from astra_sglang.harness.timer import Neighbours

    spec, dims, fresh, sets = _spec_and_sets(n=1, dims=(3, 64))
    s = {k: v.float() for k, v in sets[0].items()}
    seen = []

    def norm(x, w, out):   # stands in for neighbour_gemm.AstraRMSNorm
        seen.append(x.data_ptr())
        out.copy_(x * x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt() * w)

    nb = Neighbours(spec, s, k=32, consumer_k=48, norm=norm)
    assert nb.kinds == ("cuBLAS", "rmsnorm + cuBLAS") and nb.normed.shape == (3, 64) and nb.post_w.shape == (64,)
    assert nb.pre is None and nb.pre_w is None
    s["out"].copy_(torch.randn_like(s["out"]))
    before = s["out"].clone()
    nb.consume(s)
    assert seen == [s["out"].data_ptr()] and torch.equal(s["out"], before)
    assert torch.allclose(nb.y, nb.normed @ nb.c.T, atol=1e-5) and not torch.allclose(nb.y, s["out"] @ nb.c.T)
    # a norm that cannot run after this op's output dtype: said before any capture (bench notes the row)
    from astra_sglang.harness.neighbour_gemm import AstraRMSNorm

    norm.declines = AstraRMSNorm.declines
    with pytest.raises(ValueError, match="takes fp16 / bf16"):
        Neighbours(spec, s, k=32, norm=norm)   # fp32 here


def test_a_norm_before_the_op_reads_the_producers_output_and_writes_the_ops_input():
    """sites.Site.norm_before (a Gemma layer's second norm of a pair: o_proj -> post-attention norm -> the op): the
    producer GEMM writes a scratch, the norm reads it and writes the op's input; the consumer reads the op's output."""
    from astra_sglang.harness.timer import Neighbours

    spec, dims, fresh, sets = _spec_and_sets(n=1, dims=(3, 64))
    s = {k: v.float() for k, v in sets[0].items()}
    seen = []

    def norm(x, w, out):   # stands in for neighbour_gemm.AstraRMSNorm
        seen.append((x.data_ptr(), out.data_ptr()))
        out.copy_(x * x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt() * w)

    nb = Neighbours(spec, s, k=32, consumer_k=48, norm=norm, norm_before=True)
    assert nb.kinds == ("cuBLAS + rmsnorm", "cuBLAS") and nb.pre.shape == s["input"].shape == (3, 128)
    assert nb.normed is None and nb.post_w is None and nb.pre_w.shape == (128,)
    nb.produce(s, 1)
    assert seen == [(nb.pre.data_ptr(), s["input"].data_ptr())]
    assert torch.allclose(nb.pre, nb.a[1] @ nb.b.T, atol=1e-5)
    assert torch.allclose(s["input"], nb.pre * nb.pre.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt() * nb.pre_w)
    s["out"].copy_(torch.randn_like(s["out"]))
    nb.consume(s)
    assert len(seen) == 1 and torch.allclose(nb.y, s["out"] @ nb.c.T, atol=1e-5)


def test_a_norm_on_each_side_of_the_op_has_its_own_weight():
    """A site with norm_before and norm_after (Qwen3: qkv -> q/k norm -> rope -> KV store): the producer's scratch goes
    through one norm into the op's input, the op's output through the other into the consumer GEMM, each norm with a
    weight over its own width."""
    from astra_sglang.harness.timer import Neighbours

    spec, dims, fresh, sets = _spec_and_sets(n=1, dims=(3, 64))
    s = {k: v.float() for k, v in sets[0].items()}
    seen = []

    def norm(x, w, out):   # stands in for neighbour_gemm.AstraRMSNorm
        seen.append((x.data_ptr(), w.shape[0], out.data_ptr()))
        out.copy_(x * x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt() * w)

    nb = Neighbours(spec, s, k=32, consumer_k=48, norm=norm, norm_before=True, norm_after=True)
    assert nb.kinds == ("cuBLAS + rmsnorm", "rmsnorm + cuBLAS")
    assert nb.pre_w.shape == (128,) and nb.post_w.shape == (64,)
    nb.produce(s, 0)
    s["out"].copy_(torch.randn_like(s["out"]))
    nb.consume(s)
    assert seen == [(nb.pre.data_ptr(), 128, s["input"].data_ptr()), (s["out"].data_ptr(), 64, nb.normed.data_ptr())]
    assert torch.allclose(nb.y, nb.normed @ nb.c.T, atol=1e-5)


def test_the_astra_neighbour_follows_linears_adapter():
    """Which GEMMs a patched server runs as astra's linear: the adapter's rule (tokens, widths), fp16 / bf16 only."""
    from astra_sglang.harness.neighbour_gemm import linear_declines

    assert linear_declines(1, 4096, 6144, torch.bfloat16) is None
    assert linear_declines(2, 14336, 4096, torch.float16) is None
    assert "tokens" in linear_declines(64, 4096, 4096, torch.bfloat16)
    assert "fp16 / bf16" in linear_declines(1, 4096, 4096, torch.float32)
    assert "multiple of 8" in linear_declines(1, 4100, 4096, torch.bfloat16)


def test_in_context_neighbours_of_an_integer_op_use_bf16_activations_of_its_rows():
    """moe_align reads int32 expert ids and writes int32 sorted ids: a GEMM can do neither (torch refuses:
    "normal_kernel_cuda not implemented for 'Int'", so every in-context row went unmeasured). The producer then
    writes, and the consumer reads, a bf16 activation of the op's rows; the op's own tensors stay untouched."""
    from types import SimpleNamespace

    from astra_sglang.harness.timer import Neighbours

    abi = [SimpleNamespace(name="topk_ids", ctype="ptr", role="in"),
           SimpleNamespace(name="sorted_ids", ctype="ptr", role="out")]
    spec = SimpleNamespace(abi=abi)
    ids = torch.randint(0, 64, (5, 8), dtype=torch.int32)
    s = {"topk_ids": ids.clone(), "sorted_ids": torch.zeros(300, dtype=torch.int32)}
    nb = Neighbours(spec, s, k=32, consumer_k=48)
    assert nb.src_scratch.shape == (5, 8) and nb.src_scratch.dtype == torch.bfloat16
    assert nb.dst_scratch.shape == (5, 32) and nb.y.shape == (5, 48)
    nb.produce(s, 0)
    assert torch.allclose(nb.src_scratch.float(), (nb.a[0] @ nb.b.T).float(), atol=1e-2)
    nb.consume(s)
    assert torch.equal(s["topk_ids"], ids) and not s["sorted_ids"].any()
    # a float op keeps the data dependency: no scratch
    f = {"topk_ids": torch.randn(5, 8), "sorted_ids": torch.zeros(5, 4)}
    nb = Neighbours(spec, f, k=32)
    assert nb.src_scratch is None and nb.dst_scratch is None


def test_timed_graph_recheck_judges_a_spread_of_a_long_rotation():
    """Up to CHECK_SETS sets are all judged; a longer rotation (tiny ops: up to 16384 sets, ~25 s a row for
    moe_align when every set was judged) gives CHECK_SETS of them, evenly spread, the first and the last included."""
    from astra_sglang.harness.graphcheck import CHECK_SETS, checked_sets

    assert checked_sets(7) == list(range(7)) and checked_sets(CHECK_SETS) == list(range(CHECK_SETS))
    idx = checked_sets(16384)
    assert len(idx) == CHECK_SETS and idx[0] == 0 and idx[-1] == 16383 and idx == sorted(set(idx))
    gaps = {b - a for a, b in zip(idx, idx[1:])}
    assert max(gaps) - min(gaps) <= 1       # evenly spread
    assert checked_sets(10, limit=4) == [0, 3, 6, 9]


@pytest.mark.gpu
@pytest.mark.nvcc
def test_astras_rmsnorm_as_the_norm_after_the_op_matches_torch():
    """The norm bench runs between an op and its consumer GEMM at a norm_after site: kernels/rmsnorm built and called
    through its ABI, out of place."""
    from astra_sglang.harness.neighbour_gemm import AstraRMSNorm
    from astra_sglang.patch.apply import build_kernel

    norm = AstraRMSNorm(str(build_kernel("rmsnorm")))
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(2048, device="cuda")).to(torch.bfloat16)
    out = torch.empty_like(x)
    keep = x.clone()
    norm(x, w, out)
    torch.cuda.synchronize()
    ref = (x.float() * x.float().pow(2).mean(-1, keepdim=True).add(norm.EPS).rsqrt() * w.float())
    assert torch.equal(x, keep) and torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
