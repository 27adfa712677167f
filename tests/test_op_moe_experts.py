"""moe_experts (kernels/moe_experts/): the FUSED routed experts of an unquantized silu-gated MoE at decode sizes (up to
the adapter's MAX_TOKENS; gate_up GEMV + SiLU-and-mul, down GEMV with the router weights + the top-k sum, two
launches), replacing SGLang 0.5.17's fused_experts. On CPU: the spec (ABI, corpus, the fp64 reference against an
independent composition rounded where SGLang stores, -1 ids under expert parallelism, the routed scaling factor,
make_inputs' routing) and the harness on the edge shapes; the installed variant's facts in sglang 0.5.17 and 0.5.23;
the adapter's routing with stand-in arguments (a decode call taken into a new tensor, every decline a reason, the
runtime switches, the real 0.5.17 signature bound); validate's n/a rule and the precheck; patch/layers.py's
moe_server_defaults with stand-in SGLang modules; the shipped kernel's sm_90a build (no spills) and static checks;
`astra-sglang ops`.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import types
import typing

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import run_cli  # noqa: E402
from sglang_source import _sglang_root  # noqa: E402

OP = "moe_experts"
SPEC = get_op(OP)
AD = op_part(OP, "adapter")
A = AD.ADAPTER
TARGET = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:fused_experts"
FM = TARGET.split(":")[0]
FM_CONFIG = FM + "_triton_config"
TD = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_symbols_and_what_it_replaces():
    assert SPEC.symbol == "astra_moe_experts"
    assert SPEC.dim_names == ("num_tokens", "hidden", "inter", "num_experts", "topk")
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_moe_experts(const void* x, const void* w13, const void* w2, '
        "const void* topk_weights, const void* topk_ids, void* act, void* out, int64_t num_tokens, int64_t hidden, "
        "int64_t inter, int64_t num_experts, int64_t topk, double routed_scaling_factor, int dtype, "
        "cudaStream_t stream)")
    assert SPEC.replaces == (TARGET,)
    assert [v.name for v in SPEC.variants] == ["installed"] and SPEC.variant("installed").callable == TARGET
    # act is the kernel's scratch: an inout ABI argument the reference never returns (never compared)
    assert {a.name: a.role for a in SPEC.abi if a.ctype == "ptr"}["act"] == "inout"
    inp = SPEC.make_inputs((1, 8, 8, 4, 1), "bf16", torch.Generator().manual_seed(0), device="cpu")
    assert set(SPEC.reference(inp, (1, 8, 8, 4, 1), SPEC.scalars(None))) == {"out"}
    # decode only; every H and I a multiple of 8 (the kernel's 16-byte vectors)
    dims = {s.dims for s in SPEC.corpus}
    assert {s.tags for s in SPEC.corpus} == {("decode",), ("decode", "validate")}
    assert {d[0] for d in dims} == {1, 2, 4, 8}
    assert (1, 2048, 768, 128, 8) in dims and (2, 4096, 14336 // 8, 8, 2) in dims  # Qwen3-30B-A3B, Mixtral tp8
    assert all(h % 8 == 0 and i % 8 == 0 for _, h, i, _, _ in list(dims) + [s.dims for s in SPEC.edge_shapes])


# ------------------------------------------------------------------------------------------ the reference
def _composed(inp, dims, td, scale=1.0):
    """The expert sequence written out with batched torch ops: fp64 GEMMs, each stored step rounded to td, an id
    outside [0, E) masked out."""
    t, h, i, e, k = dims
    r = lambda v: v.to(td).double()  # noqa: E731
    ids = inp["topk_ids"].long()
    live = ((ids >= 0) & (ids < e)).double()[..., None]
    idx = ids.clamp(0, e - 1)
    gu = r(torch.einsum("th,tkjh->tkj", inp["x"].double(), inp["w13"].double()[idx]))
    g, u = gu[..., :i], gu[..., i:]
    act = r(g / (1.0 + torch.exp(-g)) * u)
    down = torch.einsum("tkj,tkhj->tkh", act, inp["w2"].double()[idx])
    out = r((r(inp["topk_weights"].double()[..., None] * down) * live).sum(dim=1))
    return r(out * scale) if scale != 1.0 else out


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dims,dist", [((2, 64, 32, 8, 3), "normal"), ((4, 64, 32, 8, 3), "ep"),
                                       ((3, 128, 48, 16, 8), "normal")])
def test_reference_rounds_each_stored_step_like_sglang(dtype, dims, dist):
    td = TD[dtype]
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(0), dist, device="cpu")
    f64 = {n: v.double() if v.is_floating_point() else v for n, v in inp.items()}
    ref = SPEC.reference(f64, dims, SPEC.scalars(dims), model_dtype=td)["out"]
    assert ref.dtype == torch.float64 and ref.shape == (dims[0], dims[1]) and 0.05 < float(ref.std()) < 3.0
    assert torch.equal(ref, _composed(inp, dims, td))
    # the patch's self-check hands the model's own tensors: the dtype is inferred, the result the same
    assert torch.equal(SPEC.reference(inp, dims, SPEC.scalars(dims))["out"], ref)
    # fp64 copies without the dtype: nothing rounded, a different result (the rounding is what is checked)
    assert not torch.equal(SPEC.reference(f64, dims, SPEC.scalars(dims))["out"], ref)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_routed_scaling_factor_rounds_the_scaled_sum_again(dtype):
    dims, td = (2, 64, 32, 8, 3), TD[dtype]
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(0), device="cpu")
    one = SPEC.reference(inp, dims, {"routed_scaling_factor": 1.0})["out"]
    scaled = SPEC.reference(inp, dims, {"routed_scaling_factor": 2.5})["out"]
    assert torch.equal(scaled, (one * 2.5).to(td).double()) and torch.equal(scaled, _composed(inp, dims, td, 2.5))
    assert not torch.equal(scaled, one * 2.5)  # some scaled sums are not in the dtype: rounded once more


def test_ids_outside_the_experts_contribute_nothing():
    dims = (4, 64, 32, 8, 3)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(0), "ep", device="cpu")
    ids, wts = inp["topk_ids"], inp["topk_weights"]
    gone = ids < 0
    assert gone.any() and (~gone).any()
    ref = SPEC.reference(inp, dims, {})["out"]
    # the dropped slots' weights do not matter; an id past E is dropped as -1 is; a real expert at weight 0 adds 0
    assert torch.equal(SPEC.reference({**inp, "topk_weights": torch.where(gone, 1e6, wts)}, dims, {})["out"], ref)
    assert torch.equal(SPEC.reference({**inp, "topk_ids": torch.where(gone, 8, ids)}, dims, {})["out"], ref)
    zeroed = {**inp, "topk_ids": torch.where(gone, 0, ids), "topk_weights": torch.where(gone, 0.0, wts)}
    assert torch.equal(SPEC.reference(zeroed, dims, {})["out"], ref)
    assert not torch.equal(SPEC.reference({**inp, "topk_ids": torch.where(gone, 0, ids)}, dims, {})["out"], ref)


# ------------------------------------------------------------------------------------------ inputs and the harness
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_make_inputs_routes_k_distinct_experts_with_weights_summing_to_one(dtype):
    t, h, i, e, k = dims = (3, 64, 16, 8, 4)
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(0), "normal", device="cpu")
    shapes = {"x": (t, h), "w13": (e, 2 * i, h), "w2": (e, h, i), "act": (t, k, i), "out": (t, h)}
    for n, s in shapes.items():
        assert inp[n].shape == s and inp[n].dtype == TD[dtype], n
    ids, wts = inp["topk_ids"], inp["topk_weights"]
    assert ids.dtype == torch.int32 and ids.shape == (t, k) and wts.dtype == torch.float32 and wts.shape == (t, k)
    assert ((ids >= 0) & (ids < e)).all() and all(len(set(row.tolist())) == k for row in ids)
    assert torch.allclose(wts.sum(dim=-1), torch.ones(t), atol=1e-6) and (wts > 0).all()
    ep = SPEC.make_inputs((8, 64, 16, 8, 4), dtype, torch.Generator().manual_seed(0), "ep", device="cpu")
    assert (ep["topk_ids"] == -1).any() and (ep["topk_ids"] < e).all()
    moved = [SPEC.bytes_moved((n, 2048, 768, 128, 8), dtype) for n in (1, 2, 4, 8)]
    assert 0 < moved[0] < moved[1] < moved[2] < moved[3]


def test_harness_runs_every_edge_shape_on_cpu():
    from reference_harness import run_edge_cases_on_cpu

    # corpus[0] (Qwen3-30B-A3B's whole 128-expert stacks) takes minutes on a CPU: the smallest edge shape stands in
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
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts) == 8
    assert m["sources"]["sglang_py"]["version"] == which and "--use_fast_math" in m["flags"]


# ------------------------------------------------------------------------------------------ the adapter's routing
def _call(t=None, h=64, i=32, e=8, k=3, dtype=torch.bfloat16, w_dtype=None, ids_dtype=torch.int32, w2_shape=None,
          cfg=None, **kw):
    """fused_experts' arguments as expand gets them: stand-ins, the plain silu-gated MoE's runner config."""
    g, t = torch.Generator().manual_seed(0), t or AD.MAX_TOKENS  # the most tokens the adapter takes
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(ids_dtype)
    config = dict(activation="silu", is_gated=True, apply_router_weight_on_input=False, no_combine=False,
                  gemm1_alpha=None, gemm1_clamp_limit=None, swiglu_limit=None, routed_scaling_factor=None,
                  num_experts=None, num_local_experts=None, inplace=True)
    return {"hidden_states": torch.randn(t, h, generator=g).to(dtype),
            "w1": torch.randn(e, 2 * i, h, generator=g).to(w_dtype or dtype),
            "w2": torch.randn(*(w2_shape or (e, h, i)), generator=g).to(w_dtype or dtype),
            "topk_output": (torch.full((t, k), 1.0 / k), ids, None),
            "moe_runner_config": types.SimpleNamespace(**{**config, **(cfg or {})}), **kw}


@pytest.fixture
def on_cpu(monkeypatch):
    """CPU tensors allowed; no SGLang fused_moe module loaded (its runtime switches read as off)."""
    monkeypatch.setattr(AD, "DEVICES", ("cuda", "cpu"))
    monkeypatch.delitem(sys.modules, FM, raising=False)


def test_expand_takes_a_decode_call_into_a_new_tensor(on_cpu):
    a = _call()
    c = A.expand(a)
    assert not isinstance(c, str), c
    x, (wts, ids, _) = a["hidden_states"], a["topk_output"]
    assert c["x"] is x and c["w13"] is a["w1"] and c["w2"] is a["w2"] and c["topk_ids"] is ids
    assert c["topk_weights"] is wts and c["routed_scaling_factor"] == 1.0 and c["filter_expert"] is True
    assert c["out"] is not x and c["out"].data_ptr() != x.data_ptr() and c["out"].shape == x.shape
    assert c["act"].shape == (AD.MAX_TOKENS, 3, 32) and c["act"].dtype == c["out"].dtype == x.dtype
    assert A.returns(c) is c["out"]
    assert A.expand(_call(cfg={"inplace": False, "routed_scaling_factor": 2.5}))["routed_scaling_factor"] == 2.5
    # every local expert: SGLang's unfiltered kernels, as fused_experts picks them
    assert A.expand(_call(cfg={"num_experts": 8, "num_local_experts": 8}))["filter_expert"] is False


DECLINES = [pytest.param("tokens", dict(t=AD.MAX_TOKENS + 1), id="tokens")]
DECLINES += [pytest.param(n, {n: True}, id=n) for n in AD._QUANT_FLAGS]
DECLINES += [pytest.param(n, {n: torch.zeros(1)}, id=n) for n in ("b1", "w1_scale", "a1_q")]
# 0.5.23 with SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED reorders w13's rows after loading and says so in this argument
DECLINES += [pytest.param("interleaved", dict(fuse_swiglu_interleaved=True), id="fuse_swiglu_interleaved")]
DECLINES += [pytest.param(why, dict(cfg={n: v}), id=n) for why, n, v in (
    ("'gelu'", "activation", "gelu"), ("not gated", "is_gated", False),
    ("on the input", "apply_router_weight_on_input", True), ("no_combine", "no_combine", True),
    ("gemm1_alpha", "gemm1_alpha", 1.702), ("swiglu_limit", "swiglu_limit", 10.0))]
DECLINES += [
    pytest.param("not int32 / fp32", dict(ids_dtype=torch.int64), id="int64-ids"),
    pytest.param("not one fp16 / bf16 dtype", dict(w_dtype=torch.float16), id="fp16-weights-bf16-x"),
    pytest.param("w2 (8, 64, 16) is not (8, 64, 32)", dict(w2_shape=(8, 64, 16)), id="w2-shape"),
    pytest.param("not multiples of 8", dict(h=60), id="hidden-60"),
]


@pytest.mark.parametrize("why,kw", DECLINES)
def test_expand_declines_with_a_reason(on_cpu, why, kw):
    r = A.expand(_call(**kw))
    assert isinstance(r, str) and why in r, r


def test_expand_declines_under_sglang_s_fused_sum_all_reduce_and_batch_invariance(on_cpu, monkeypatch):
    fm = types.ModuleType(FM)
    fm.get_exec = lambda: types.SimpleNamespace(moe=types.SimpleNamespace(enable_fused_moe_sum_all_reduce=True))
    monkeypatch.setitem(sys.modules, FM, fm)
    assert "all-reduce" in A.expand(_call())
    fm.get_exec = lambda: (_ for _ in ()).throw(ValueError("config namespace 'exec' not published"))
    assert not isinstance(A.expand(_call()), str)  # outside a server: the default, off
    fm.is_batch_invariant_mode_enabled = lambda: True
    assert "batch-invariant" in A.expand(_call())


def test_normalize_gives_the_dims_and_declines_out_aliasing_x(on_cpu):
    c = A.expand(_call())
    views, dims = AD._normalize(c)
    assert dims == (AD.MAX_TOKENS, 64, 32, 8, 3) and views["out"] is c["out"] and set(views) == {
        "x", "w13", "w2", "topk_weights", "topk_ids", "act", "out"}
    assert "out is x" in AD._normalize({**c, "out": c["x"]})


def test_declined_keeps_and_the_precheck_say_n_a_beyond_max_tokens():
    n = AD.MAX_TOKENS
    assert 1 <= n == A.max_tokens <= 4  # a decode op: SGLang keeps every larger call
    assert isinstance(A.kept_by_sglang((8, 2048, 768, 128, 8)), str) and "tokens" in AD.declined(n + 1, 2048, 768)
    assert A.kept_by_sglang((n, 2048, 768, 128, 8)) is None and AD.declined(n, 2048, 768) is None
    assert "multiples of 8" in AD.declined(1, 2052, 768) and "multiples of 8" in AD.declined(1, 2048, 764)
    # from 2 tokens, experts wider than MAX_INTER_MULTI columns stay SGLang's (Mixtral tp4 ran 0.90x there)
    assert AD.declined(1, 4096, 3584) is None and AD.declined(2, 2048, AD.MAX_INTER_MULTI) is None
    assert "3584-column experts" in AD.declined(2, 4096, 3584)
    assert {s.dims[0] for s in SPEC.corpus if A.kept_by_sglang(s.dims) is None} == {1, 2, 4, 8} & set(range(n + 1))
    # the precheck: a call of more tokens leaves before binding, positional or keyword
    assert "tokens" in A.precheck((torch.randn(n + 1, 64),), {})
    assert "tokens" in A.precheck((), {"hidden_states": torch.randn(n + 1, 64)})
    assert A.precheck((torch.randn(n, 64),), {}) is None and A.precheck((), {}) is None


def test_validate_runs_a_2_token_row_taken_and_one_left_to_sglang_by_its_width():
    """validate's decode sample held no real 2-token row (session 31's GPU validate: 32 passed, none at 2 tokens of a
    corpus model), so MAX_INTER_MULTI had never run in SGLang's layer: it now takes Qwen3-30B-A3B's 2 tokens (the
    adapter's) and Mixtral tp8's (left to SGLang: 1792-column experts)."""
    from astra_sglang.patch.validate import validation_shapes

    rows = {s.dims for s in validation_shapes(SPEC, "validate")}
    taken, left = op_part(OP, "spec").VALIDATE_ROWS
    assert {taken, left} <= rows and {taken, left} <= {s.dims for s in SPEC.corpus}
    assert A.kept_by_sglang(taken) is None and taken[2] <= AD.MAX_INTER_MULTI and taken[0] == 2 <= AD.MAX_TOKENS
    assert "1792-column experts" in A.kept_by_sglang(left) and left[2] > AD.MAX_INTER_MULTI


def _fused_experts_binder(which, request):
    """The adapter's binder on `which` version's real fused_experts signature."""
    from astra_sglang.patch.adapters import Binder
    from sglang_signatures import real_function

    names = {"Optional": typing.Optional, "List": typing.List, "StandardTopKOutput": object,
             "MoeRunnerConfig": object}
    b = Binder(real_function(_sglang_root(which, request).parent, FM, "fused_experts", names=names), A, SPEC)
    assert b.ok, b.problem
    return b


_ARGS = ("hidden_states", "w1", "w2", "topk_output", "moe_runner_config")


@pytest.mark.wheels
def test_the_binder_takes_a_decode_call_through_0_5_17_s_signature(on_cpu, request):
    b, a = _fused_experts_binder("0.5.17", request), _call()
    canon, _ = b.bind(tuple(a[n] for n in _ARGS), {})
    assert isinstance(canon, dict) and canon["x"] is a["hidden_states"]
    assert "use_fp8_w8a8" in b.bind((), {**a, "use_fp8_w8a8": True})[1]


@pytest.mark.wheels
def test_0_5_23_s_interleaved_w13_reaches_the_adapter_and_is_declined(on_cpu, request):
    """0.5.23's fused_experts takes fuse_swiglu_interleaved (its Triton runner passes the quant method's
    w13_swiglu_interleaved, True once SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED reordered the rows): bound through the real
    signature, such a call stays SGLang's; a plain one is taken."""
    b, a = _fused_experts_binder("0.5.23", request), _call()
    args = tuple(a[n] for n in _ARGS)
    assert isinstance(b.bind(args, {})[0], dict)
    why = b.bind(args, {"fuse_swiglu_interleaved": True})[1]
    assert "interleaved" in why, why


