"""moe_router (kernels/moe_router/): the softmax top-k router SGLang runs through fused_topk -> the Triton router.

Spec and reference (the tie rule against a literal re-statement of _router_triton_kernel's loop), the one-hot
canonical form that makes ids exact, the installed-variant extract (manifest, source facts of 0.5.17 and 0.5.23, a
changed fact, no sglang), the adapter against fused_topk's real signatures, discovery of its call sites, the
installed baseline run by the check harness on the CPU (a stand-in module with fused_topk's signature: only here,
as a unit test of the binding), and the shipped kernel's sm_90a build."""
from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from astra_sglang.registry import get_op, op_part
from cli_run import one_error, run_cli  # noqa: E402
from sglang_signatures import real_function  # noqa: E402

SPEC = get_op("moe_router")
SPEC_MOD = __import__("astra_sglang.kernels.moe_router.spec", fromlist=["x"])


# A literal re-statement of _router_triton_kernel's softmax path (moe_fused_gate.py, 0.5.17) in torch fp32:
# biased = logit + 0; softmax; K rounds: max, lane = where(cur == max, n, N + 1), min lane, cur[win] = -inf;
# renormalize by the routed sum (1 when 0). Used by the tests as SGLang's semantics and by the stand-in module.
TRITON_LIKE = '''
import torch

def triton_like(scores, topk, renormalize):
    b = scores.to(torch.float32)
    n = b.shape[1]
    lanes = torch.arange(n).expand_as(b)
    act = torch.exp(b - b.max(dim=1, keepdim=True).values)
    act = act / act.sum(dim=1, keepdim=True)
    cur = torch.where(b == b, b, torch.full_like(b, -1e30))
    w = torch.zeros((b.shape[0], topk), dtype=torch.float32)
    ids = torch.zeros((b.shape[0], topk), dtype=torch.int32)
    for k in range(topk):
        mx = cur.max(dim=1, keepdim=True).values
        win = torch.where(cur == mx, lanes, torch.full_like(lanes, n + 1)).min(dim=1).values
        w[:, k] = act.gather(1, win[:, None])[:, 0]
        ids[:, k] = win.to(torch.int32)
        cur = cur.scatter(1, win[:, None], float("-inf"))
    if renormalize:
        s = w.sum(dim=1, keepdim=True)
        w = w / torch.where(s > 0, s, torch.ones_like(s))
    return w, ids

def fused_topk(hidden_states, gating_output, topk, renormalize, correction_bias=None, scoring_func="softmax",
               routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False, num_fused_shared_experts=0,
               packed_out=None, num_token_non_padded=None):
    assert hidden_states.shape[0] == gating_output.shape[0], "Number of tokens mismatch"
    assert scoring_func == "softmax"
    return triton_like(gating_output, topk, renormalize)
'''
_ns: dict = {}
exec(TRITON_LIKE, _ns)
triton_like = _ns["triton_like"]


# --------------------------------------------------------------------------- spec / reference
def test_corpus_from_real_configs_and_scalars():
    dims = {s.dims: s for s in SPEC.corpus}
    for name, e, k, _, _ in SPEC_MOD.ROUTER_MODELS:
        for t in SPEC_MOD.DECODE + SPEC_MOD.PREFILL:
            assert (t, e, k) in dims, name
    assert {"decode", "prefill"} <= {t for s in SPEC.corpus for t in s.tags}
    assert "if-no-triton-kernels" in dims[(1, 32, 4)].tags and "if-no-triton-kernels" not in dims[(1, 128, 8)].tags
    assert SPEC.scalars((1, 128, 8)) == {"topk": 8, "renormalize": 1}
    assert SPEC.scalars((1, 60, 4)) == {"topk": 4, "renormalize": 0}
    assert SPEC.bytes_moved((2, 128, 8), "bf16") == 2 * (256 + 64)
    assert all(s.dims[1] <= SPEC_MOD.MAX_EXPERTS and s.dims[2] <= 32 for s in list(SPEC.corpus) + list(SPEC.edge_shapes))


