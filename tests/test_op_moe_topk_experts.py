"""moe_topk_experts (kernels/moe_topk_experts/): the FUSED softmax top-k router + routed experts of a Qwen3-MoE layer
at one decode token, from the gate's logits (moe_experts' two launches routing the logits themselves), replacing
Qwen3MoeSparseMoeBlock.forward_normal after its gate. On CPU: the spec (ABI, corpus, the reference as moe_router's
route then moe_experts' reference, the tie rule deciding a whole expert), make_inputs and the harness on the edge
shapes; the installed variant's facts in sglang 0.5.17 and 0.5.23; the adapter's routing over stand-in SGLang modules
(a one-token call taken, the gate run once and only after every check, every decline a reason); the shipped
kernel's sm_90a build (no spills) and static checks; `astra-sglang ops`.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import run_cli  # noqa: E402
from sglang_source import _sglang_root  # noqa: E402

OP = "moe_topk_experts"
SPEC = get_op(OP)
AD = op_part(OP, "adapter")
A = AD.ADAPTER
EXPERTS = get_op("moe_experts")
TARGET = "sglang.srt.models.qwen3_moe:Qwen3MoeSparseMoeBlock.forward_normal"


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_corpus_and_what_it_replaces():
    assert SPEC.symbol == "astra_moe_topk_experts" and SPEC.replaces == (TARGET,)
    assert SPEC.dim_names == EXPERTS.dim_names and SPEC.fuses == ("moe_router", "moe_experts")
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_moe_topk_experts(const void* x, const void* router_logits, const void* w13, '
        "const void* w2, void* act, void* out, int64_t num_tokens, int64_t hidden, int64_t inter, "
        "int64_t num_experts, int64_t topk, double routed_scaling_factor, int dtype, cudaStream_t stream)")
    assert [v.name for v in SPEC.variants] == ["installed"] and SPEC.variant("installed").callable == TARGET
    # Qwen3-30B-A3B (TP 1, 2, 4) and Qwen3-235B-A22B (TP 4, 8): a rank's shard of each expert at 1 token (taken, and
    # validated) and 2 (SGLang's by design)
    shards = {(2048, 768), (2048, 384), (2048, 192), (4096, 384), (4096, 192)}
    assert {(s.dims, s.tags) for s in SPEC.corpus} == {
        *(((1, h, i, 128, 8), ("decode", "validate")) for h, i in shards),
        *(((2, h, i, 128, 8), ("decode",)) for h, i in shards)}
    assert {s.source for s in SPEC.corpus} == {"qwen3-30b-a3b tp1", "qwen3-30b-a3b tp2", "qwen3-30b-a3b tp4",
                                               "qwen3-235b-a22b tp4", "qwen3-235b-a22b tp8"}
    for s in list(SPEC.corpus) + list(SPEC.edge_shapes):  # the kernels' limits hold on every shape
        t, h, i, e, k = s.dims
        assert e <= AD.MAX_EXPERTS and k <= min(AD.MAX_TOPK, e) and h % 8 == 0 and i % 8 == 0, s


# ------------------------------------------------------------------------------------------ the reference
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dist", ["normal", "ties"])
def test_reference_is_the_router_s_route_then_the_experts_reference(dtype, dist):
    dims = (3, 64, 32, 16, 4)
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(0), dist, device="cpu")
    assert inp["router_logits"].shape == (3, 16) and inp["router_logits"].dtype == inp["x"].dtype
    assert "topk_ids" not in inp and "topk_weights" not in inp
    from astra_sglang.kernels.moe_router.spec import route

    w, ids = route(inp["router_logits"].double(), 4, True)
    routed = {**inp, "topk_weights": w, "topk_ids": ids.to(torch.int32)}
    assert torch.equal(SPEC.reference(inp, dims, {})["out"], EXPERTS.reference(routed, dims, {})["out"])
    assert set(SPEC.reference(inp, dims, {})) == {"out"}  # act is scratch: never compared


def test_a_tie_at_the_k_th_place_goes_to_the_lowest_id_and_moves_a_whole_expert():
    """Experts 1 and 3 share the second-highest logit for top-2: SGLang's router takes expert 1 (the lowest id). Had
    the tie gone to 3, the output would differ by a whole expert's contribution, far past the tolerance."""
    dims = (1, 64, 32, 4, 2)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(1), device="cpu")
    inp["router_logits"] = torch.tensor([[2.0, 1.0, 0.0, 1.0]], dtype=torch.bfloat16)
    out = SPEC.reference(inp, dims, {})["out"]
    swapped = {**inp, "router_logits": torch.tensor([[2.0, 0.0, 0.0, 1.0]], dtype=torch.bfloat16)}  # 3 second
    lowest = {**inp, "router_logits": torch.tensor([[2.0, 1.0, 0.0, 0.0]], dtype=torch.bfloat16)}  # 1 second
    assert torch.equal(out, SPEC.reference(lowest, dims, {})["out"])
    other = SPEC.reference(swapped, dims, {})["out"]
    assert float((other - out).norm() / out.norm()) > 100 * SPEC.tolerance.floor["bf16"]


