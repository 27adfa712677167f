"""moe_route_align (kernels/moe_route_align/): the router + moe_align_block_size fused op. CPU tests of its spec
(corpus, reference = SGLang's two contracts in sequence, the canonical forms), the check harness on it, the
adapter's two halves (route with a learned block size, serve the stashed alignment only for the very ids it
routed), the patch machinery's `Served` path, and the shipped kernel's build. Its GPU numbers:
kernels/moe_route_align/RESULTS.md."""
from __future__ import annotations

import subprocess
import sys
import types
from collections import namedtuple

import pytest
import torch

from astra_sglang.registry import get_op, op_part
from sglang_signatures import real_function  # noqa: E402
from sglang_source import _sglang_root  # noqa: E402

SPEC = get_op("moe_route_align")
ROUTER = get_op("moe_router")
ALIGN = get_op("moe_align")
from astra_sglang.kernels.moe_align.spec import align_np  # noqa: E402
from astra_sglang.kernels.moe_router.spec import route  # noqa: E402


def cpu_impl(wrong: str = ""):
    """The op behind its ABI on CPU, from the two member contracts (what a correct kernel writes, raw ids);
    `wrong`: 'ids' swaps the first two slots' ids, 'align' shifts an expert_ids entry."""

    def impl(tensors, dims, dtype, scalars, stream=None):
        t, e, k, bs, n_sorted = dims
        w, ids = route(tensors["scores"].double(), k, bool(scalars["renormalize"]))
        if wrong == "ids" and k > 1:
            ids = ids[:, [1, 0] + list(range(2, k))]
        out, eids, total = align_np(ids.numpy(), e + 1, bs, n_sorted, tensors["expert_ids"].numpy())
        if wrong == "align":
            eids[0] += 1
        tensors["topk_weights"].copy_(w.float())
        tensors["topk_ids"].copy_(ids.to(torch.int32))
        tensors["sorted_token_ids"].copy_(torch.from_numpy(out).to(torch.int32))
        tensors["expert_ids"].copy_(torch.from_numpy(eids).to(torch.int32))
        tensors["num_tokens_post_pad"].fill_(total)
        return 0

    return impl


# --------------------------------------------------------------------------- spec
def test_corpus_is_the_decode_rows_of_the_models_that_run_both_kernels():
    dims = {s.dims for s in SPEC.corpus}
    assert (1, 128, 8, 16, 128) in dims and (64, 128, 8, 16, 2448) in dims    # Qwen3-30B-A3B, its blocks
    assert all(d[0] * d[2] <= 4096 for d in dims | {s.dims for s in SPEC.edge_shapes})
    assert all("decode" in s.tags for s in SPEC.corpus)
    assert all(s.tags[-1] == "if-no-triton-kernels" for s in SPEC.corpus if s.source.startswith("gpt-oss"))
    assert SPEC.fused_member_sets() == (("moe_router", "moe_align"),)
    assert SPEC.scalars((1, 60, 4, 16, 64)) == {"block_size": 16, "renormalize": 0}


def test_reference_is_the_router_then_the_align_of_its_ids():
    dims = (5, 128, 8, 16, 5 * 8 + 129 * 15 + 1)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(3), "ties", device="cpu")
    ref = SPEC.reference({n: v.double() for n, v in inp.items()}, dims, SPEC.scalars(dims))
    w, ids = route(inp["scores"].double(), 8, True)
    assert torch.equal(ref["topk_weights"], w)
    assert torch.equal(ref["topk_ids"], ROUTER.reference({"scores": inp["scores"].double()}, (5, 128, 8),
                                                         {"renormalize": 1})["topk_ids"])
    s, e, total = align_np(ids.numpy(), 129, 16, dims[4], inp["expert_ids"].numpy())
    assert ref["sorted_token_ids"].tolist() == s.tolist() and ref["expert_ids"].tolist() == e.tolist()
    assert ref["num_tokens_post_pad"].tolist() == [total]