@pytest.mark.parametrize("dims", [(64, 128, 8), (16, 60, 4), (9, 8, 2), (5, 8, 8), (3, 1, 1), (4, 1000, 16)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_reference_is_sglangs_router_ids_exact(dims, dtype):
    for seed, dist in enumerate(SPEC.distributions):
        inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(seed), dist, device="cpu")
        assert inp["scores"].abs().sum() > 0
        sc = SPEC.scalars(dims)
        ref = SPEC.reference({"scores": inp["scores"].double()}, dims, sc)
        w, ids = triton_like(inp["scores"], dims[2], bool(sc["renormalize"]))
        got = SPEC.canonical({"topk_weights": w, "topk_ids": ids}, dims)
        assert torch.equal(got["topk_ids"].double(), ref["topk_ids"]), (dims, dtype, dist)
        assert torch.allclose(w.double(), ref["topk_weights"], rtol=1e-5, atol=1e-7)


def test_ties_go_to_the_lowest_id_in_descending_slots():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 2.0]], dtype=torch.float64)
    w, ids = SPEC_MOD.route(x, 4, True)
    assert ids.tolist() == [[1, 2, 4, 3]]
    assert triton_like(x.float(), 4, True)[1].tolist() == [[1, 2, 4, 3]]
    assert torch.allclose(w.sum(-1), torch.ones(1, dtype=torch.float64))
    w2, _ = SPEC_MOD.route(x, 4, False)  # unnormalized: softmax probabilities
    assert torch.allclose(w2, torch.softmax(x, -1)[0, [1, 2, 4, 3]][None])


def test_one_hot_canonical_makes_every_differing_id_fail():
    from astra_sglang.harness.numerics import rel_err, tolerance

    dims = (256, 128, 8)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(3), "normal", device="cpu")
    ref = SPEC.reference({"scores": inp["scores"].double()}, dims, SPEC.scalars(dims))
    _, ids = triton_like(inp["scores"], 8, True)
    ok = SPEC.canonical({"topk_ids": ids.clone()}, dims)["topk_ids"]
    assert rel_err(ok, ref["topk_ids"])["err"] == 0.0
    worst_allowed = tolerance(SPEC, "bf16", 0.0)  # the largest floor there is (ids reach the judge as fp32 one-hot)
    for a, b in ((0, 127), (126, 127), (5, 6)):
        bad = ids.clone()
        bad[17, 3] = b if int(bad[17, 3]) == a else a
        e = rel_err(SPEC.canonical({"topk_ids": bad}, dims)["topk_ids"], ref["topk_ids"])["err"]
        assert e > 1000 * worst_allowed, (a, b, e)
    swapped = ids.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]  # slot order is part of the contract
    assert rel_err(SPEC.canonical({"topk_ids": swapped}, dims)["topk_ids"], ref["topk_ids"])["err"] > 1
    junk = torch.full_like(ids, -0x5A5A)  # the harness's int poison: never a valid id
    assert rel_err(SPEC.canonical({"topk_ids": junk}, dims)["topk_ids"], ref["topk_ids"])["err"] > 0.5


# --------------------------------------------------------------------------- installed variant: extract
def _wheel(sglang_0_5_17_source, wheel_sources, which):
    return Path(sglang_0_5_17_source) if which == "0.5.17" else Path(wheel_sources["sglang"])


@pytest.mark.wheels
@pytest.mark.parametrize("which,bias,route", [
    ("0.5.17", "zero_bias", "_is_cuda and envs.SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK.get()"),
    ("0.5.23", "None", "_is_cuda or use_rocm_triton")])