def test_bytes_read_the_logits_instead_of_the_routing():
    d = (1, 2048, 768, 128, 8)
    assert SPEC.bytes_moved(d, "bf16") == EXPERTS.bytes_moved(d, "bf16") - 8 * 8 + 128 * 2


def test_harness_runs_every_edge_shape_on_cpu():
    from reference_harness import run_edge_cases_on_cpu

    run_edge_cases_on_cpu(dataclasses.replace(SPEC, corpus=SPEC.edge_shapes[:1]))


# ------------------------------------------------------------------------------------------ installed variant
@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, request):
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(_sglang_root(which, request).parent)], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / OP / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == TARGET and m["symbol"] == SPEC.symbol
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == which


# ------------------------------------------------------------------------------------------ the adapter's routing
class _Backend:
    def __init__(self, name):
        self.name = name

    def is_auto(self):
        return self.name == "auto"

    def is_triton(self):
        return self.name == "triton"

    def is_flashinfer_trtllm_routed(self):
        return self.name == "flashinfer_trtllm_routed"


def _classes():
    """Stand-in SGLang classes, one per module the adapter recognises layers by."""
    class Block(torch.nn.Module):
        pass

    class TopK(torch.nn.Module):
        pass

    class FusedMoE(torch.nn.Module):
        pass

    return {"Qwen3MoeSparseMoeBlock": Block, "TopK": TopK, "FusedMoE": FusedMoE,
            "UnquantizedFusedMoEMethod": type("UnquantizedFusedMoEMethod", (), {}),
            "StandardDispatcher": type("StandardDispatcher", (), {})}


@pytest.fixture
def sglang(monkeypatch):
    """Stand-in SGLang modules (CPU tensors allowed): the block's, TopK's, FusedMoE's, the unquantized method's, the
    standard dispatcher's; each a namespace a test may change."""
    monkeypatch.setattr(AD, "DEVICES", ("cuda", "cpu"))
    cls = _classes()
    recorder = type("_ExpertDistributionRecorderNoop", (), {})()
    mods = {
        AD._MOE: dict(Qwen3MoeSparseMoeBlock=cls["Qwen3MoeSparseMoeBlock"]),
        # 0.5.17's topk module imports get_moe_runner_backend (the global runner backend TopK decides by)
        AD._TOPK: dict(TopK=cls["TopK"], build_precomputed_topk_output=lambda *a: None,
                       precomputed_topk_postprocess_is_noop=lambda *a: True, get_global_experts_capturer=lambda: None,
                       get_global_expert_distribution_recorder=lambda: recorder,
                       get_moe_runner_backend=lambda: _Backend("auto")),
        AD._FUSED: dict(FusedMoE=cls["FusedMoE"], is_in_tc_piecewise_cuda_graph=lambda: False),
        AD._UNQUANT: dict(UnquantizedFusedMoEMethod=cls["UnquantizedFusedMoEMethod"]),
        AD._STANDARD: dict(StandardDispatcher=cls["StandardDispatcher"],
                           should_use_flashinfer_cutlass_moe_fp4_allgather=lambda: False),
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe": {},
    }
    out = {}
    for name, attrs in mods.items():
        m = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, name, m)
        out[name] = m
    out["classes"] = cls
    return out