# ------------------------------------------------------------------------------------------ moe_server_defaults
def _unpublished():
    raise ValueError("config namespace 'exec' not published")


@pytest.fixture
def sglang_modules(monkeypatch):
    """Stand-in sglang.srt.runtime_context (unpublished: outside a server) and the two modules fused_experts_impl
    reads the runtime config through, each with a get_exec that raises."""
    mods = {n: types.ModuleType(n) for n in ("sglang", "sglang.srt", "sglang.srt.runtime_context", FM, FM_CONFIG)}
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    mods["sglang.srt"].runtime_context = mods["sglang.srt.runtime_context"]
    for n in ("sglang.srt.runtime_context", FM, FM_CONFIG):
        mods[n].get_exec = _unpublished
    return mods


def test_moe_server_defaults_answers_as_a_default_server_and_restores(sglang_modules):
    from astra_sglang.patch.layers import moe_server_defaults

    fm, cfg = sglang_modules[FM], sglang_modules[FM_CONFIG]
    with moe_server_defaults():
        for m in (fm, cfg):
            ex = m.get_exec()
            assert ex.moe.enable_fused_moe_sum_all_reduce is False
            assert ex.deterministic.enable_deterministic_inference is False
    assert fm.get_exec is _unpublished and cfg.get_exec is _unpublished
    with pytest.raises(RuntimeError), moe_server_defaults():
        raise RuntimeError("the sequence failed")
    assert fm.get_exec is _unpublished and cfg.get_exec is _unpublished  # restored on an error too
    del cfg.get_exec  # a version whose config lookup reads no runtime config: given none
    with moe_server_defaults():
        assert not hasattr(cfg, "get_exec") and fm.get_exec() is not None
    assert not hasattr(cfg, "get_exec")