def test_extract_installed_writes_a_manifest_and_no_cuda(which, bias, route, tmp_path, capsys,
                                                          sglang_0_5_17_source, wheel_sources):
    src = _wheel(sglang_0_5_17_source, wheel_sources, which)
    code, out, err = run_cli(["extract", "moe_router", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                               "--sglang-src", str(src)], capsys)
    assert code == 0, err
    ws = tmp_path / "ws" / "moe_router"
    m = json.loads((ws / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["variant"] == "installed"
    assert m["callable"] == "sglang.srt.layers.moe.topk:fused_topk"
    assert {k: m["launch_facts"][k] for k in ("ROUTE", "SOFTMAX_BIAS")} == {"ROUTE": route, "SOFTMAX_BIAS": bias}
    assert m["launch_facts"]["TAKEN"].startswith("cur = " if which == "0.5.17" else "remaining = ")
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert {f["file"] for f in m["source_facts"]} == {"srt/layers/moe/topk.py", "kernels/ops/moe/moe_fused_gate.py"}
    assert m["sources"]["sglang_py"]["version"] == which
    assert any(f.startswith("-DSGL_CUDA_ARCH=900") for f in m["flags"]) and "-std=c++20" in m["flags"]
    assert not (ws / "baseline.cu").exists() and (ws / "candidates").is_dir()
    from astra_sglang.build.workspace import Workspace

    w = Workspace.open("moe_router", path=ws)
    assert w.installed == m["callable"] and w.include_dirs == []
    from astra_sglang.errors import AstraError

    with pytest.raises(AstraError, match="no baseline to build"):
        w.build()


@pytest.mark.wheels
def test_extract_installed_fails_on_a_changed_tie_rule(tmp_path, capsys, sglang_0_5_17_source):
    src = tmp_path / "sglang-copy"
    pkg = src / "sglang"
    for rel in ("srt/layers/moe/topk.py", "kernels/ops/moe/moe_fused_gate.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(sglang_0_5_17_source) / "sglang" / rel, pkg / rel)
    gate = pkg / "kernels/ops/moe/moe_fused_gate.py"
    gate.write_text(gate.read_text().replace("tl.min(lane_id, axis=1)", "tl.max(lane_id, axis=1)"))
    code, _, err = run_cli(["extract", "moe_router", "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(src)], capsys)
    assert code == 2
    one_error(err, "moe_fused_gate.py", "lowest expert id")
    assert not (tmp_path / "ws" / "moe_router").exists()


def _installed_ws(tmp_path: Path) -> Path:
    """An installed-variant workspace as extract writes it (facts from the stand-in are not re-read here)."""
    from astra_sglang.build import compile_flags, parse_arch
    from astra_sglang.extract.installed import manifest_for
    from astra_sglang.extract.sources import Root

    v = SPEC.variant("installed")
    ws = tmp_path / "ws" / "moe_router"
    (ws / "candidates").mkdir(parents=True)
    m = manifest_for(SPEC, v, Root("sglang_py", tmp_path, (".",), "0.5.17", "installed"), "sm_90",
                     compile_flags(v.flag_profile, parse_arch("sm_90")), {}, [])
    (ws / "manifest.json").write_text(json.dumps(m))
    return ws


@pytest.mark.parametrize("cmd", ["check", "bench"])
def test_check_and_bench_say_one_error_without_sglang(cmd, tmp_path, capsys, monkeypatch):
    from astra_sglang.extract import sources

    ws = _installed_ws(tmp_path)
    monkeypatch.setattr(sources, "_pkg_dir", lambda name: None)
    code, _, err = run_cli([cmd, "moe_router", "--workspace", str(ws)], capsys)
    assert code == 2
    one_error(err, "sglang is not installed", "sglang.srt.layers.moe.topk:fused_topk")


@pytest.mark.wheels
def test_check_re_reads_the_facts_from_the_installed_sglang(tmp_path, capsys, monkeypatch, sglang_0_5_17_source):
    from astra_sglang.build.workspace import Workspace
    from astra_sglang.extract import sources
    from astra_sglang.harness.installed import describe_production, verify_installed

    ws = Workspace.open("moe_router", path=_installed_ws(tmp_path))
    monkeypatch.setattr(sources, "_pkg_dir", lambda name: Path(sglang_0_5_17_source) / "sglang")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda m, *a: object() if m.startswith("sglang") else real(m, *a))
    assert verify_installed(ws) == "installed:sglang.srt.layers.moe.topk:fused_topk"
    assert describe_production(ws).startswith("installed sglang.srt.layers.moe.topk:fused_topk")
    broken = tmp_path / "broken" / "sglang"
    shutil.copytree(Path(sglang_0_5_17_source) / "sglang" / "srt" / "layers" / "moe", broken / "srt/layers/moe")
    (broken / "kernels/ops/moe").mkdir(parents=True)
    gate = (Path(sglang_0_5_17_source) / "sglang/kernels/ops/moe/moe_fused_gate.py").read_text()
    (broken / "kernels/ops/moe/moe_fused_gate.py").write_text(gate.replace("activated = exp_row / row_sum", "x"))
    monkeypatch.setattr(sources, "_pkg_dir", lambda name: broken)
    code, _, err = run_cli(["check", "moe_router", "--workspace", str(ws.path)], capsys)
    assert code == 2
    one_error(err, "softmax weights", "the installed sglang")


# --------------------------------------------------------------------------- the harness on the installed callable
def test_check_harness_runs_the_installed_callable_as_production_on_cpu(tmp_path):
    """Unit test of the binding (CPU, a stand-in module with fused_topk's signature): InstalledImpl binds it
    through the adapter (hidden_states from bare_args, returned outputs copied into the ABI buffers); the oracle
    judges production and a candidate; a candidate with the wrong tie rule fails on ids."""
    from astra_sglang.harness.checkjob import run_check

    (tmp_path / "astra_fake_topk.py").write_text(TRITON_LIKE)
    cand = tmp_path / "cand.py"
    cand.write_text(textwrap.dedent('''
        import torch
        from astra_sglang.registry import get_op
        SPEC = get_op("moe_router")
        def good(t, dims, dtype, scalars):
            r = SPEC.reference({"scores": t["scores"].double()}, dims, scalars)
            w, ids = SPEC.kernels_route if False else (None, None)
            from astra_sglang.kernels.moe_router.spec import route
            w, ids = route(t["scores"].double(), dims[2], bool(scalars["renormalize"]))
            t["topk_weights"].copy_(w.float()); t["topk_ids"].copy_(ids.to(torch.int32))
        def highest_id_wins(t, dims, dtype, scalars):
            from astra_sglang.kernels.moe_router.spec import route
            x = t["scores"].double().flip(-1)
            w, ids = route(x, dims[2], bool(scalars["renormalize"]))
            t["topk_weights"].copy_(w.float()); t["topk_ids"].copy_((dims[1] - 1 - ids).to(torch.int32))
    '''))
    env = {"PYTHONPATH": str(tmp_path)}
    shapes = [s for s in SPEC.edge_shapes if s.dims[0] * s.dims[1] <= 8000] + [SPEC.corpus[0]]
    run = run_check(SPEC, "installed:astra_fake_topk:fused_topk", f"py:{cand}:good", shapes, ["bf16", "fp32"],
                    device="cpu", env=env, timeout=120)
    assert run.ok, run.failures[:3]
    assert {d["tensor"] for d in run.details} == {"topk_weights", "topk_ids"}
    assert all(d["prod_err"] == 0.0 for d in run.details if d["tensor"] == "topk_ids")
    bad = run_check(SPEC, "installed:astra_fake_topk:fused_topk", f"py:{cand}:highest_id_wins",
                    [s for s in SPEC.corpus if s.dims == (8, 128, 8)], ["bf16"], device="cpu", env=env, timeout=120)
    assert not bad.ok and any("topk_ids" in f for f in bad.failures), bad.failures[:3]


def test_installed_impl_binding_copies_what_a_call_copies(tmp_path, monkeypatch):
    import sys

    from astra_sglang.harness.impl import Impl

    (tmp_path / "astra_fake_topk2.py").write_text(TRITON_LIKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = Impl("installed:astra_fake_topk2:fused_topk", SPEC)
    assert impl.binding is not None
    dims = (4, 128, 8)
    t = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(0), "normal", device="cpu")
    t["topk_ids"].fill_(-1)
    assert impl(t, dims, "bf16", SPEC.scalars(dims)) == 0
    w, ids = triton_like(t["scores"], 8, True)
    assert torch.equal(t["topk_ids"], ids) and torch.equal(t["topk_weights"], w)
    before = t["topk_ids"].clone()
    impl.binding(t)  # the copies alone: same tensors, same sizes (values: a scratch copy of the first call's)
    assert torch.equal(t["topk_ids"], before)
    sys.modules.pop("astra_fake_topk2", None)


# --------------------------------------------------------------------------- adapter / layer / discovery
# what the stand-in fused_topk returns: SGLang's (weights, ids) shapes and dtypes
FUSED_TOPK_RETURNS = ("return (torch.full((gating_output.shape[0], topk), 0.5), "
                      "torch.zeros((gating_output.shape[0], topk), dtype=torch.int32))")
def test_adapter_binds_fused_topk_as_select_experts_calls_it(sglang_pkg):
    from astra_sglang.patch.adapters import Binder, adapter_mismatch

    ad = op_part("moe_router", "adapter")
    assert not ad.DEFAULT_OFF   # measured on the H200 (2026-11-24): on in `--ops all`
    A = ad.ADAPTER
    assert adapter_mismatch(SPEC, A) is None
    fn = real_function(sglang_pkg, "sglang.srt.layers.moe.topk", "fused_topk", body=FUSED_TOPK_RETURNS)
    b = Binder(fn, A, SPEC)
    assert b.ok, b.problem
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    # select_experts: fused_topk(hidden_states=, gating_output=, topk=, renormalize=, correction_bias=,
    #                            scoring_func=, num_fused_shared_experts=, routed_scaling_factor=, apply_...=)
    kw = dict(hidden_states=x, gating_output=x, topk=8, renormalize=True, correction_bias=None, scoring_func="softmax",
              num_fused_shared_experts=0, routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False)
    canon, vals = b.bind((), kw)
    assert canon is not None, vals
    assert canon["scores"] is x and canon["topk"] == 8 and canon["renormalize"] is True
    for n, mk in A.alloc.items():
        canon[n] = mk(canon)
    views, dims = A.normalize(canon)
    assert dims == (5, 128, 8) and canon["renormalize"] == 1
    assert views["topk_weights"].dtype == torch.float32 and views["topk_ids"].dtype == torch.int32
    w, ids = A.returns(canon)
    assert w is canon["topk_weights"] and ids is canon["topk_ids"]
    # softmax ignores these in SGLang: still routed
    assert b.bind((), {**kw, "correction_bias": torch.zeros(128), "routed_scaling_factor": 2.5})[0] is not None
    # another contract: SGLang's original
    assert b.bind((), {**kw, "scoring_func": "sigmoid"})[0] is None
    assert b.bind((), {**kw, "packed_out": torch.empty(5, 8, dtype=torch.int32)})[0] is None
    # the original's returned outputs land in the canonical ones; hidden_states follows the canonical scores
    c = {**canon, "topk_weights": torch.empty(5, 8), "topk_ids": torch.full((5, 8), 7, dtype=torch.int32)}
    b.call_with(fn, vals, c)
    assert torch.all(c["topk_weights"] == 0.5) and torch.all(c["topk_ids"] == 0)
    sampled = {**c, "scores": x[:2], "topk_weights": torch.empty(2, 8), "topk_ids": torch.empty(2, 8, dtype=torch.int32)}
    b.call_with(fn, vals, sampled)  # the self-check's row sample: hidden_states must follow (fused_topk asserts it)
    norm = A.normalize
    assert "3-d" in norm({**canon, "scores": x[None]})
    assert "topk" in norm({**canon, "topk": 40})
    assert "not contiguous" in norm({**canon, "scores": torch.randn(128, 5).t()})
    assert "experts" in norm({**canon, "scores": torch.randn(5, 2048), "topk_weights": torch.empty(5, 8),
                               "topk_ids": torch.empty(5, 8, dtype=torch.int32)})


def test_adapter_defers_to_sglang_when_it_would_not_run_the_triton_router(monkeypatch):
    import sys
    import types

    A = op_part("moe_router", "adapter").ADAPTER
    x = torch.randn(2, 64)
    c = {"scores": x, "topk": 4, "renormalize": False, "topk_weights": torch.empty(2, 4),
         "topk_ids": torch.empty(2, 4, dtype=torch.int32)}
    flag = types.SimpleNamespace(on=True)
    fake = types.ModuleType("sglang.srt.layers.moe.topk")
    fake._is_cuda, fake._use_aiter = True, False
    fake.envs = types.SimpleNamespace(SGLANG_OPT_USE_JIT_KERNEL_FUSED_TOPK=types.SimpleNamespace(get=lambda: flag.on))
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.topk", fake)
    assert not isinstance(A.normalize(dict(c)), str)
    flag.on = False  # 0.5.17 with the JIT router off: sgl_kernel's topk_softmax, another kernel
    assert "topk_softmax" in A.normalize(dict(c))
    del fake.envs  # 0.5.23: no flag, always the Triton router
    assert not isinstance(A.normalize(dict(c)), str)
    fake._use_aiter = True
    assert "aiter" in A.normalize(dict(c))


def test_layer_and_adapter_import_without_sglang():
    assert callable(op_part("moe_router", "layer").run_layer)
    assert op_part("moe_router", "adapter").ADAPTER.op == "moe_router"


@pytest.mark.wheels
def test_discovery_finds_fused_topk_call_sites(wheel_sources, sglang_0_5_17_source):
    from astra_sglang.patch.discover import discover_for_specs

    for src, ver in ((sglang_0_5_17_source, "0.5.17"), (wheel_sources["sglang"], "0.5.23")):
        d = discover_for_specs([SPEC], roots={"sglang": Path(src) / "sglang"})
        sites = {(s.kind, s.module, s.target) for s in d.for_op("moe_router")}
        t = "sglang.srt.layers.moe.topk"
        assert ("definition", t, f"{t}:fused_topk") in sites, (ver, sites)
        if ver == "0.5.23":
            assert any(s[1] == "sglang.srt.layers.mova" for s in sites), sites


# --------------------------------------------------------------------------- the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_compiles_for_sm90a_and_passes_the_static_checks(tmp_path):
    from astra_sglang.build import find_nvcc
    from astra_sglang.registry import op_dir
    from astra_sglang.static_checks import errors, scan_file

    src = op_dir("moe_router") / "kernel.cu"
    assert not errors(scan_file(src, []))
    r = subprocess.run([find_nvcc(), "-std=c++20", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", "-o", str(tmp_path / "k.so"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    sym = subprocess.run(["nm", "-D", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
    assert "astra_moe_router" in sym


def _warp_emulation(row, topk):
    """The shipped kernel's selection (kernel.cu) for one row, lane by lane: lane l holds experts l, l + 32, ...;
    NaN -> -1e30, -0 -> +0; each round a lane's strict-> local best, then two max reductions over the warp on the
    order-preserving key of the value and on 0xFFFF - id among the lanes at the maximum; the winner -> -inf."""
    import math
    import struct

    e = len(row)
    v_per = 1
    while 32 * v_per < e:
        v_per *= 2

    def key(f):
        b = struct.unpack("<I", struct.pack("<f", f))[0]
        return (~b & 0xFFFFFFFF) if b & 0x80000000 else (b | 0x80000000)

    v = [[-math.inf] * v_per for _ in range(32)]
    for lane in range(32):
        for j in range(v_per):
            i = j * 32 + lane
            if i < e:
                x = row[i]
                x = -1e30 if x != x else x
                v[lane][j] = 0.0 if x == 0 else x
    ids = []
    for _ in range(topk):
        best = []
        for lane in range(32):
            bv, bi = v[lane][0], lane
            for j in range(1, v_per):
                if v[lane][j] > bv:
                    bv, bi = v[lane][j], j * 32 + lane
            best.append((key(struct.unpack("<f", struct.pack("<f", bv))[0]), bi))
        top = max(k for k, _ in best)
        bi = 0xFFFF - max((0xFFFF - i) if k == top else 0 for k, i in best)
        v[bi % 32][bi // 32] = -math.inf
        ids.append(bi)
    return ids


@pytest.mark.parametrize("e,k", [(8, 2), (32, 4), (60, 4), (128, 8), (1000, 16), (3, 5)])
def test_the_kernels_warp_selection_is_sglangs(e, k):
    g = torch.Generator().manual_seed(e * 100 + k)
    rows = [torch.randn(e, generator=g), torch.randint(-2, 3, (e,), generator=g).float(),
            torch.randn(e, generator=g).to(torch.bfloat16).float()]
    special = torch.randn(e, generator=g)
    special[::3] = 0.0
    special[1::3] = -0.0
    special[e // 2] = float("nan")
    special[-1] = float("-inf")
    rows.append(special)
    mostly_masked = torch.full((e,), float("-inf"))
    mostly_masked[e // 3] = 1.0  # fewer finite logits than topk: 0.5.17 repeats the lowest -inf id
    rows.append(mostly_masked)
    for row in rows:
        want = triton_like(row[None], k, True)[1][0].tolist()
        assert _warp_emulation([float(x) for x in row.float()], k) == want, (e, k, row[:8])


def test_reference_without_scalars_uses_the_shapes_renormalize():
    x = torch.randn(3, 60, dtype=torch.float64)
    a = SPEC.reference({"scores": x}, (3, 60, 4), {})["topk_weights"]
    b = SPEC.reference({"scores": x}, (3, 60, 4), SPEC.scalars((3, 60, 4)))["topk_weights"]
    assert torch.equal(a, b) and float(a.sum(-1).max()) < 1  # Qwen1.5-MoE: not renormalized