@pytest.mark.parametrize("wrong,tensor", [("", None), ("ids", "topk_ids"), ("align", "expert_ids")])
def test_check_harness_passes_the_contract_and_fails_either_half(wrong, tensor):
    from astra_sglang.harness.guards import GuardedSet
    from astra_sglang.harness.oracle import run_case

    good, cand = cpu_impl(), cpu_impl(wrong)
    for shape in ([SPEC.corpus[0], SPEC.edge_shapes[0]] if wrong else list(SPEC.edge_shapes[:3]) + [SPEC.corpus[0]]):
        for dt in ("bf16", "fp32"):
            protos = SPEC.make_inputs(shape.dims, dt, torch.Generator().manual_seed(1), "normal", device="cpu")
            bc, bp = GuardedSet(SPEC, protos, "cpu", 1024), GuardedSet(SPEC, protos, "cpu", 1024)
            for run, dist in enumerate(SPEC.distributions):
                details, failures, _ = run_case(SPEC, cand, good, bc, bp, shape.dims, dt, dist, 7, "cpu",
                                                run_index=run)
                if not wrong:
                    assert not failures and details and all(d["ok"] for d in details), failures
                else:
                    assert any(tensor in f for f in failures), (shape.dims, failures)


# --------------------------------------------------------------------------- adapter
Out = namedtuple("StandardTopKOutput", "topk_weights topk_ids router_logits")


@pytest.fixture
def fake_sglang(monkeypatch):
    """select_experts' and the align wrapper's modules as far as the adapter reads them (SGLang does not import
    on a CPU machine); the functions bound are the real signatures from the 0.5.17 wheel."""
    topk = types.ModuleType("sglang.srt.layers.moe.topk")
    topk._is_cuda, topk._use_aiter = True, False
    topk.noop = True
    topk.precomputed_topk_postprocess_is_noop = lambda cfg, n, info: topk.noop and n is None and info is None
    topk.build_precomputed_topk_output = lambda w, i, cfg, layer: Out(w, i, None)
    topk.get_moe_runner_backend = lambda: types.SimpleNamespace(is_flashinfer_trtllm_routed=lambda: False)
    wrap = types.ModuleType("sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size")
    monkeypatch.setitem(sys.modules, topk.__name__, topk)
    monkeypatch.setitem(sys.modules, wrap.__name__, wrap)
    ad = op_part("moe_route_align", "adapter")
    monkeypatch.setattr(ad, "_BLOCK", {})
    monkeypatch.setattr(ad, "_STASH", {})
    return topk, wrap, ad


def _cfg(**kw):
    base = dict(top_k=8, use_grouped_topk=False, torch_native=False, custom_routing_function=None,
                scoring_func="softmax", apply_routed_scaling_factor_on_output=False, renormalize=True)
    return types.SimpleNamespace(**{**base, **kw})


def _binders(sglang_0_5_17_source, ad):
    from astra_sglang.patch.adapters import Binder

    sel = real_function(sglang_0_5_17_source, "sglang.srt.layers.moe.topk", "select_experts",
                        names={"TopKConfig": object, "ExpertLocationDispatchInfo": object, "StandardTopKOutput": object})
    wrap = real_function(sglang_0_5_17_source, "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size",
                         "moe_align_block_size", names={"Tuple": tuple})
    bs, bw = Binder(sel, ad.ADAPTER, SPEC), Binder(wrap, ad.ADAPTER, SPEC)
    assert bs.ok and bw.ok, (bs.problem, bw.problem)
    return bs, bw