def test_moe_server_defaults_changes_nothing_inside_a_server(sglang_modules):
    from astra_sglang.patch.layers import moe_server_defaults

    sglang_modules["sglang.srt.runtime_context"].get_exec = lambda: types.SimpleNamespace()
    with moe_server_defaults():
        assert sglang_modules[FM].get_exec is _unpublished and sglang_modules[FM_CONFIG].get_exec is _unpublished


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_builds_with_the_op_s_flags_and_passes_the_static_checks(tmp_path, monkeypatch):
    if not shutil.which("nm"):
        pytest.skip("needs binutils nm")
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.patch.apply import build_kernel
    from astra_sglang.registry import shipped_kernel
    from astra_sglang.static_checks import errors, scan_file

    src = shipped_kernel(OP)
    assert not errors(scan_file(src, []))
    text = src.read_text()
    assert "namespace astra_moex {" in text and "griddepcontrol.wait" in text and "#include \"" not in text
    assert SPEC.c_signature().split("(")[0] in text and "ld.global.nc.L1::no_allocate" in text
    down = text[text.index("down_sum_kernel("):]  # it issues its first w2 vectors before the PDL wait
    assert down.index("load_stream(") < down.index("pdl_wait();")
    assert "--use_fast_math" in kernel_flags(SPEC, Arch(9, 0))
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    lib = build_kernel(OP, arch="sm_90")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert SPEC.symbol in syms