def _block(sglang, t=1, h=64, i=32, e=8, k=3, dtype=torch.bfloat16, topk_cfg=None, runner_cfg=None, **attrs):
    """A stand-in Qwen3-MoE block at TP 1 and the call forward_normal gets: its gate counts its calls."""
    cls, g = sglang["classes"], torch.Generator().manual_seed(0)
    block = cls["Qwen3MoeSparseMoeBlock"]()
    block.tp_size = block.ep_size = 1
    topk = cls["TopK"]()
    topk.topk_config = types.SimpleNamespace(**{**dict(
        top_k=k, use_grouped_topk=False, renormalize=True, num_fused_shared_experts=0, custom_routing_function=None,
        correction_bias=None, torch_native=False, apply_routed_scaling_factor_on_output=False, output_format=None,
        scoring_func="softmax", allow_routed_experts_capture=True), **(topk_cfg or {})})
    experts = cls["FusedMoE"]()
    experts.moe_tp_size = experts.moe_ep_size = 1
    experts.w13_weight = torch.nn.Parameter(torch.randn(e, 2 * i, h, generator=g).to(dtype), requires_grad=False)
    experts.w2_weight = torch.nn.Parameter(torch.randn(e, h, i, generator=g).to(dtype), requires_grad=False)
    experts.quant_method = cls["UnquantizedFusedMoEMethod"]()
    experts.quant_method.runner = types.SimpleNamespace(runner_backend=_Backend("triton"))
    experts.dispatcher = cls["StandardDispatcher"]()
    experts.moe_runner_config = types.SimpleNamespace(**{**dict(
        activation="silu", is_gated=True, apply_router_weight_on_input=False, no_combine=False, gemm1_alpha=None,
        gemm1_clamp_limit=None, swiglu_limit=None, routed_scaling_factor=None, num_experts=None,
        num_local_experts=None), **(runner_cfg or {})})
    calls = []
    logits = torch.randn(t, e, generator=g).to(dtype)

    def gate(x):
        calls.append(x)
        return logits, None

    block.topk, block.experts, block.gate = topk, experts, gate
    for n, v in attrs.items():
        setattr(block, n, v)
    return {"self": block, "hidden_states": torch.randn(t, h, generator=g).to(dtype)}, calls, logits


def test_expand_takes_a_one_token_call_and_runs_the_block_s_gate_once(sglang):
    a, calls, logits = _block(sglang)
    c = A.expand(a)
    assert not isinstance(c, str), c
    ex = a["self"].experts
    assert c["x"] is a["hidden_states"] and c["router_logits"] is logits and len(calls) == 1
    assert c["w13"] is ex.w13_weight and c["w2"] is ex.w2_weight and c["routed_scaling_factor"] == 1.0
    assert c["act"].shape == (1, 3, 32) and c["out"].shape == (1, 64) and c["out"] is not c["x"]
    assert c["filter_expert"] is True and c["all_reduce"] is None and A.returns(c) is c["out"]
    views, dims = AD._normalize(c)
    assert dims == (1, 64, 32, 8, 3) and set(views) == {"x", "router_logits", "w13", "w2", "act", "out"}
    assert "out is x" in AD._normalize({**c, "out": c["x"]})


DECLINES = [
    ("2 tokens > 1", dict(t=2), None),
    ("not SGLang's Qwen3MoeSparseMoeBlock", {}, ("self", "__class__", torch.nn.Module)),
    ("EP > 1", dict(ep_size=2), None),
    ("the experts' MoE TP 1 is not the block's 2", dict(tp_size=2), None),
    ("renormalize off", dict(topk_cfg={"renormalize": False}), None),
    ("grouped", dict(topk_cfg={"use_grouped_topk": True}), None),
    ("scoring_func 'sigmoid'", dict(topk_cfg={"scoring_func": "sigmoid"}), None),
    ("output format is forced", dict(topk_cfg={"output_format": "bypassed"}), None),
    ("'gelu'", dict(runner_cfg={"activation": "gelu"}), None),
    ("swiglu_limit", dict(runner_cfg={"swiglu_limit": 7.0}), None),
    ("top 17 of 32 experts", dict(e=32, k=17), None),
    ("top 8 of 256 experts", dict(e=256, k=8), None),
    ("past the down kernel's 64 chunks", dict(i=2048 + 8, k=8, e=16), None),
    ("not multiples of 8", dict(h=60), None),
]


