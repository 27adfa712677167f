"""CPU tests of the profile's Gemma-3 q/k path: SGLang 0.5.17 runs Gemma-3's q/k norm + rope as ~20 torch ops a layer
(Gemma3Attention.forward_native), whose kernels share their names with every other torch op. The profile attributes
them to gemma_qknorm_rope by their place in the layer (e2e/profile.py qk_path_runs, kernel_matcher), so the op has a
row, a bench prediction and an in-graph one (they read -0.21% / -1.04% for a measured -17.98% step, H200,
results/2026-11-29-h200/session22/steps/step-gemma3-12b-qknr)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from astra_sglang.e2e.attribution import short_name
from astra_sglang.e2e.neighbours import compare_dir
from astra_sglang.e2e.profile import Capture, analyze_capture
from astra_sglang.e2e.speedups import Speedup, SpeedupTable
from astra_sglang.e2e.step import predicted_from_profile
from astra_sglang.e2e.trace import exclusive_times
from step_kernels import step_kernels

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "e2e" / "configs"
G3 = json.loads((CONFIGS / "gemma3-12b" / "config.json").read_text())     # 16 q heads, 8 kv heads, head_dim 256
LLAMA = json.loads((CONFIGS / "llama3-8b" / "config.json").read_text())

# kernel names as torch, inductor and SGLang name them
COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>(...)"
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, MulFunctor>>(...)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>>(...)"
POW = "void at::native::vectorized_elementwise_kernel<4, at::native::pow_tensor_scalar_kernel_impl<float>>(...)"
RSQRT = "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda<float>>(...)"
MEAN = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
        "float>, unsigned int, float, 4, 4> >(...)")
ROPE_Q = "triton_poi_fused__to_copy_add_cat_mul_neg_slice_unsqueeze_0"
ROPE_K = "triton_poi_fused_add_cat_mul_neg_slice_unsqueeze_1"
ARGMAX = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
          "unsigned int, long, 4, 4> >(...)")
EMBED = "void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(...)"
NORM = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)"
GEMM = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
STORE = "void store_kvcache<256>(...)"
ATTN = "_fwd_grouped_kernel_stage1"
ASTRA = "void astra_gqkr::(anonymous namespace)::gemma_qknorm_rope_kernel<256>(...)"
LAYERS = 2


def norm_ops(heads: int):
    """Gemma3RMSNorm.forward_native on a [1, heads, 1, 256] view: (kernel, torch op, input Dims)."""
    x, r = [1, heads, 1, 256], [1, heads, 1, 1]
    return [(COPY, "aten::_to_copy", [x]), (POW, "aten::pow", [x, []]), (MEAN, "aten::mean", [x, [], [], []]),
            (ADD, "aten::add", [r, []]), (RSQRT, "aten::rsqrt", [r]), (MUL, "aten::mul", [x, r]),
            (COPY, "aten::_to_copy", [[256]]), (ADD, "aten::add", [[256], []]), (MUL, "aten::mul", [x, [256]]),
            (COPY, "aten::_to_copy", [x])]


def qk_torch():
    """The q/k path of one layer, unpatched: q_norm, k_norm, the compiled rope (inductor records no shapes)."""
    return norm_ops(16) + norm_ops(8) + [(ROPE_Q, None, None), (ROPE_K, None, None)]


def decode_step(patched: bool, torch_path=qk_torch):
    """One decode step of a Gemma-3 layout: (kernel, torch op, Dims). The embedding's scale, the step's cos/sin rows
    and the sampling run torch elementwise kernels of the very names the q/k path runs."""
    out = [(EMBED, "aten::index_select", [[262208, 3840], [1]]), (MUL, "aten::mul", [[1, 3840], []]),
           (MUL, "aten::mul", [[1, 128], [1]]), (COPY, "aten::_to_copy", [[1, 1, 256]])]   # positions -> cos/sin
    for _ in range(LAYERS):
        out += [(NORM, None, None), (GEMM, "aten::mm", [[1, 3840], [3840, 8192]])]
        out += [(ASTRA, None, None)] if patched else torch_path()
        out += [(STORE, None, None), (ATTN, None, None), (GEMM, "aten::mm", [[1, 4096], [4096, 3840]]),
                (NORM, None, None), (GEMM, "aten::mm", [[1, 3840], [3840, 30720]]), (MUL, "aten::mul", [[1, 15360]]),
                (GEMM, "aten::mm", [[1, 15360], [15360, 3840]])]
    out += [(NORM, None, None), (GEMM, "aten::mm", [[1, 3840], [3840, 262208]]),
            (MUL, "aten::mul", [[1, 262208], []]), (ARGMAX, "aten::argmax", [[1, 262208]])]
    return out


def durations(name: str) -> float:
    """µs of one call: torch's kernels 1.5 each (in the q/k path or not), astra's 2.0, the GEMMs 20, ..."""
    if name in (COPY, MUL, ADD, POW, RSQRT, MEAN, ROPE_Q, ROPE_K):
        return 1.5
    return {ASTRA: 2.0, GEMM: 20.0, ATTN: 6.0}.get(name, 3.0)


def kernels(step, steps: int, shapes: bool):
    """The step's kernels back to back on one stream (a graph replay), with their torch op's Dims where `shapes`."""
    return step_kernels(step, steps, shapes, durations)


def analyze(cfg, patched=False, steps=2, table=None, step=None):
    step = step or decode_step(patched)
    graph = kernels(step, steps, shapes=False)
    exclusive_times(graph)
    return analyze_capture(graph, Capture("decode", 1, 1, steps, "t.json", arm="B" if patched else "A"), cfg,
                           table, kernels(step, 1, shapes=True))


PATH_US = (10 * 2 + 2) * 1.5 * LAYERS     # 22 kernels a layer at 1.5 µs


def test_gemma3_s_torch_q_k_path_is_gemma_qknorm_rope_s_production_and_nothing_else_is():
    c = analyze(G3)
    rows = {r["op"]: r for r in c["ops"]}
    q = rows["gemma_qknorm_rope"]
    assert q["covered"] and not q["astra_kernel"] and q["category"] == "op"
    assert q["us_per_step"] == pytest.approx(PATH_US) and q["calls_per_step"] == 22 * LAYERS
    assert q["shape_source"] == "profiler" and any("1x16x1x256 (aten::mean)" in s for s in q["shapes"])
    # the embedding's scale, the cos/sin rows, the MLP's mul and the sampling's scale stay torch elementwise ...
    assert rows["torch elementwise/copy"]["calls_per_step"] == 3 + LAYERS + 1
    assert rows["torch elementwise/copy"]["us_per_step"] == pytest.approx(1.5 * (3 + LAYERS + 1))
    # ... the argmax stays sampling, and no mean is left outside the path
    assert rows["sampling/logits"]["calls_per_step"] == 1 and "torch mean" not in rows
    assert {t["op"] for t in c["top_kernels"] if t["kernel"].startswith("at::native::vectorized_elementwise")} == {
        "gemma_qknorm_rope", "torch elementwise/copy"}   # one kernel name, two ops: kept apart


def test_another_model_s_torch_kernels_stay_torch_elementwise():
    """The same kernels between a Llama's qkv GEMM and its KV store are not attributed: the rule is Gemma-3's."""
    c = analyze(LLAMA)
    ops = {r["op"]: r for r in c["ops"]}
    assert "gemma_qknorm_rope" not in ops
    # per layer the norms' 18 elementwise kernels and the rope's first (inductor's name has "_to_copy"), 2 means
    assert ops["torch elementwise/copy"]["calls_per_step"] == 3 + LAYERS + 1 + 19 * LAYERS
    assert ops["torch mean"]["calls_per_step"] == 2 * LAYERS
    assert ops[f"other: {short_name(ROPE_K, 40)}"]["calls_per_step"] == LAYERS


def test_a_run_the_eager_step_shows_off_the_q_k_tensors_moves_nothing():
    """Where the eager step's shapes say a kernel of a run did not run on q or k (another SGLang's layer), the rule
    does not hold for this model and no kernel is moved; a run that does not end at the attention is never one."""
    def odd_path():
        return qk_torch()[:-2] + [(MUL, "aten::mul", [[1, 3840], [3840]])] + qk_torch()[-2:]

    rows = {r["op"] for r in analyze(G3, step=decode_step(False, odd_path))["ops"]}
    assert "gemma_qknorm_rope" not in rows and "torch mean" in rows

    def unended():   # the same kernels, but a non-torch kernel before the KV store: not a q/k path
        return qk_torch() + [("void mystery_kernel<1>(...)", None, None)]

    rows = {r["op"] for r in analyze(G3, step=decode_step(False, unended))["ops"]}
    assert "gemma_qknorm_rope" not in rows


class Table(SpeedupTable):
    """gemma_qknorm_rope's bench at Gemma-3-12B's batch-1 dims (tokens, q heads, kv heads, head_dim, q/k strides,
    q_out's stride)."""

    def __init__(self):
        super().__init__([])
        self.asked = []

    def lookup(self, op, dims, dtype="bf16", variant=None):
        self.asked.append((op, tuple(dims) if dims else None))
        if op == "gemma_qknorm_rope" and tuple(dims or ()) == (1, 16, 8, 256, 8192, 8192, 4096):
            return Speedup(11.0, "1x16x8x256x8192x8192x4096", True, "bench_gemma_qknorm_rope.json", "2026-11-29")
        return None


def test_the_q_k_path_s_prediction_reads_the_op_s_bench_speedup():
    t = Table()
    c = analyze(G3, table=t)
    q = {r["op"]: r for r in c["ops"]}["gemma_qknorm_rope"]
    assert q["speedup"] == 11.0 and q["speedup_source"] == "bench_gemma_qknorm_rope.json"
    assert q["saved_us"] == pytest.approx(PATH_US * (1 - 1 / 11.0))
    assert q["predicted_gain"] == pytest.approx(q["saved_us"] / c["kernel_us_per_step"])
    assert c["predicted_saved_us"] == pytest.approx(q["saved_us"])


def test_the_in_graph_prediction_compares_the_torch_path_with_astra_s_kernel():
    """A: every default op but gemma_qknorm_rope (its torch path); B: its astra kernel. In-graph: A's attributed
    torch kernels minus B's kernel, which is the whole step's kernel difference here."""
    a, b = analyze(G3, table=Table()), analyze(G3, patched=True, table=Table())
    qb = {r["op"]: r for r in b["ops"]}["gemma_qknorm_rope"]
    assert qb["astra_kernel"] and qb["us_per_step"] == pytest.approx(2.0 * LAYERS)
    p = predicted_from_profile({"captures": [a, b]}, "A", ["B"], {"B": ["gemma_qknorm_rope"]})[("B", 1)]
    assert p["in_context_saved_us"] == pytest.approx(PATH_US - 2.0 * LAYERS)
    assert p["kernel_step_delta_us"] == pytest.approx(PATH_US - 2.0 * LAYERS)
    assert p["saved_us"] == pytest.approx(PATH_US * (1 - 1 / 11.0))


def _trace_events(step, steps, shapes):
    """A Chrome trace of `kernels(step, ...)`, each kernel's torch op recorded around its launch where `shapes`."""
    ev, corr = [], 1
    for k in kernels(step, steps, shapes=False):
        args = {"stream": 7, "device": 0, "correlation": corr}
        ev.append({"ph": "X", "cat": "kernel", "name": k.name, "ts": k.ts, "dur": k.dur, "pid": 0, "tid": 7,
                   "args": args})
        corr += 1
    if shapes:
        for i, (name, op, dims) in enumerate(step):
            if dims is not None:
                ev.append({"ph": "X", "cat": "cpu_op", "name": op, "ts": 10.0 * i - 5000.0, "dur": 4.0, "pid": 1,
                           "tid": 1, "args": {"Input Dims": dims}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10.0 * i - 4999.0,
                       "dur": 1.0, "pid": 1, "tid": 1, "args": {"correlation": i + 1}})
    return {"traceEvents": ev}


def test_the_neighbours_table_attributes_the_path_as_the_profile_does(tmp_path):
    """compare_dir classifies each kernel with the profile's kernel_matcher: A's torch path pairs as
    gemma_qknorm_rope (its last kernel before the KV store), B's astra kernel likewise, and the rows' saving is the
    path's exposed time against astra's."""
    from astra_sglang.e2e.neighbours import saved_with_consumers

    caps = []
    for arm, patched in (("A", False), ("B", True)):
        for fn, steps, shapes in ((f"{arm}-dec.json.gz", 2, False), (f"{arm}-eager.json.gz", 1, True)):
            with gzip.open(tmp_path / fn, "wt") as f:
                json.dump(_trace_events(decode_step(patched), steps, shapes), f)
        caps.append({"stage": "decode", "batch_size": 1, "tokens": 1, "steps": 2, "trace": f"{arm}-dec.json.gz",
                     "shapes_trace": f"{arm}-eager.json.gz", "arm": arm})
    (tmp_path / "profile-meta.json").write_text(json.dumps({"captures": caps, "config": G3}))
    (res,) = compare_dir(tmp_path)
    rows = {(r["op"], r["next"]): r for r in res["rows"]}
    store = rows[("gemma_qknorm_rope", "kv_store")]
    assert (store["calls_per_step"], store["calls_per_step_b"]) == (LAYERS, LAYERS)
    assert rows[("gemma_qknorm_rope", "gemma_qknorm_rope")]["calls_per_step"] == 21 * LAYERS
    assert not any(r["op"] == "torch elementwise/copy" for r in res["rows"])   # not covered: never a row's op
    assert saved_with_consumers(res["rows"]) == pytest.approx(PATH_US - 2.0 * LAYERS)


def test_q_k_shapes_are_either_layout_at_any_tp_degree():
    """0.5.17 norms q as [1, heads, tokens, head_dim] views, 0.5.23 as [tokens, heads, head_dim]; at TP 2 the rank's
    heads are half; Gemma-3-1B has one kv head. A hidden-state or logits tensor is none of them."""
    from astra_sglang.e2e.profile import _heads_of, _qk_shaped

    heads = _heads_of(G3)
    assert heads == {16, 8, 4, 2, 1}
    assert _qk_shaped([[1, 16, 4, 256], []], 256, heads) and _qk_shaped([[1, 8, 4, 1]], 256, heads)
    assert _qk_shaped([[4, 8, 256], [4, 8, 1]], 256, heads)          # 0.5.23, or TP 2's q
    assert _qk_shaped([[256], []], 256, heads)                        # 1 + w
    assert not _qk_shaped([[1, 3840], []], 256, heads) and not _qk_shaped([[1, 262208]], 256, heads)
    assert not _qk_shaped([[4, 3840, 256]], 256, heads) and not _qk_shaped(None, 256, heads)
    one_kv = {"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256}
    assert _qk_shaped([[1, 1, 1, 256]], 256, _heads_of(one_kv))


def test_a_patched_arm_s_kernel_and_a_copy_around_it_are_the_op_s():
    """In the patched arm the run is astra's kernel and whatever torch copy still sits between it and the KV store: the
    copy counts with the op in both arms (A's run held it too), so the in-graph difference is the kernels replaced."""
    def patched_with_copy():
        return [(ASTRA, "astra::gemma_qknorm_rope", [[1, 8192], [1, 8192]]), (COPY, "aten::copy_", [[1, 8, 256]])]

    step = decode_step(False, patched_with_copy)
    c = analyze(G3, step=step)
    q = {r["op"]: r for r in c["ops"]}["gemma_qknorm_rope"]
    assert q["astra_kernel"] and q["calls_per_step"] == 2 * LAYERS
    assert q["us_per_step"] == pytest.approx((2.0 + 1.5) * LAYERS)