@pytest.mark.nvcc
@pytest.mark.parametrize("pdl", [0, 1])
def test_no_register_spills_at_sm_90a_with_or_without_pdl(pdl, tmp_path):
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.registry import shipped_kernel

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, *kernel_flags(SPEC, Arch(9, 0)), f"-DASTRA_PDL={pdl}", "-Xptxas", "-v", "-c",
           str(shipped_kernel(OP)), "-o", str(tmp_path / "k.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    entries = r.stderr.count("Compiling entry function")  # 2 dtypes x (gate_up + act, each down + sum instance)
    assert entries >= 4 and len(spills) == entries, r.stderr
    assert all(s == ("0", "0") for s in spills), r.stderr


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
    code, out, _ = run_cli(["ops"], capsys)
    assert code == 0 and OP in out


def test_layer_imports_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)


def test_the_self_check_reads_the_expert_stacks_in_place(tmp_path):
    """A server's first call of a shape runs SGLang's original beside the kernel on copies of the call's tensors; the
    expert stacks are GBs a layer (Qwen3-30B-A3B: 1.2 GB) that a server at its memory fraction cannot copy, so they are
    read where they are (adapter.read_only) while x, the routing and the outputs are still copied. A correct kernel
    passes, and both sides saw the layer's own weights."""
    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState

    dims = (1, 64, 32, 8, 3)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(3), "normal", device="cpu")
    want = SPEC.reference(inp, dims, SPEC.scalars(dims))["out"].to(torch.bfloat16)
    seen = {}

    class Backend:  # a correct kernel: the reference's result
        devices, dtypes = ("cpu",), ("fp16", "bf16")

        def launch(self, views, dims, dt, scalars):
            seen["kernel"] = (views["w13"].data_ptr(), views["w2"].data_ptr())
            views["out"].copy_(want)

    def original(c):
        seen["original"] = (c["w13"].data_ptr(), c["w2"].data_ptr(), c["x"].data_ptr())
        c["out"].copy_(want)

    st = OpState(SPEC, A, Backend(), CounterFile(tmp_path / "c", [OP]))
    views = {**{n: inp[n] for n in ("x", "w13", "w2", "topk_weights", "topk_ids", "act")},
             "out": torch.empty_like(inp["x"]), "routed_scaling_factor": 1.0}
    st.execute(views, dims, "bf16", original)
    assert st.last_check is not None and st.last_check.ok, st.last_check
    stacks = (inp["w13"].data_ptr(), inp["w2"].data_ptr())
    assert seen["kernel"] == stacks and seen["original"][:2] == stacks
    assert seen["original"][2] != inp["x"].data_ptr()  # the rest is still copied
    assert torch.equal(views["out"], want)
    assert set(A.read_only) == {"w13", "w2"}