@pytest.mark.parametrize("why,kw,change", DECLINES, ids=[d[0] for d in DECLINES])
def test_expand_declines_with_a_reason_before_running_the_gate(sglang, why, kw, change):
    a, calls, _ = _block(sglang, **kw)
    if change:
        setattr(a[change[0]], change[1], change[2])
    r = A.expand(a)
    assert isinstance(r, str) and why in r, r
    assert calls == []


@pytest.mark.parametrize("why,module,name,value", [
    ("runner backend", AD._TOPK, "get_moe_runner_backend", lambda: _Backend("flashinfer_trtllm")),
    ("routed-experts capture", AD._TOPK, "get_global_experts_capturer", lambda: object()),
    ("expert-distribution recorder", AD._TOPK, "get_global_expert_distribution_recorder", lambda: object()),
    ("post-processes the ids", AD._TOPK, "precomputed_topk_postprocess_is_noop", lambda *a: False),
    ("piecewise CUDA graph", AD._FUSED, "is_in_tc_piecewise_cuda_graph", lambda: True),
    ("all-gathers", AD._STANDARD, "should_use_flashinfer_cutlass_moe_fp4_allgather", lambda: True),
])
def test_expand_declines_under_sglang_s_other_paths(sglang, why, module, name, value):
    a, calls, _ = _block(sglang)
    setattr(sglang[module], name, value)
    r = A.expand(a)
    assert isinstance(r, str) and why in r, r
    assert calls == []


class _Format:
    def __init__(self, name):
        self.name = name


def test_a_0_5_23_layer_bound_to_the_triton_runner_is_taken_by_its_own_backend(sglang):
    """0.5.23's Qwen3-MoE block binds its TopK to the experts' runner: topk_config.runner_backend is the layer's
    backend and output_format STANDARD (TopK.forward_cuda refuses None). That layer is taken whatever the global flag
    says (a speculative draft's layers run their own runner); one bound to another runner or forced to another
    output format is not. Before, every real 0.5.23 layer read "TopK's output format is forced"."""
    setattr(sglang[AD._TOPK], "get_moe_runner_backend", lambda: _Backend("flashinfer_trtllm"))
    bound = {"output_format": _Format("STANDARD"), "runner_backend": _Backend("triton")}
    a, calls, _ = _block(sglang, topk_cfg=bound)
    assert isinstance(A.expand(a), dict) and len(calls) == 1
    for cfg, why in (({**bound, "runner_backend": _Backend("flashinfer_cutlass")}, "MoE runner backend"),
                     ({**bound, "output_format": _Format("BYPASSED")}, "output format is forced (BYPASSED)")):
        a, calls, _ = _block(sglang, topk_cfg=cfg)
        r = A.expand(a)
        assert isinstance(r, str) and why in r, r
        assert calls == []


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_where_each_version_keeps_topk_s_output_format_and_runner_backend(which, request):
    """What `_topk_problem` reads, held to each version's source: 0.5.17's TopKConfig has no runner_backend and its
    topk module imports the global get_moe_runner_backend (output_format None: decided per call); 0.5.23's
    Qwen3MoeSparseMoeBlock binds its TopK to self.experts.runner_backend, bind_runner_backend stores that backend in
    topk_config.runner_backend and sets output_format (STANDARD for the Triton runner), and forward_cuda raises where
    output_format is None."""
    import ast

    root = _sglang_root(which, request)
    src = (root / "srt/layers/moe/topk.py").read_text()
    tree = ast.parse(src)
    cls = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    fields = {t.target.id for t in cls["TopKConfig"].body if isinstance(t, ast.AnnAssign)}
    methods = {f.name: ast.get_source_segment(src, f) for f in cls["TopK"].body if isinstance(f, ast.FunctionDef)}
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "output_format" in fields
    if which == "0.5.17":
        assert "runner_backend" not in fields and "bind_runner_backend" not in methods
        assert "get_moe_runner_backend" in imported
        return
    assert "runner_backend" in fields
    bind = methods["bind_runner_backend"]
    assert "self.topk_config.runner_backend = runner_backend" in bind
    assert "output_format = TopKOutputFormat.STANDARD" in bind and "self.topk_config.output_format = output_format" in bind
    assert "TopK requires the owning experts' runner backend or an explicit output format" in methods["forward_cuda"]
    block = (root / "srt/models/qwen3_moe.py").read_text()
    assert re.search(r"self\.topk\.bind_runner_backend\(\s*self\.experts\.runner_backend", block)


