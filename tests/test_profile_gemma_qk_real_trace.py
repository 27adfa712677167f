"""The profile's Gemma-3 q/k path rule on REAL traces: Gemma-3-12B decode at batch 1, H200, SGLang 0.5.17, dummy
weights (results/2026-11-30-h200/session25/b/step-gemma3-12b-qk), trimmed to 3 layers a step by
tests/data/make_gemma3_qk_trace_fixture.py. Arm A runs every astra op but gemma_qknorm_rope, so SGLang's torch q/k
norm + rope runs; arm B runs astra's fused kernel. tests/test_profile_gemma_qk_path.py tests the rule on synthetic
traces; this one pins it to what SGLang really launches (astra's linear as the qkv GEMM, broadcast muls on
elementwise_kernel, the rotary cos/sin after a bmm in the prologue, shapes recorded for inductor's rope kernels).

The fixture's traces are decompressed beside its profile-meta.json and analysed by analyze_dir and compare_dir, as
`astra-sglang e2e --step` analyses a run's profile dir (e2e/step.py)."""
from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest

from astra_sglang.e2e.neighbours import compare_dir
from astra_sglang.e2e.profile import META, analyze_dir, attributors, qk_path_runs
from astra_sglang.e2e.trace import exclusive_times, load_trace

FIXTURE = Path(__file__).resolve().parent / "data" / "gemma3_qk_real"
OP = "gemma_qknorm_rope"
STEPS = 2            # graph replays kept (profile-meta's "steps")
LAYERS = 3           # q/k paths kept a step: layers 0, 1 and 2
# the real run per layer, read off the eager step's shapes: Gemma3RMSNorm.forward_native on q ([1, 16, 1, 256]) then
# on k ([1, 8, 1, 256]), 10 kernels each, then inductor's two rope kernels: 22 (profile.md: 1056 calls = 22 x 48;
# the neighbours table's 1008 = 21 x 48 counts the path's kernel-to-kernel pairs, one fewer a layer)
NORM = ["aten::copy_", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul",   # x.float(), variance
        "aten::copy_", "aten::add", "aten::mul", "aten::copy_"]                              # (1 + w), x * ..., .to()
ROPE = ["triton_poi_fused__to_copy_add_cat_mul_neg_slice_unsqueeze_0",
        "triton_poi_fused__to_copy_add_cat_mul_neg_slice_unsqueeze_1"]
PER_LAYER = len(NORM) * 2 + len(ROPE)
QKV_GEMM, KV_STORE, ASTRA = "astra_lin::", "store_kvcache", "astra_gqkr::"


def _unpack(dest: Path, model_type: str = "") -> Path:
    """The fixture as a profile dir: plain JSON traces (as e2e/trace.py reads them) beside profile-meta.json, with
    config.json's model_type replaced where given."""
    dest.mkdir(parents=True, exist_ok=True)
    for xz in FIXTURE.glob("*.json.xz"):
        with lzma.open(xz, "rb") as src, open(dest / xz.name[:-3], "wb") as out:
            shutil.copyfileobj(src, out)
    meta = json.loads((FIXTURE / META).read_text())
    if model_type:
        meta["config"]["model_type"] = model_type
    (dest / META).write_text(json.dumps(meta))
    return dest


@pytest.fixture(scope="module")
def pdir(tmp_path_factory) -> Path:
    return _unpack(tmp_path_factory.mktemp("gemma3_qk_real"))


@pytest.fixture(scope="module")
def analysis(pdir):
    """arm -> its capture's analysis, by the profile's own entry point."""
    return {c["arm"]: c for c in analyze_dir(pdir)["captures"]}


@pytest.fixture(scope="module")
def arms(pdir):
    return {arm: _capture(pdir, arm) for arm in "AB"}


def _capture(pdir: Path, arm: str):
    """(graph kernels, eager kernels, kernel name -> Match, kernel event -> Match) of an arm, wired as
    analyze_capture wires them."""
    meta = json.loads((pdir / META).read_text())
    (cap,) = [c for c in meta["captures"] if c["arm"] == arm]
    graph, eager = load_trace(pdir / cap["trace"]).kernels, load_trace(pdir / cap["shapes_trace"]).kernels
    exclusive_times(graph)
    return (graph, eager, *attributors(meta["config"], (graph, eager), (eager,)))


def _between_qkv_and_store(kernels):
    """Per layer, by name alone: the kernels after the layer's qkv GEMM (astra's linear, the last one before the KV
    store) and before its KV store."""
    out, since = [], None
    for k in sorted(kernels, key=lambda k: k.ts):
        if QKV_GEMM in k.name:
            since = []
        elif KV_STORE in k.name:
            out.append(since)
            since = None
        elif since is not None:
            since.append(k)
    return out


def test_the_fixture_is_real_and_small():
    meta = json.loads((FIXTURE / META).read_text())
    assert meta["config"]["model_type"] == "gemma3_text" and meta["GPU"] == "NVIDIA H200"
    assert {(c["arm"], c["steps"]) for c in meta["captures"]} == {("A", STEPS), ("B", STEPS)}
    assert sum(f.stat().st_size for f in FIXTURE.iterdir()) < 60_000   # carried to the GPU machine


