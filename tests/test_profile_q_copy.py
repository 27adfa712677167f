"""CPU tests of the profile's attention q copy: SGLang 0.5.17's fa3 backend calls q.contiguous() before it attends,
so where the rope left q a column view of qkv's output there is one torch copy a layer from 2 tokens on. The profile
tells it from every other torch copy by its place (after the layer's rope / KV store, before its attention) and the
eager step's shapes, shows it as its own row, counts it in the fused rows of the ops that write q into their own
buffer (their bench counts it from 2 tokens on), and the in-graph prediction of an A/B that switches q_out on counts
the copies it removes. On the real traces of results/2026-11-30-h200/session27 (Qwen2.5-7B, Qwen3-8B) and session28
(Qwen3-30B-A3B) the in-graph prediction read -1.65% / -1.52%, -1.83% and -2.61% / -0.86% for measured -1.63% / -1.55%,
-1.85% and -2.48% / -0.96% (before it: -0.23% / -0.01%, +0.06% and +0.06% / +0.11%); the last test re-reads
the Qwen2.5-7B and Qwen3-30B-A3B runs from their kept tarballs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from astra_sglang.e2e.profile import Q_COPY, Capture, analyze_capture
from astra_sglang.e2e.speedups import Speedup, SpeedupTable
from astra_sglang.e2e.step import predicted_from_profile
from astra_sglang.e2e.trace import exclusive_times
from step_kernels import step_kernels

CONFIGS = Path(__file__).resolve().parent.parent / "e2e" / "configs"
LLAMA = json.loads((CONFIGS / "llama3-8b" / "config.json").read_text())     # 32 q heads of 128: q is 4096 wide
G3 = json.loads((CONFIGS / "gemma3-12b" / "config.json").read_text())

NORM = "void astra_rms::(anonymous namespace)::rmsnorm_kernel<__nv_bfloat16>(...)"
GEMM = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
ROPE = "void (anonymous namespace)::fused_rope_kernel<true, 128, true, __nv_bfloat16>(...)"
STORE = "void store_kvcache<128>(...)"
ASTRA = "void astra_drs::(anonymous namespace)::rope_store_kernel<__nv_bfloat16, 128, true>(...)"
COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_"
        "kernel_cuda(at::TensorIteratorBase&)>(...)")
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(...)"
ATTN = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<int>>>(...)"
LAYERS = 3


def decode_step(tokens: int, rope: str = "sglang", q_dims=None):
    """One decode step of a Llama layout, (kernel, torch op, Dims). rope: "sglang" (its rope, then the KV store),
    "astra" (dense_rope_store with q in place) or "q_out" (dense_rope_store into its own buffer: no copy). fa3 copies
    a strided q from 2 tokens on; a torch fill before the step's first layer and after each attention stays torch's."""
    q = q_dims or [[tokens, 4096], [tokens, 4096], []]
    out = [(FILL, "aten::fill_", [[tokens], []]), (COPY, "aten::copy_", [[tokens], [tokens], []])]
    for _ in range(LAYERS):
        out += [(NORM, None, None), (GEMM, "aten::mm", [[tokens, 4096], [4096, 6144]])]
        out += [(ROPE, None, None), (STORE, None, None)] if rope == "sglang" else [(ASTRA, None, None)]
        if tokens > 1 and rope != "q_out":
            out.append((COPY, "aten::copy_", q))
        out += [(ATTN, "sgl_kernel::fwd", [[tokens, 32, 128]]), (FILL, "aten::fill_", [[1], []]),
                (GEMM, "aten::mm", [[tokens, 4096], [4096, 4096]])]
    return out


def durations(name: str) -> float:
    return {COPY: 2.0, GEMM: 10.0, ATTN: 8.0, ASTRA: 1.5}.get(name, 1.0)


def kernels(step, steps: int, shapes: bool):
    return step_kernels(step, steps, shapes, durations)


def analyze(cfg, tokens=2, rope="sglang", steps=2, table=None, q_dims=None, arm="A"):
    step = decode_step(tokens, rope, q_dims)
    graph = kernels(step, steps, shapes=False)
    exclusive_times(graph)
    return analyze_capture(graph, Capture("decode", tokens, tokens, steps, "t.json", arm=arm), cfg, table,
                           kernels(step, 1, shapes=True))


def rows(c) -> dict:
    return {r["op"]: r for r in c["ops"]}


def test_fa3_s_q_copy_has_its_own_row_and_every_other_torch_copy_stays_torch():
    r = rows(analyze(LLAMA))
    q = r[Q_COPY]
    assert q["calls_per_step"] == LAYERS and q["us_per_step"] == pytest.approx(2.0 * LAYERS)
    assert q["category"] == "op" and not q["covered"]
    # the step's input copy and fills stay torch's
    assert r["torch elementwise/copy"]["calls_per_step"] == 2 + LAYERS


def test_no_copy_at_one_token_and_none_after_an_op_that_writes_q_into_its_own_buffer():
    assert Q_COPY not in rows(analyze(LLAMA, tokens=1))
    assert Q_COPY not in rows(analyze(LLAMA, rope="q_out"))
    assert rows(analyze(LLAMA, rope="astra"))[Q_COPY]["calls_per_step"] == LAYERS   # astra's kernel with q in place


def test_a_copy_the_eager_step_shows_is_not_a_q_moves_nothing():
    r = rows(analyze(LLAMA, q_dims=[[2, 1000], [2, 1000], []]))
    assert Q_COPY not in r and r["torch elementwise/copy"]["calls_per_step"] == 2 + 2 * LAYERS
    # a [tokens, q heads, head_dim] copy (the 3-d view) is a q too
    assert Q_COPY in rows(analyze(LLAMA, q_dims=[[2, 32, 128], [2, 32, 128], []]))


def test_gemma_3_s_copy_stays_in_its_torch_q_k_path():
    """Gemma-3's q/k path rule (TORCH_QK_PATHS) already counts everything up to the attention input as
    gemma_qknorm_rope's production; the q copy rule does not apply there."""
    assert Q_COPY not in rows(analyze(G3))