def test_expand_declines_another_experts_layer_or_runner_and_hooks(sglang):
    for change, why in (
            (lambda ex: setattr(ex, "quant_method", object()), "not the unquantized MoE"),
            (lambda ex: setattr(ex.quant_method, "runner", types.SimpleNamespace(runner_backend=_Backend("deep_gemm"))),
             "Triton runner"),
            (lambda ex: setattr(ex.quant_method, "_aiter_runner", object()), "Triton runner"),
            # 0.5.23 with SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED: w13's rows reordered after loading
            (lambda ex: setattr(ex.quant_method, "w13_swiglu_interleaved", True), "interleaved"),
            (lambda ex: setattr(ex, "dispatcher", object()), "not the standard one"),
            (lambda ex: setattr(ex, "moe_ep_size", 2), "sharded"),
            (lambda ex: setattr(ex, "w13_weight_bias", torch.zeros(1)), "w13_weight_bias"),
            (lambda ex: ex.register_forward_hook(lambda *a: None), "hooks")):
        a, calls, _ = _block(sglang)
        change(a["self"].experts)
        r = A.expand(a)
        assert isinstance(r, str) and why in r, (why, r)
        assert calls == []


def _tp2(sglang, **module_names):
    """A TP-2 block (its experts sharded by MoE TP 2) with the block's module holding `module_names`."""
    a, calls, _ = _block(sglang, tp_size=2)
    a["self"].experts.moe_tp_size = 2
    for n, v in module_names.items():
        setattr(sglang[AD._MOE], n, v)
    return a, calls


def test_tp2_under_0_5_17_runs_the_block_s_all_reduce_tail_on_the_op_s_output(sglang):
    """0.5.17's forward_normal ends with moe_tensor_model_parallel_all_reduce unless
    should_skip_post_experts_all_reduce(is_tp_path=True): `returns` runs it once, on the op's (partial) output."""
    reduced, asked = [], []

    def all_reduce(t):
        reduced.append(t)
        return t * 2

    def skip(is_tp_path):
        asked.append(is_tp_path)
        return False

    a, calls = _tp2(sglang, moe_tensor_model_parallel_all_reduce=all_reduce, should_skip_post_experts_all_reduce=skip)
    c = A.expand(a)
    assert not isinstance(c, str), c
    assert c["all_reduce"] is all_reduce and asked == [True] and len(calls) == 1
    c["out"].fill_(1.5)
    r = A.returns(c)
    assert reduced == [c["out"]] and torch.equal(r, torch.full_like(c["out"], 3.0))