def test_router_fuses_only_after_the_wrapper_taught_it_the_block_size(fake_sglang, sglang_0_5_17_source):
    from astra_sglang.patch.adapters import Served

    topk, _, ad = fake_sglang
    bsel, bwrap = _binders(sglang_0_5_17_source, ad)
    x = torch.randn(4, 128, dtype=torch.bfloat16, device="meta")
    call = dict(hidden_states=x, router_logits=x, topk_config=_cfg(), layer_id=3)
    canon, why = bsel.bind((), call)
    assert canon is None and "block size" in why
    ids = torch.zeros(4, 8, dtype=torch.int32, device="meta")
    canon, why = bwrap.bind((ids, 16, 128), {})      # SGLang's wrapper runs, and tells the block size
    assert canon is None and "no alignment stashed" in why
    assert ad._BLOCK == {(4, 128, 8): 16}
    canon, vals = bsel.bind((), call)
    assert isinstance(canon, dict), vals
    views, dims = ad.ADAPTER.normalize(canon)
    assert dims == (4, 128, 8, 16, 32 * 16) and canon["renormalize"] == 1      # 32 ids < 129 buckets
    assert canon["sorted_token_ids"].numel() == 32 * 16      # 0.5.17's length, not rounded to 4
    assert canon["expert_ids"].numel() == -(-dims[4] // 16)
    out = ad.ADAPTER.returns(canon)
    assert out.topk_ids is canon["topk_ids"] and out.router_logits is x   # select_experts returns the logits
    served, _ = bwrap.bind((out.topk_ids, 16, 128), {})
    assert isinstance(served, Served)
    assert served.value == (canon["sorted_token_ids"], canon["expert_ids"], canon["num_tokens_post_pad"])
    assert bwrap.bind((out.topk_ids, 16, 128), {})[0] is None          # one use


@pytest.mark.parametrize("change", ["ids modified", "another tensor", "block size", "experts", "ignore_invalid"])
def test_wrapper_serves_nothing_but_the_exact_ids_it_routed(fake_sglang, sglang_0_5_17_source, change):
    _, _, ad = fake_sglang
    bsel, bwrap = _binders(sglang_0_5_17_source, ad)
    ad._BLOCK[(2, 64, 8)] = 16
    x = torch.randn(2, 64, device="meta")
    out = ad.ADAPTER.returns(bsel.bind((), dict(hidden_states=x, router_logits=x, topk_config=_cfg()))[0])
    ids, bs, e, kw = out.topk_ids, 16, 64, {}
    if change == "ids modified":
        ids.add_(0)                        # in place: torch's version counter moves
    elif change == "another tensor":
        ids = ids.clone()
    elif change == "block size":
        bs = 32
    elif change == "experts":
        e = 63
    else:
        kw = {"ignore_invalid_expert": True}
    canon, why = bwrap.bind((ids, bs, e), kw)
    assert canon is None and isinstance(why, str)
    if change == "block size":             # two block sizes for one shape: never fused again
        assert ad._BLOCK[(2, 64, 8)] == 0
        assert "two block sizes" in bsel.bind((), dict(hidden_states=x, router_logits=x, topk_config=_cfg()))[1]


@pytest.mark.parametrize("why,setup", [
    ("scoring_func", lambda t, c: c.update(scoring_func="sigmoid")),
    ("grouped", lambda t, c: c.update(use_grouped_topk=True)),
    ("post-processes", lambda t, c: setattr(t, "noop", False)),
    ("aiter", lambda t, c: setattr(t, "_use_aiter", True)),
    ("raw logits", lambda t, c: setattr(t, "get_moe_runner_backend",
                                        lambda: types.SimpleNamespace(is_flashinfer_trtllm_routed=lambda: True))),
    # 0.5.23: select_experts reads the backend the layer's TopK was bound to, not the global one
    ("raw logits", lambda t, c: c.update(runner_backend=types.SimpleNamespace(is_flashinfer_trtllm_routed=lambda: True))),
    ("faster in context", lambda t, c: c.update(_tokens=9)),      # the two ops serve larger batches
    ("GPU", lambda t, c: c.update(_device="cpu")),
])
def test_router_declines_where_select_experts_would_not_run_the_softmax_router(fake_sglang, sglang_0_5_17_source,
                                                                                 why, setup):
    topk, _, ad = fake_sglang
    bsel, _ = _binders(sglang_0_5_17_source, ad)
    c = {}
    setup(topk, c)
    t, dev = c.pop("_tokens", 4), c.pop("_device", "meta")
    ad._BLOCK[(t, 128, 8)] = 16
    x = torch.randn(t, 128, device=dev)
    canon, reason = bsel.bind((), dict(hidden_states=x, router_logits=x, topk_config=_cfg(**c)))
    assert canon is None and why in reason, reason
    nt = torch.tensor([3])               # padded rows to mask: SGLang's post-processing
    topk.noop = True
    canon, reason = bsel.bind((), dict(hidden_states=x, router_logits=x, topk_config=_cfg(), num_token_non_padded=nt))
    assert canon is None


@pytest.mark.wheels
def test_0_5_23_s_biased_or_split_logits_stay_sglang_s(fake_sglang, request):
    """0.5.23's select_experts takes dynamic_expert_bias (a biased sigmoid router) and router_logits_partials (ROCm's
    split-K logits): through its real signature, a call with either stays SGLang's."""
    from astra_sglang.patch.adapters import Binder

    topk, _, ad = fake_sglang
    sel = real_function(_sglang_root("0.5.23", request).parent, "sglang.srt.layers.moe.topk", "select_experts",
                        names={"TopKConfig": object, "ExpertLocationDispatchInfo": object, "StandardTopKOutput": object})
    b = Binder(sel, ad.ADAPTER, SPEC)
    assert b.ok, b.problem
    x = torch.randn(4, 128, device="meta")
    for n in ("dynamic_expert_bias", "router_logits_partials"):
        canon, reason = b.bind((), dict(hidden_states=x, router_logits=x, topk_config=_cfg(), **{n: x}))
        assert canon is None and n in reason, reason


def test_the_backend_is_read_where_each_version_s_select_experts_reads_it(fake_sglang):
    """0.5.17: the topk module's get_moe_runner_backend(); 0.5.23: TopKConfig.runner_backend (its topk module has no
    get_moe_runner_backend, and an unbound TopK's None is not the raw-logits router, whatever the global says)."""
    topk, _, ad = fake_sglang
    routed = types.SimpleNamespace(is_flashinfer_trtllm_routed=lambda: True)
    topk.get_moe_runner_backend = lambda: routed
    assert ad._select_experts_backend(topk, _cfg()) is routed
    assert ad._select_experts_backend(topk, _cfg(runner_backend=None)) is None
    del topk.get_moe_runner_backend
    assert ad._select_experts_backend(topk, _cfg()) is None
    topk.get_moe_runner_backend = lambda: 1 / 0  # no runtime config published: SGLang's default
    assert ad._select_experts_backend(topk, _cfg()) is None


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_each_version_s_select_experts_reads_the_backend_there(which, request):
    """What _select_experts_backend relies on, in each version's topk.py: 0.5.17 calls the imported global in
    select_experts, 0.5.23 reads topk_config.runner_backend (a TopKConfig field) and imports no global."""
    src = (_sglang_root(which, request) / "srt/layers/moe/topk.py").read_text()
    sel = src[src.index("\ndef select_experts("):]
    if which == "0.5.17":
        assert "from sglang.srt.layers.moe import get_moe_runner_backend" in src
        assert "get_moe_runner_backend().is_flashinfer_trtllm_routed()" in sel
        assert "runner_backend: Optional" not in src
    else:
        assert "get_moe_runner_backend" not in src
        assert "topk_config.runner_backend.is_flashinfer_trtllm_routed()" in sel
        assert "runner_backend: Optional[MoeRunnerBackendLike] = None" in src


def test_a_served_call_runs_no_kernel_and_counts_as_served(fake_sglang, sglang_0_5_17_source, tmp_path):
    from astra_sglang.patch.apply import make_replacement
    from astra_sglang.patch.counters import CounterFile, totals
    from astra_sglang.patch.ops import OpState

    _, _, ad = fake_sglang
    _, bwrap = _binders(sglang_0_5_17_source, ad)
    launched = []

    class Backend:
        name, devices, dtypes = "cpu stand-in", ("cpu", "meta"), ("fp32", "fp16", "bf16")

        def launch(self, *a):
            launched.append(a)

    st = OpState(SPEC, ad.ADAPTER, Backend(), CounterFile(tmp_path, ["moe_route_align"]))
    orig_calls = []
    orig = real_function(sglang_0_5_17_source, "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size",
                         "moe_align_block_size", body="orig_calls.append(1); return 'sglang'",
                         names={"Tuple": tuple, "orig_calls": orig_calls})
    repl = make_replacement(st, bwrap, orig, "m:moe_align_block_size")
    ids = torch.zeros(1, 8, dtype=torch.int32)
    stash = ("sorted", "eids", "total")
    ad._STASH.update(ids=ids, version=ids._version, block_size=16, experts=128, out=stash)
    assert repl(ids, 16, 128) == stash and not launched and not orig_calls
    assert repl(ids, 16, 128) == "sglang" and orig_calls == [1]      # consumed: SGLang's wrapper now
    tot = totals(str(tmp_path))["moe_route_align"]
    assert tot["served"] == 1 and tot["fallbacks"] == 1 and tot["calls"] == 0, tot


def test_sequence_is_sglangs_two_calls_on_the_canonical_tensors(fake_sglang, monkeypatch):
    """The self-check's expected result and the installed baseline: fused_topk (SGLang's original even where astra
    patched it), then the in-place align the wrapper calls (E + 1 buckets, padding on), on the router's ids."""
    topk, wrap, ad = fake_sglang
    calls = []

    def fused_topk(hidden_states, gating_output, topk, renormalize):
        calls.append(("route", topk, renormalize))
        return route(gating_output.double(), topk, renormalize)[0].float(), \
            route(gating_output.double(), topk, renormalize)[1].to(torch.int32)

    def patched(*a, **k):
        raise AssertionError("the sequence must call SGLang's original")

    patched.__astra_original__ = fused_topk
    topk.fused_topk = patched

    def sgl_align(ids, buckets, bs, s, e, n, cumsum, pad, ignore):
        calls.append(("align", buckets, bs, pad, ignore))
        out, eids, total = align_np(ids.numpy(), buckets, bs, s.numel(), e.numpy())
        s.copy_(torch.from_numpy(out)); e.copy_(torch.from_numpy(eids)); n.fill_(total)

    wrap.sgl_moe_align_block_size = sgl_align
    dims = (3, 64, 8, 16, 3 * 8 + 65 * 15)
    c = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(0), "normal", device="cpu")
    c.update(SPEC.scalars(dims))
    want = {n: v.clone() for n, v in c.items() if isinstance(v, torch.Tensor)}
    cpu_impl()(want, dims, "fp32", SPEC.scalars(dims))
    ad.ADAPTER.sequence(c)
    assert calls == [("route", 8, True), ("align", 65, 16, True, False)]
    for n in ("topk_weights", "topk_ids", "sorted_token_ids", "expert_ids", "num_tokens_post_pad"):
        assert torch.equal(c[n], want[n]), n