class Table(SpeedupTable):
    """dense_rope_store's bench at Llama-3-8B's batch-2 dims, 2.0x over SGLang's rope + store + the launcher's copy."""

    def __init__(self):
        super().__init__([])

    def lookup(self, op, dims, dtype="bf16", variant=None):
        if op == "dense_rope_store" and tuple(dims or ())[:4] == (2, 32, 8, 128):
            return Speedup(2.0, "x".join(map(str, dims)), True, "bench_dense_rope_store.json", "2026-11-30")
        return None


def test_dense_rope_store_s_fused_row_counts_the_copy_it_removes():
    c = analyze(LLAMA, table=Table())
    f = {x["op"]: x for x in c["fused"]}["dense_rope_store"]
    assert f["replaces"] == ["rope", "kv_store", Q_COPY]
    assert f["us_per_step"] == pytest.approx((1.0 + 1.0 + 2.0) * LAYERS)
    assert f["saved_us"] == pytest.approx(f["us_per_step"] * (1 - 1 / 2.0))
    # at one token there is no copy to count
    f1 = {x["op"]: x for x in analyze(LLAMA, tokens=1)["fused"]}["dense_rope_store"]
    assert f1["replaces"] == ["rope", "kv_store"]


def test_the_in_graph_prediction_of_q_in_place_against_q_out_counts_the_copies():
    """A: dense_rope_store with q in place (fa3 copies); B: q into its own buffer. The op's own kernel time is the
    same in both; what B saves is A's q copies, which is the whole step's kernel difference here."""
    a, b = analyze(LLAMA, rope="astra"), analyze(LLAMA, rope="q_out", arm="B")
    p = predicted_from_profile({"captures": [a, b]}, "A", ["B"], {"A": "all", "B": "all"}, True)[("B", 2)]
    assert p["in_context_saved_us"] == pytest.approx(2.0 * LAYERS)
    assert p["kernel_step_delta_us"] == pytest.approx(2.0 * LAYERS)
    # an arm that patches no op writing q_out is not credited with copies it did not remove
    p = predicted_from_profile({"captures": [a, b]}, "A", ["B"], {"A": "all", "B": ["rmsnorm"]}, True)[("B", 2)]
    assert p["in_context_saved_us"] == pytest.approx(0.0)


def test_an_unpatched_base_s_copies_count_once_in_the_fused_row():
    """A: SGLang unpatched (rope, KV store, fa3's copy); B: dense_rope_store into q_out. The fused row already holds
    A's copies; the in-graph prediction counts them once: A's rope + store + copy against B's kernel."""
    a, b = analyze(LLAMA, table=Table()), analyze(LLAMA, rope="q_out", arm="B", table=Table())
    p = predicted_from_profile({"captures": [a, b]}, "A", ["B"], {"A": "none", "B": "all"})[("B", 2)]
    assert p["in_context_saved_us"] == pytest.approx((1.0 + 1.0 + 2.0 - 1.5) * LAYERS)
    assert p["kernel_step_delta_us"] == pytest.approx((1.0 + 1.0 + 2.0 - 1.5) * LAYERS)


# the kept runs of the records: (tarball, run dir, layers, {batch: measured step delta}) with arm A q in place, B q_out
RESULTS = Path(__file__).resolve().parent.parent / "results" / "2026-11-30-h200"
KEPT = [
    (RESULTS / "session28" / "m" / "step-qwen3-moe-qout.tar.gz", "step-qwen3-moe-qout", 20, {2: -0.0248, 16: -0.0096}),
    (RESULTS / "session27" / "b" / "step-qwen25-qout.tar.gz", "step-qwen25-qout", 28, {2: -0.0163, 16: -0.0155}),
]


@pytest.mark.parametrize("tarball,run,layers,measured", KEPT, ids=["qwen3-30b-a3b-20l", "qwen2.5-7b"])
def test_on_a_real_trace_the_q_copy_rule_finds_one_copy_a_layer_and_predicts_the_measured_step(
        tarball, run, layers, measured, tmp_path):
    """The rule on SGLang 0.5.17's own traces (H200, fa3; the kept step runs of sessions 27 and 28, re-analysed as
    `e2e --step --analyze` does): arm A's decode graphs from 2 tokens on hold one q copy a layer and B's none, and
    the in-graph prediction lands within 0.3 points of the step Δ measured in the same run."""
    import tarfile

    from astra_sglang.e2e.profile import analyze_dir
    from astra_sglang.e2e.step import analyze_only

    with tarfile.open(tarball) as t:
        t.extractall(tmp_path, filter="data")
    analysis = analyze_dir(tmp_path / run / "profile", SpeedupTable([]))
    decode = [c for c in analysis["captures"] if c["stage"] == "decode" and c["batch_size"] >= 2]
    assert {c["arm"] for c in decode} == {"A", "B"}
    for c in decode:
        copy = rows(c).get(Q_COPY)
        if c["arm"] == "A":
            assert copy and copy["calls_per_step"] == layers, (c["batch_size"], copy)
        else:
            assert copy is None
    analyze_only(tmp_path / run / "results.json", tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    got = {c["batch_size"]: (c["gpu_ms"]["delta"], c["predicted"]["in_context_delta"]) for c in summary["comparisons"]}
    for bs, want in measured.items():
        delta, predicted = got[bs]
        assert delta == pytest.approx(want, abs=5e-4) and predicted == pytest.approx(delta, abs=3e-3), (bs, got[bs])