def test_arm_a_s_torch_path_between_qkv_gemm_and_kv_store_is_the_op_s_and_nothing_else_is(arms):
    graph, eager, match, of = arms["A"]
    for ks, layers in ((graph, LAYERS * STEPS), (eager, LAYERS)):
        runs = _between_qkv_and_store(ks)
        assert len(runs) == layers and all(len(r) == PER_LAYER for r in runs), [len(r) for r in runs]
        path = {id(k) for r in runs for k in r}
        assert all(of(k).op == OP and not of(k).astra for r in runs for k in r)
        assert not [k.name for k in ks if of(k).op == OP and id(k) not in path]   # no kernel outside a run
        # qk_path_runs, the rule itself, finds exactly these runs
        assert [[id(k) for k in r] for r in qk_path_runs(ks, match, OP)] == [[id(k) for k in r] for r in runs]
    # the eager step's shapes: q's norm, k's norm, the rope of q and of k, in this order, every layer
    for r in _between_qkv_and_store(eager):
        assert [k.torch_op for k in r] == NORM * 2 + ROPE
        assert [k.shapes[0] for k in r if k.torch_op == "aten::pow"] == [[1, 16, 1, 256], [1, 8, 1, 256]]


def test_arm_a_s_row_is_the_runs_calls_and_time(arms, analysis):
    graph = arms["A"][0]
    rows = {r["op"]: r for r in analysis["A"]["ops"]}
    q = rows[OP]
    assert q["covered"] and not q["astra_kernel"] and q["category"] == "op"
    assert q["calls_per_step"] == PER_LAYER * LAYERS
    path_us = sum(k.excl for r in _between_qkv_and_store(graph) for k in r) / STEPS
    assert q["us_per_step"] == pytest.approx(path_us)
    assert q["shape_source"] == "profiler" and any("1x16x1x256 (aten::mean)" in s for s in q["shapes"])
    # both means of every layer are the norms': none is left a torch mean
    assert "torch mean" not in rows


def test_arm_b_s_op_is_astra_s_one_kernel_per_layer(arms, analysis):
    graph, eager, _, of = arms["B"]
    for ks, layers in ((graph, LAYERS * STEPS), (eager, LAYERS)):
        runs = _between_qkv_and_store(ks)
        assert len(runs) == layers and all(len(r) == 1 and ASTRA in r[0].name for r in runs)
        assert all(of(k).op == OP and of(k).astra for r in runs for k in r)
        assert sum(of(k).op == OP for k in ks) == layers
    q = {r["op"]: r for r in analysis["B"]["ops"]}[OP]
    assert q["astra_kernel"] and q["calls_per_step"] == LAYERS
    assert len(q["kernels"]) == 1 and ASTRA in q["kernels"][0]


def test_the_torch_kernels_outside_the_path_are_the_same_in_both_arms(analysis):
    """The input prep, the embedding's scale, the rotary cos/sin (torch kernels right after a bmm, a GEMM: the rule's
    'ends at the KV store or attention' and the eager step's shapes keep them out) and the sampling stay torch
    elementwise, in A as in B."""
    a, b = ({r["op"]: r for r in analysis[arm]["ops"]} for arm in "AB")
    torch = "torch elementwise/copy"
    assert a[torch]["calls_per_step"] == b[torch]["calls_per_step"] > 0
    # A's step has the path's kernels where B has astra's: the rest of the step is the same count
    assert analysis["A"]["n_kernels_per_step"] - analysis["B"]["n_kernels_per_step"] == (PER_LAYER - 1) * LAYERS


def test_the_neighbours_table_pairs_the_path_as_the_real_report_did(pdir):
    """compare_dir, as the step report runs it: A's path pairs with itself 21 times a layer and ends at the KV store
    once (the real report's 1008 and 48 a step over 48 layers), B's astra kernel ends at the KV store."""
    (res,) = compare_dir(pdir)
    rows = {(r["op"], r["next"]): r for r in res["rows"]}
    assert rows[(OP, OP)]["calls_per_step"] == (PER_LAYER - 1) * LAYERS and not rows[(OP, OP)]["calls_per_step_b"]
    store = rows[(OP, "kv_store")]
    assert (store["calls_per_step"], store["calls_per_step_b"]) == (LAYERS, LAYERS)
    assert not any(r["op"] == "torch elementwise/copy" for r in res["rows"])


@pytest.mark.parametrize("model_type", ["gemma2", "llama"])
def test_another_model_type_attributes_nothing_to_the_op_by_place(tmp_path, model_type):
    """The same real kernels under another model type: the by-place rule is Gemma-3's, so arm A's path stays torch's
    (its two means a layer become torch means); B's astra kernel is known by its name and stays the op's."""
    caps = {c["arm"]: c for c in analyze_dir(_unpack(tmp_path, model_type))["captures"]}
    a = {r["op"]: r for r in caps["A"]["ops"]}
    assert OP not in a
    assert a["torch mean"]["calls_per_step"] == 2 * LAYERS
    b = {r["op"]: r for r in caps["B"]["ops"]}
    assert b[OP]["astra_kernel"] and b[OP]["calls_per_step"] == LAYERS