def test_tp2_reduce_skipped_or_in_0_5_23_s_layer_boundary_returns_the_partial_sum(sglang):
    a, _ = _tp2(sglang, moe_tensor_model_parallel_all_reduce=lambda t: 1 / 0,
                should_skip_post_experts_all_reduce=lambda is_tp_path: True)  # a later component fuses the sum
    c = A.expand(a)
    assert c["all_reduce"] is None and A.returns(c) is c["out"]
    for n in ("moe_tensor_model_parallel_all_reduce", "should_skip_post_experts_all_reduce"):
        delattr(sglang[AD._MOE], n)
    c = A.expand(a)  # 0.5.23: the block's module imports neither; its layer boundary sums the block's output
    assert c["all_reduce"] is None and A.returns(c) is c["out"]
    sglang[AD._MOE].moe_tensor_model_parallel_all_reduce = lambda t: t
    r = A.expand(a)
    assert isinstance(r, str) and "half of 0.5.17's all-reduce tail" in r


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_the_block_sums_across_ranks_where_the_adapter_expects(which, request):
    """What `_all_reduce_tail` reads the version from, held to each version's source: forward_normal calls
    moe_tensor_model_parallel_all_reduce (after should_skip_post_experts_all_reduce) exactly where the module imports
    both (0.5.17); where it imports neither (0.5.23) the block returns the partial sum and the decoder layer's
    ffn_boundary.finish follows self.mlp."""
    import ast

    src = (_sglang_root(which, request) / "srt/models/qwen3_moe.py").read_text()
    tree = ast.parse(src)
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    block = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen3MoeSparseMoeBlock")
    fwd = next(n for n in block.body if isinstance(n, ast.FunctionDef) and n.name == "forward_normal")
    called = {n.func.id for n in ast.walk(fwd) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    names = {"moe_tensor_model_parallel_all_reduce", "should_skip_post_experts_all_reduce"}
    if which == "0.5.17":
        assert names <= imported and names <= called
    else:
        assert not names & imported and not names & called
        layer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen3MoeDecoderLayer")
        body = ast.get_source_segment(src, next(n for n in layer.body
                                                if isinstance(n, ast.FunctionDef) and n.name == "forward"))
        assert body.index("self.ffn_boundary.finish(") > body.index("self.mlp(")


def test_declined_keeps_and_the_precheck():
    assert AD.MAX_TOKENS == A.max_tokens == 1
    assert A.kept_by_sglang((1, 2048, 768, 128, 8)) is None
    assert "2 tokens" in A.kept_by_sglang((2, 2048, 768, 128, 8))
    assert "tokens" in A.precheck((None, torch.randn(2, 64)), {})
    assert "tokens" in A.precheck((None,), {"hidden_states": torch.randn(2, 64)})
    assert A.precheck((None, torch.randn(1, 64)), {}) is None


@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_the_binder_takes_a_call_through_the_real_signature(sglang, which, request):
    """forward_normal(self, hidden_states) as each version defines it binds to the adapter; a prefill call leaves at
    the precheck, before binding."""
    from astra_sglang.patch.adapters import Binder
    from sglang_signatures import real_function

    fn = real_function(_sglang_root(which, request).parent, "sglang.srt.models.qwen3_moe", "forward_normal")
    b = Binder(fn, A, SPEC)
    assert b.ok, b.problem
    a, calls, logits = _block(sglang)
    canon, _ = b.bind((a["self"], a["hidden_states"]), {})
    assert isinstance(canon, dict) and canon["router_logits"] is logits and len(calls) == 1
    assert "tokens" in A.precheck((a["self"], torch.randn(4, 64)), {})


def test_the_installed_sequence_routes_then_runs_moe_experts_sequence(monkeypatch):
    """sequence: SGLang's fused_topk on the logits (renormalized, the op's top-k), then moe_experts' sequence with its
    weights and ids (fused_experts_impl in place on out)."""
    seen = {}
    topk_mod = types.ModuleType(AD._TOPK)

    def fused_topk(hidden_states, gating_output, topk, renormalize):
        seen["topk"] = (gating_output, topk, renormalize)
        return torch.ones(1, topk), torch.zeros(1, topk, dtype=torch.int32)

    topk_mod.fused_topk = fused_topk
    monkeypatch.setitem(sys.modules, AD._TOPK, topk_mod)
    monkeypatch.setattr(AD.experts_adapter, "sequence", lambda c: seen.setdefault("experts", c))
    c = {"x": torch.randn(1, 64), "router_logits": torch.randn(1, 8), "act": torch.empty(1, 3, 32)}
    AD.sequence(c)
    assert seen["topk"][0] is c["router_logits"] and seen["topk"][1:] == (3, True)
    assert seen["experts"]["topk_ids"].shape == (1, 3) and seen["experts"]["x"] is c["x"]


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_builds_and_passes_the_static_checks(tmp_path, monkeypatch):
    if not shutil.which("nm"):
        pytest.skip("needs binutils nm")
    from astra_sglang.patch.apply import build_kernel
    from astra_sglang.registry import shipped_kernel
    from astra_sglang.static_checks import errors, scan_file

    src = shipped_kernel(OP)
    assert not errors(scan_file(src, []))
    text = src.read_text()
    assert "namespace astra_mtx {" in text and "#include \"" not in text and "ROUTE_FOLD" not in text
    # kernel 1 ranks its slot's expert from the logits after its PDL wait; kernel 2 routes before its own, the ids
    # before its first w2 load and the weights after it
    k1 = text[text.index("gate_up_act_kernel("):]
    assert k1.index("pdl_wait();") < k1.index("route_rank<T>(logits")
    k2 = text[text.index("down_chunks_kernel("):]
    assert k2.index("window_ids<T>(logits") < k2.index("load_stream(") < k2.index("window_weights<T>(logits") < \
        k2.index("pdl_wait();")
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    lib = build_kernel(OP, arch="sm_90")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert SPEC.symbol in syms


ORDER_CHECK = r"""
#include KERNEL
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>
using namespace astra_mtx;
// every 16-bit pattern: the rank orders as the router's fp32 comparison of to_f(x) (NaN as -1e30, -0 as +0)
template <typename T, typename F> int check(const char* name, F to_float) {
  std::vector<std::pair<float, unsigned>> v;
  for (unsigned b = 0; b < 65536; ++b) {
    const unsigned short s = static_cast<unsigned short>(b);
    T x;
    *reinterpret_cast<unsigned short*>(&x) = s;
    float f = to_float(x);
    f = std::isnan(f) ? -1e30f : (f == 0.f ? 0.f : f);
    const unsigned r = logit_rank<T>(x);
    if (r >= (1u << 17)) { std::printf("%s %04x: rank %u past 17 bits\n", name, b, r); return 1; }
    v.emplace_back(f, r);
  }
  std::sort(v.begin(), v.end());
  for (size_t i = 1; i < v.size(); ++i)
    if ((v[i - 1].first < v[i].first) != (v[i - 1].second < v[i].second) || v[i - 1].second > v[i].second) {
      std::printf("%s: %g (rank %u) before %g (rank %u)\n", name, v[i - 1].first, v[i - 1].second, v[i].first,
                  v[i].second);
      return 1;
    }
  if (v.front().first != -INFINITY || v.front().second != neg_inf_rank<T>()) {
    std::printf("%s: -inf\n", name);
    return 1;
  }
  std::printf("%s ok\n", name);
  return 0;
}
int main() {
  return check<__nv_bfloat16>("bf16", [](__nv_bfloat16 x) { return __bfloat162float(x); }) |
         check<__half>("fp16", [](__half x) { return __half2float(x); });
}
"""


@pytest.mark.nvcc
def test_logit_rank_orders_every_16_bit_logit_as_the_router(tmp_path):
    """One warp max over (rank << 7 | 127 - id) is the router's argmax only if the rank orders every bf16 / fp16
    value (NaN as -1e30, -0 as +0) as fp32 does: checked over all 65536 patterns of each, on the host."""
    from astra_sglang.registry import shipped_kernel

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = tmp_path / "order.cu"
    src.write_text(ORDER_CHECK.replace("KERNEL", f'"{shipped_kernel(OP)}"'))
    r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-o", str(tmp_path / "order"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = subprocess.run([str(tmp_path / "order")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split("\n")[:2] == ["bf16 ok", "fp16 ok"], out.stdout + out.stderr


@pytest.mark.nvcc
def test_no_register_spills_at_sm_90a(tmp_path):
    """The shipped build at sm_90a: every kernel instantiation spill-free."""
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.registry import shipped_kernel

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, *kernel_flags(SPEC, Arch(9, 0)), "-Xptxas", "-v", "-c", str(shipped_kernel(OP)),
           "-o", str(tmp_path / "k.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    assert len(spills) >= 4 and all(s == ("0", "0") for s in spills), r.stderr


# ------------------------------------------------------------------------------------------ the CLI and the layer
def test_astra_sglang_ops_lists_it_on_by_default(capsys):
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.config import default_ops, parse_ops

    code, out, _ = run_cli(["ops", "--json"], capsys)
    assert code == 0
    row = {r["op"]: r for r in json.loads(out)}[OP]
    assert row["kernel"] and row["validate"] and row["missing"] == [] and row["extract"] == ["installed"]
    assert row["patch"] == [TARGET] and not row["default_off"] and AD.DEFAULT_OFF == ""
    known = patchable_ops()
    assert OP in parse_ops("all", known, default_ops(known)) and OP not in parse_ops("all,-" + OP, known,
                                                                                    default_ops(known))


def test_layer_imports_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)