def test_discovery_finds_both_halves(sglang_0_5_17_source):
    from pathlib import Path

    from astra_sglang.patch.discover import discover_for_specs

    d = discover_for_specs([SPEC], roots={"sglang": Path(sglang_0_5_17_source) / "sglang"})
    sites = {(s.kind, s.module) for s in d.for_op("moe_route_align")}
    assert ("definition", "sglang.srt.layers.moe.topk") in sites
    assert ("definition", "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size") in sites
    # fused_moe.py imports the wrapper by name: patching the module attribute alone would miss that call
    assert any(m.endswith("triton_utils.fused_moe") for _, m in sites), sites


def test_layer_and_adapter_import_without_sglang():
    assert callable(op_part("moe_route_align", "layer").run_layer)
    assert op_part("moe_route_align", "adapter").DEFAULT_OFF


# --------------------------------------------------------------------------- the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_compiles_for_sm90a_and_passes_the_static_checks(tmp_path):
    from astra_sglang.build import find_nvcc
    from astra_sglang.registry import op_dir
    from astra_sglang.static_checks import errors, scan_file

    src = op_dir("moe_route_align") / "kernel.cu"
    assert not errors(scan_file(src, []))
    r = subprocess.run([find_nvcc(), "-std=c++20", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", "-o", str(tmp_path / "k.so"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "astra_moe_route_align" in subprocess.run(["nm", "-D", str(tmp_path / "k.so")], capture_output=True,
                                                     text=True).stdout
