"""moe_grouped_router (kernels/moe_grouped_router/): DeepSeek-V3's grouped biased sigmoid router, as SGLang 0.5.17
runs it through biased_grouped_topk_gpu (flashinfer fused_topk_deepseek; the Triton router for Kimi-K2).

Spec and reference against literal re-statements of flashinfer's packed-max selection and of the Triton router's
loops (random, tied and peaked inputs), the ties distribution's separation, the installed-variant extract against the
real 0.5.17 and 0.5.23 sources (and its refusal of a changed tie rule or shared weight), the adapter against the real
signature and
SGLang's route, the kernel's warp selection emulated lane by lane, and the shipped kernel's sm_90a build."""
from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from astra_sglang.registry import get_op, op_part
from cli_run import one_error, run_cli  # noqa: E402
from sglang_signatures import real_function  # noqa: E402

SPEC = get_op("moe_grouped_router")
SPEC_MOD = __import__("astra_sglang.kernels.moe_grouped_router.spec", fromlist=["x"])
OP = "moe_grouped_router"


def keys32(scores, bias):
    """fp32 keys as production ranks them (a correctly rounded fp32 sigmoid; production's own sigmoid may differ
    by an ulp, which the tests keep out of play)."""
    return (torch.sigmoid(scores.double()).float() + bias.float())


def flashinfer_like(scores, bias, topk, g, tg, scale=1.0):
    """deepseek_v3_topk_kernel's selection restated: (value, 65535 - index) keys reduced by max; a group scores its
    two best keys with multiplicity; top groups; top experts among them; s * scale / (sum + 1e-20)."""
    t, e = scores.shape
    epg = e // g
    k = keys32(scores, bias)
    s = torch.sigmoid(scores.double()).float()
    W = torch.zeros((t, topk), dtype=torch.float32)
    I = torch.zeros((t, topk), dtype=torch.int32)

    def best(cands):  # [(value, idx)] -> the max of (value, -idx)
        return max(cands, key=lambda p: (p[0], -p[1]))

    for r in range(t):
        row = [float(v) for v in k[r]]
        if g > 1:
            gs = []
            for gi in range(g):
                c = [(row[i], i) for i in range(gi * epg, (gi + 1) * epg)]
                b1 = best(c)
                c2 = [p for p in c if p != b1] or [(-math.inf, 0)]
                b2 = best(c2)
                gs.append(float(torch.tensor(b1[0], dtype=torch.float32) + torch.tensor(b2[0], dtype=torch.float32)))
            groups = []
            cand = [(v, i) for i, v in enumerate(gs)]
            for _ in range(tg):
                w = best(cand)
                groups.append(w[1])
                cand.remove(w)
            allowed = [i for gi in groups for i in range(gi * epg, (gi + 1) * epg)]
        else:
            allowed = list(range(e))
        cand = [(row[i], i) for i in allowed]
        for slot in range(topk):
            w = best(cand)
            I[r, slot] = w[1]
            cand.remove(w)
        sel = s[r, I[r].long()].double()
        W[r] = (sel * scale / (sel.sum() + 1e-20)).float()
    return W, I


def triton_like(scores, bias, topk, g, tg, renormalize=True, scale=1.0, apply=False):
    """_router_triton_kernel's sigmoid path restated (torch fp32): keys, NaN -> -1e30; grouped: top1, top2 of the
    values strictly below top1 (`vals >= top1` dropped), keep groups by (max, lowest id); K rounds of max /
    lowest lane / -inf; renormalize by the routed sum (1 when 0); the scale when asked."""
    t, e = scores.shape
    b = keys32(scores, bias)
    act = torch.sigmoid(scores.double()).float()
    b = torch.where(b == b, b, torch.full_like(b, -1e30))
    lanes = torch.arange(e).expand_as(b)
    if g > 1:
        epg = e // g
        gof = torch.arange(e) // epg
        gscore = torch.full((t, g), float("-inf"))
        for gi in range(g):
            vals = torch.where(gof == gi, b, torch.full_like(b, float("-inf")))
            top1 = vals.max(1, keepdim=True).values
            top2 = torch.where(vals >= top1, torch.full_like(vals, float("-inf")), vals).max(1, keepdim=True).values
            gscore[:, gi] = (top1 + top2)[:, 0]
        keep = torch.zeros((t, e), dtype=torch.bool)
        gl = torch.arange(g).expand_as(gscore)
        for _ in range(tg):
            m = gscore.max(1, keepdim=True).values
            win = torch.where(gscore == m, gl, torch.full_like(gl, g + 1)).min(1, keepdim=True).values
            keep |= gof[None, :] == win
            gscore = torch.where(gl == win, torch.full_like(gscore, float("-inf")), gscore)
        b = torch.where(keep, b, torch.full_like(b, float("-inf")))
    W = torch.zeros((t, topk))
    I = torch.zeros((t, topk), dtype=torch.int32)
    for kk in range(topk):
        m = b.max(1, keepdim=True).values
        win = torch.where(b == m, lanes, torch.full_like(lanes, e + 1)).min(1).values
        W[:, kk] = act.gather(1, win[:, None])[:, 0]
        I[:, kk] = win.to(torch.int32)
        b = b.scatter(1, win[:, None], float("-inf"))
    s = W.sum(1, keepdim=True)
    if renormalize:
        W = W / torch.where(s > 0, s, torch.ones_like(s))
    if apply:
        W = W * scale
    return W, I


# --------------------------------------------------------------------------- spec / reference
def test_corpus_from_real_configs_and_scalars():
    dims = {s.dims: s for s in SPEC.corpus}
    for name, e, k, g, tg, _, shared in SPEC_MOD.ROUTER_MODELS:
        for s in shared:
            for t in SPEC_MOD.DECODE + SPEC_MOD.PREFILL:
                assert (t, e, k + s, g, tg, s) in dims, name
    assert "deepseek-r1" in dims[(1, 256, 8, 8, 4, 0)].source and "kimi-k2" in dims[(64, 384, 8, 1, 1, 0)].source
    assert "fused shared expert" in dims[(1, 256, 9, 8, 4, 1)].source   # SGLang 0.5.17's default for DeepSeek-V3
    assert SPEC.scalars((1, 256, 8, 8, 4, 0)) == {"topk": 8, "num_expert_group": 8, "topk_group": 4,
                                                  "num_fused_shared_experts": 0, "renormalize": 1,
                                                  "routed_scaling_factor": 2.5,
                                                  "apply_routed_scaling_factor_on_output": 0, "shared_weight": -1.0}
    assert SPEC.scalars((1, 256, 9, 8, 4, 1))["num_fused_shared_experts"] == 1
    assert SPEC.scalars((1, 256, 9, 8, 4, 1))["shared_weight"] == -1.0   # the corpus: 0.5.17's routed-sum column
    const = {d: SPEC.scalars(d) for d in SPEC_MOD.CONST_SHARED_EDGES}    # 0.5.23's constant column, both scalings
    assert sorted((c["apply_routed_scaling_factor_on_output"], c["shared_weight"]) for c in const.values()) == [
        (0, 1 / 2.5), (1, 1.0)]
    assert SPEC.scalars((1, 384, 8, 1, 1, 0))["routed_scaling_factor"] == 2.827
    assert SPEC.scalars(SPEC_MOD.SCALED_EDGES[0])["apply_routed_scaling_factor_on_output"] == 1
    assert SPEC.bytes_moved((2, 256, 8, 8, 4, 0), "fp32") == 2 * (1024 + 64) + 1024
    for s in list(SPEC.corpus) + list(SPEC.edge_shapes):
        t, e, k, g, tg, sh = s.dims
        assert e <= SPEC_MOD.MAX_EXPERTS and g <= SPEC_MOD.MAX_GROUPS and e % g == 0 and 1 <= tg <= g
        assert g == 1 or e // g <= SPEC_MOD.MAX_GROUP_EXPERTS
        assert k <= SPEC_MOD.MAX_TOPK and 1 <= k - sh <= tg * (e // g), s


SMALL = [(16, 256, 8, 8, 4, 0), (12, 384, 8, 1, 1, 0), (9, 64, 6, 8, 3, 0), (7, 16, 4, 8, 2, 0), (5, 32, 1, 4, 1, 0),
         (7, 256, 8, 8, 4, 0), (4, 8, 8, 1, 1, 0)]


@pytest.mark.parametrize("dims", SMALL)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_reference_is_flashinfers_selection(dims, dtype):
    sc = SPEC.scalars(dims)
    scale = sc["routed_scaling_factor"] if sc["apply_routed_scaling_factor_on_output"] else 1.0
    for seed, dist in enumerate(SPEC.distributions):
        inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(seed), dist, device="cpu")
        ref = SPEC.reference({"scores": inp["scores"].double(), "bias": inp["bias"].double()}, dims, sc)
        w, ids = flashinfer_like(inp["scores"], inp["bias"], dims[2], dims[3], dims[4], scale)
        got = SPEC.canonical({"topk_weights": w, "topk_ids": ids}, dims)
        assert torch.equal(got["topk_ids"].double(), ref["topk_ids"]), (dims, dtype, dist)
        assert torch.allclose(w.double(), ref["topk_weights"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dims", [(12, 384, 8, 1, 1, 0), (5, 160, 8, 1, 1, 0), (16, 256, 8, 8, 4, 0), (9, 64, 6, 8, 3, 0)])
def test_reference_is_the_triton_routers_where_no_group_maximum_ties(dims):
    """Kimi-K2's path (one group) always; grouped rows agree wherever no group's maximum is tied."""
    for seed, dist in enumerate(("normal", "peaked", "ties")):
        inp = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(10 + seed), dist, device="cpu")
        sc = SPEC.scalars(dims)
        ref = SPEC.reference({"scores": inp["scores"].double(), "bias": inp["bias"].double()}, dims, sc)
        w, ids = triton_like(inp["scores"], inp["bias"], dims[2], dims[3], dims[4])
        got = SPEC.canonical({"topk_ids": ids}, dims)["topk_ids"].double()
        k = keys32(inp["scores"], inp["bias"]).view(dims[0], dims[3], -1)
        tied = (k == k.max(-1, keepdim=True).values).sum(-1).max(-1).values > 1 if dims[3] > 1 else \
            torch.zeros(dims[0], dtype=torch.bool)
        same = ~tied
        assert torch.equal(got[same], ref["topk_ids"][same]), (dims, dist)
        assert torch.allclose(w.double()[same], ref["topk_weights"][same], rtol=1e-5, atol=1e-7)


def test_a_tied_group_maximum_counts_twice_as_in_flashinfer():
    # 4 groups of 4, keep 1, top 2: group 0 = {0.9, 0.9, 0, 0} (sum 1.8), group 1 = {0.95, 0.8, 0, 0} (sum 1.75)
    s = torch.full((1, 16), -30.0, dtype=torch.float64)
    bias = torch.zeros(16)
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    s[0, 0] = s[0, 1] = logit(0.9)
    s[0, 4], s[0, 5] = logit(0.95), logit(0.8)
    w, ids = SPEC_MOD.route(s, bias, 2, 4, 1)
    assert ids.tolist() == [[0, 1]]
    assert flashinfer_like(s.float(), bias, 2, 4, 1)[1].tolist() == [[0, 1]]
    assert triton_like(s.float(), bias, 2, 4, 1)[1].tolist() == [[4, 5]]  # Triton drops the tied 0.9: the adapter defers
    assert torch.allclose(w, torch.tensor([[0.5, 0.5]], dtype=torch.float64))


def test_ties_go_to_the_lowest_group_and_expert():
    s = torch.zeros((1, 16), dtype=torch.float64)  # every key 0.5: groups 0, 1 kept, experts 0..3 in order
    w, ids = SPEC_MOD.route(s, torch.zeros(16), 4, 4, 2)
    assert ids.tolist() == [[0, 1, 2, 3]]
    bias = torch.zeros(16)
    bias[[9, 13]] = 0.25  # groups 2 and 3 win; in them experts 9, 13 then 8, 10, ...
    w, ids = SPEC_MOD.route(s, bias, 4, 4, 2)
    assert ids.tolist() == [[9, 13, 8, 10]]
    assert torch.allclose(w, torch.full((1, 4), 0.25, dtype=torch.float64))  # the weights are unbiased


def test_ties_distribution_keeps_distinct_keys_and_group_sums_apart():
    """Exact ties in the `ties` distribution are equal (logit, bias) pairs; anything not exactly equal stays far
    apart, so no implementation's last-ulp sigmoid can reorder it."""
    sig = [float(torch.sigmoid(torch.tensor(x, dtype=torch.float64))) for x in range(4)]
    vals = sorted({s + c / 8.0 for s in sig for c in range(3)})
    assert min(b - a for a, b in zip(vals, vals[1:])) > 1e-3
    # group sums: both keys carry the group's one bias c
    sums = sorted({sig[i] + sig[j] + c / 4.0 for i in range(4) for j in range(i, 4) for c in range(3)})
    assert min(b - a for a, b in zip(sums, sums[1:])) > 1e-4
    dims = (4, 256, 8, 8, 4, 0)
    b = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(0), "ties", device="cpu")["bias"]
    assert bool((b.view(8, 32) == b.view(8, 32)[:, :1]).all())


def test_one_hot_canonical_makes_every_differing_id_fail():
    from astra_sglang.harness.numerics import rel_err, tolerance

    dims = (64, 256, 8, 8, 4, 0)
    inp = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(3), "normal", device="cpu")
    ref = SPEC.reference({"scores": inp["scores"].double(), "bias": inp["bias"].double()}, dims, SPEC.scalars(dims))
    _, ids = flashinfer_like(inp["scores"], inp["bias"], 8, 8, 4)
    assert rel_err(SPEC.canonical({"topk_ids": ids.clone()}, dims)["topk_ids"], ref["topk_ids"])["err"] == 0.0
    bad = ids.clone()
    bad[17, 3] = (int(bad[17, 3]) + 1) % 256
    e = rel_err(SPEC.canonical({"topk_ids": bad}, dims)["topk_ids"], ref["topk_ids"])["err"]
    assert e > 1000 * tolerance(SPEC, "fp32", 0.0)


def test_reference_without_scalars_uses_the_shapes_own():
    dims = SPEC_MOD.SCALED_EDGES[0]
    inp = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(0), "normal", device="cpu")
    t = {"scores": inp["scores"].double(), "bias": inp["bias"].double()}
    a = SPEC.reference(t, dims, {})["topk_weights"]
    assert torch.allclose(a.sum(-1), torch.full((dims[0],), 2.5, dtype=torch.float64))


# --------------------------------------------------------------------------- installed variant: extract
@pytest.mark.wheels
def test_extract_installed_writes_a_manifest_from_0_5_17(tmp_path, capsys, sglang_0_5_17_source):
    code, out, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                               "--sglang-src", str(sglang_0_5_17_source)], capsys)
    assert code == 0, err
    ws = tmp_path / "ws" / OP
    m = json.loads((ws / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == "sglang.srt.layers.moe.topk:biased_grouped_topk_gpu"
    assert m["launch_facts"] == {"FI_LAST": "True"}
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == "0.5.17"
    assert not (ws / "baseline.cu").exists() and (ws / "candidates").is_dir()


@pytest.mark.wheels
def test_extract_checks_every_fact_in_0_5_23(tmp_path, capsys, wheel_sources):
    """0.5.23 computes the contract for calls without a shared column (its shared weight is a constant the adapter
    leaves to SGLang); before, extract refused it on the flashinfer condition's new renormalize / 1-D bias terms."""
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(wheel_sources["sglang"])], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / OP / "manifest.json").read_text())
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == "0.5.23"


@pytest.mark.wheels
def test_extract_refuses_a_third_shared_weight_form(tmp_path, capsys, wheel_sources):
    """The shared-column fact accepts 0.5.17's routed sum / rsf and 0.5.23's fused_shared_expert_weight, nothing else:
    the adapter's hand-back on 0.5.23 keys on that function."""
    src = tmp_path / "sglang-copy"
    for rel in {f for f, _, _ in SPEC.variant("installed").source_facts}:  # the files the facts read
        (src / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(wheel_sources["sglang"]) / "sglang" / rel, src / "sglang" / rel)
    topk = src / "sglang" / "srt/layers/moe/topk.py"
    text = topk.read_text()
    assert text.count("value=fused_shared_expert_weight(") >= 1
    topk.write_text(text.replace("value=fused_shared_expert_weight(", "value=0.5 * fused_shared_expert_weight("))
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(src)], capsys)
    assert code == 2
    one_error(err, "topk.py", "shared columns")
    assert not (tmp_path / "ws" / OP).exists()


@pytest.mark.wheels
def test_extract_fails_on_a_changed_group_tie_rule(tmp_path, capsys, sglang_0_5_17_source):
    src = tmp_path / "sglang-copy"
    pkg = src / "sglang"
    for rel in {f for f, _, _ in SPEC.variant("installed").source_facts}:  # the files the facts read
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(sglang_0_5_17_source) / "sglang" / rel, pkg / rel)
    gate = pkg / "kernels/ops/moe/moe_fused_gate.py"
    gate.write_text(gate.read_text().replace("win_g = tl.min(glane, axis=1)", "win_g = tl.max(glane, axis=1)"))
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                             "--sglang-src", str(src)], capsys)
    assert code == 2
    one_error(err, "moe_fused_gate.py", "lowest group id")
    assert not (tmp_path / "ws" / OP).exists()


@pytest.mark.wheels
def test_flashinfer_kernel_facts_hold_in_the_unpacked_flashinfer(wheel_sources):
    """The tie rules spec.py cites from flashinfer's csrc (0.7.2 here; 0.5.17 pins 0.6.15.post1: re-check on the GPU
    machine's wheel)."""
    root = Path(wheel_sources["flashinfer"])
    ker = next(root.rglob("noAuxTcKernels.cu")).read_text()
    funcs = next(root.rglob("moeTopKFuncs.cuh")).read_text()
    assert "auto groupScore = topExpGroupScores[0] + topExpGroupScores[1];" in ker
    assert "0.5f * tanhf(0.5f * x) + 0.5f" in ker
    assert "scoreNorm * routedScalingFactor / (redNorm + 1e-20)" in ker
    assert "(0xFFFF & (kMaxIdx - idx))" in funcs  # equal values: the lower index wins


# --------------------------------------------------------------------------- adapter / layer
RETURNS = ("return (torch.full((gating_output.shape[0], topk), 0.5), "
           "torch.zeros((gating_output.shape[0], topk), dtype=torch.int32))")


@pytest.mark.wheels
def test_adapter_binds_biased_grouped_topk_as_select_experts_calls_it(sglang_0_5_17_source):
    from astra_sglang.patch.adapters import Binder, adapter_mismatch

    ad = op_part(OP, "adapter")
    assert not getattr(ad, "DEFAULT_OFF", "")   # on in `--ops all` since a DeepSeek-shaped server gained (2026-11-27)
    # with and without the shared column, astra's (the warp router's GPU check and validate: 2026-11-30)
    assert not ad.ADAPTER.kept_by_sglang((1, 256, 8, 8, 4, 0)) and not ad.ADAPTER.kept_by_sglang((1, 256, 9, 8, 4, 1))
    A = ad.ADAPTER
    assert adapter_mismatch(SPEC, A) is None
    fn = real_function(Path(sglang_0_5_17_source), "sglang.srt.layers.moe.topk", "biased_grouped_topk_gpu",
                       body=RETURNS)
    b = Binder(fn, A, SPEC)
    assert b.ok, b.problem
    x = torch.randn(5, 256)
    bias = torch.randn(256)
    kw = dict(hidden_states=x, gating_output=x, correction_bias=bias, topk=8, renormalize=True, num_expert_group=8,
              topk_group=4, num_fused_shared_experts=0, routed_scaling_factor=2.5,
              apply_routed_scaling_factor_on_output=False)
    canon, vals = b.bind((), kw)
    assert canon is not None, vals
    assert canon["scores"] is x and canon["bias"] is bias
    for n, mk in A.alloc.items():
        canon[n] = mk(canon)
    views, dims = A.normalize(canon)
    assert dims == (5, 256, 8, 8, 4, 0)
    assert canon["routed_scaling_factor"] == 2.5 and canon["apply_routed_scaling_factor_on_output"] == 0
    assert views["topk_ids"].dtype == torch.int32 and views["topk_weights"].dtype == torch.float32
    shared, svals = b.bind((), {**kw, "topk": 9, "num_fused_shared_experts": 1})  # SGLang 0.5.17's DeepSeek-V3 default
    assert shared is not None, svals
    for n, mk in A.alloc.items():
        shared[n] = mk(shared)
    assert A.normalize(shared)[1] == (5, 256, 9, 8, 4, 1) and shared["topk_weights"].shape == (5, 9)
    norm = A.normalize
    assert "renormalize" in norm({**canon, "renormalize": False})
    assert "float32" in norm({**canon, "bias": bias.half()})
    assert "topk_group" in norm({**canon, "topk_group": 9})
    assert "topk" in norm({**canon, "topk": 40})
    assert "not contiguous" in norm({**canon, "scores": torch.randn(256, 5).t()})
    c = {**canon, "topk_weights": torch.empty(5, 8), "topk_ids": torch.full((5, 8), 7, dtype=torch.int32)}
    b.call_with(fn, vals, c)
    assert torch.all(c["topk_weights"] == 0.5) and torch.all(c["topk_ids"] == 0)


def test_adapter_defers_where_sglang_runs_the_triton_grouped_router(monkeypatch):
    import sys
    import types

    ad = op_part(OP, "adapter")
    A = ad.ADAPTER
    x = torch.randn(2, 256)
    c = {"scores": x, "bias": torch.zeros(256), "topk": 8, "num_expert_group": 8, "topk_group": 4,
         "renormalize": True, "routed_scaling_factor": None, "apply_routed_scaling_factor_on_output": False,
         "topk_weights": torch.empty(2, 8), "topk_ids": torch.empty(2, 8, dtype=torch.int32)}
    flag = types.SimpleNamespace(on=False)
    fake = types.ModuleType("sglang.srt.layers.moe.topk")
    fake._is_cuda, fake._use_aiter, fake.fused_topk_deepseek = True, False, object()
    fake.envs = types.SimpleNamespace(SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK=types.SimpleNamespace(get=lambda: flag.on))
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.topk", fake)
    ok = A.normalize(dict(c))
    assert not isinstance(ok, str) and ok[1] == (2, 256, 8, 8, 4, 0)
    flag.on = True
    assert "Triton grouped" in A.normalize(dict(c))
    flag.on = False
    fake.fused_topk_deepseek = None
    assert "missing" in A.normalize(dict(c))
    kimi = {**c, "scores": torch.randn(2, 384), "bias": torch.zeros(384), "num_expert_group": 1, "topk_group": 1}
    assert not isinstance(A.normalize(kimi), str)  # one group: the Triton router computes the same
    # fused shared experts: only where flashinfer runs and SGLang pads the columns itself, with a scale to divide by
    fake.fused_topk_deepseek = object()
    sh = {**c, "topk": 9, "num_fused_shared_experts": 1, "routed_scaling_factor": 2.5,
          "topk_weights": torch.empty(2, 9), "topk_ids": torch.empty(2, 9, dtype=torch.int32)}
    ok = A.normalize(dict(sh))
    assert not isinstance(ok, str) and ok[1] == (2, 256, 9, 8, 4, 1)
    assert "routed_scaling_factor None" in A.normalize({**sh, "routed_scaling_factor": None})
    assert "its own way" in A.normalize({**kimi, **{k: sh[k] for k in ("topk", "num_fused_shared_experts",
                                                                      "routed_scaling_factor", "topk_weights",
                                                                      "topk_ids")}})
    one = {**sh, "scores": torch.randn(2, 128), "bias": torch.zeros(128), "num_expert_group": 1, "topk_group": 1}
    assert "its own way" in A.normalize(dict(one))  # flashinfer ungrouped needs topk_group * n_group >= routed
    four = {**sh, "scores": torch.randn(2, 128), "bias": torch.zeros(128), "topk": 5, "num_expert_group": 4,
            "topk_group": 2, "topk_weights": torch.empty(2, 5), "topk_ids": torch.empty(2, 5, dtype=torch.int32)}
    assert A.normalize(dict(four))[1] == (2, 128, 5, 4, 2, 1)
    assert "experts a group" in A.normalize({**c, "scores": torch.randn(2, 512), "bias": torch.zeros(512)})
    assert ad.flashinfer_takes(256, 8, 8, 4) and not ad.flashinfer_takes(384, 8, 1, 1)
    assert not ad.flashinfer_takes(512, 8, 8, 4)  # 64 experts a group
    fake._use_aiter = True
    assert "aiter" in A.normalize(dict(c))


def test_layer_and_adapter_import_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)
    assert op_part(OP, "adapter").ADAPTER.op == OP


# --------------------------------------------------------------------------- the shipped kernel
def _cta_emulation(keys, e, k, g, tg, sh):
    """kernel.cu's selection for one row of fp32 keys, thread by thread: segments of LANES lanes, each lane's rank
    in its segment, the slot table, the kept-group mask, the candidates' ranks among each other."""
    epg = e // g if g > 1 else 32
    lanes = 32 if g == 1 else 1 << max(0, (epg - 1).bit_length())
    nseg = g if g > 1 else (e + 31) // 32
    routed = k - sh

    def before(a, b):  # (key, id): the larger key, then the lower id
        return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])

    slots = {}
    for seg in range(nseg):
        lane_keys = []
        for sl in range(lanes):
            ex = seg * epg + sl
            ok = sl < epg and ex < e
            x = keys[ex] if ok else -math.inf
            x = -1e30 if x != x else x
            lane_keys.append((0.0 if x == 0 else x, ex))
        for sl, mine in enumerate(lane_keys):
            rank = sum(before(o, mine) for o in lane_keys)
            slots[(seg, rank)] = mine if mine[0] != -math.inf else (-math.inf, 0x7FFFFFFF)
    kept = list(range(nseg))
    if g > 1:
        gs = [_f32(slots[(x, 0)][0] + (slots[(x, 1)][0] if epg >= 2 else -math.inf)) for x in range(g)]
        kept = [x for x in range(g) if sum(before((gs[j], j), (gs[x], x)) for j in range(g)) < tg]
    kc = min(routed, lanes)
    cands = [slots[(x, r)] for x in kept for r in range(kc)]
    sel = {}
    for c in cands:
        if c[0] != -math.inf:
            r = sum(before(o, c) for o in cands)
            if r < routed:
                sel[r] = c[1]
    assert sorted(sel) == list(range(routed))
    return [sel[r] for r in range(routed)] + [e] * sh


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.mark.parametrize("dims", [(3, 256, 8, 8, 4, 0), (3, 256, 9, 8, 4, 1), (2, 384, 8, 1, 1, 0),
                                  (2, 64, 6, 8, 3, 0), (2, 64, 8, 8, 3, 2), (2, 16, 4, 8, 2, 0),
                                  (2, 1024, 32, 32, 8, 0), (2, 96, 5, 3, 2, 0), (2, 160, 8, 1, 1, 0),
                                  (2, 3, 3, 1, 1, 0), (2, 8, 2, 8, 2, 0)])
def test_the_kernels_cta_selection_is_the_reference(dims):
    for seed, dist in enumerate(SPEC.distributions):
        inp = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(seed), dist, device="cpu")
        ref_ids = SPEC_MOD.route(inp["scores"].double(), inp["bias"], dims[2] - dims[5], dims[3], dims[4])[1]
        keys = keys32(inp["scores"], inp["bias"])
        for r in range(dims[0]):
            got = _cta_emulation([float(x) for x in keys[r]], *dims[1:])
            assert got == ref_ids[r].tolist() + [dims[1]] * dims[5], (dims, dist, r)


def test_reference_appends_the_shared_columns_as_sglang_pads_them():
    dims = (4, 256, 9, 8, 4, 1)
    sc = SPEC.scalars(dims)
    inp = SPEC.make_inputs(dims, "fp32", torch.Generator().manual_seed(5), "normal", device="cpu")
    t = {"scores": inp["scores"].double(), "bias": inp["bias"].double()}
    ref = SPEC.reference(t, dims, sc)
    w8, ids8 = SPEC_MOD.route(t["scores"], t["bias"], 8, 8, 4)
    assert torch.equal(ref["topk_weights"][:, :8], w8)
    assert torch.allclose(ref["topk_weights"][:, 8], w8.sum(-1) / 2.5)  # F.pad, then sum(routed) / rsf
    got = torch.cat([ids8, torch.full((4, 1), 256)], dim=1)
    assert torch.equal(SPEC.canonical({"topk_ids": got}, dims)["topk_ids"].double(), ref["topk_ids"])
    for apply, col in ((0, 0.4000000059604645), (1, 1.0)):   # 0.5.23's constant: fp32(1 / 2.5), or 1 when scaled
        c = SPEC.reference(t, dims, {**sc, "apply_routed_scaling_factor_on_output": apply,
                                     "shared_weight": SPEC_MOD.shared_weight(2.5, apply)})
        assert (c["topk_weights"][:, 8] == col).all()
    bad = got.clone()
    bad[0, 8] = 0  # a shared column must carry id num_experts
    assert not torch.equal(SPEC.canonical({"topk_ids": bad}, dims)["topk_ids"].double(), ref["topk_ids"])


def _sglang_0_5_23_shared_weight(wheel_sources):
    """SGLang 0.5.23's own fused_shared_expert_weight, compiled from its topk.py."""
    import ast
    from typing import Optional

    src = (Path(wheel_sources["sglang"]) / "sglang" / "srt/layers/moe/topk.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.FunctionDef) and n.name == "fused_shared_expert_weight")
    ns = {"Optional": Optional}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "topk.py", "exec"), ns)
    return ns["fused_shared_expert_weight"]


@pytest.mark.wheels
def test_shared_weight_is_sglangs_own_constant_on_0_5_23(monkeypatch, tmp_path, wheel_sources):
    """0.5.23 pads the shared column with fused_shared_expert_weight (1, or 1 / rsf), which the routed sum / rsf
    misses by an ulp in some rows: the adapter hands SGLang's own value to the kernel (the ABI's shared_weight), and
    -1 (the sum form) where SGLang has no such function (0.5.17) or the call no shared column."""
    import sys
    import types

    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState

    fake = types.ModuleType("sglang.srt.layers.moe.topk")
    fake._is_cuda, fake._use_aiter, fake.fused_topk_deepseek = True, False, object()
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.topk", fake)

    class Backend:
        devices, dtypes = ("cpu",), ("fp32", "bf16", "fp16")

    st = OpState(SPEC, op_part(OP, "adapter").ADAPTER, Backend(), CounterFile(tmp_path / "c", [OP]))

    def shared_weight(dims, apply):
        t, e, k = dims[:3]
        c = {"scores": torch.randn(t, e), "bias": torch.zeros(e), "topk_weights": torch.empty(t, k),
             "topk_ids": torch.empty(t, k, dtype=torch.int32), **SPEC.scalars(dims),
             "apply_routed_scaling_factor_on_output": apply}
        del c["shared_weight"]   # not SGLang's argument: the adapter derives it
        ok = st.prepare(c)
        assert not isinstance(ok, str), ok
        return ok[0]["shared_weight"]

    shared, routed = (8, 256, 9, 8, 4, 1), (8, 256, 8, 8, 4, 0)
    assert shared_weight(shared, 0) == -1.0 and shared_weight(routed, 0) == -1.0   # 0.5.17: the routed sum / rsf
    fake.fused_shared_expert_weight = _sglang_0_5_23_shared_weight(wheel_sources)
    assert shared_weight(shared, 0) == 1 / 2.5 and shared_weight(shared, 1) == 1.0
    assert shared_weight(routed, 0) == -1.0                                            # no shared column
    assert SPEC_MOD.shared_weight(2.5, 0) == fake.fused_shared_expert_weight(routed_scaling_factor=2.5,
                                                                              fused_in_topk=False)


@pytest.mark.nvcc
def test_shipped_kernel_compiles_for_sm90a_and_passes_the_static_checks(tmp_path):
    from astra_sglang.build import find_nvcc
    from astra_sglang.registry import op_dir
    from astra_sglang.static_checks import errors, scan_file

    src = op_dir(OP) / "kernel.cu"
    assert not errors(scan_file(src, []))
    text = src.read_text()
    assert SPEC.c_signature().split("(")[0] in text
    r = subprocess.run([find_nvcc(), "-std=c++20", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", "-o", str(tmp_path / "k.so"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    sym = subprocess.run(["nm", "-D", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
    assert "astra_moe_grouped_router" in sym


def test_no_shared_column_is_a_zero_dim_not_an_empty_call(tmp_path):
    """n_shared = 0 is a real call (EP, DeepEP, Kimi-K2): the patch's prepare had declined every such call as an
    "empty tensor" (`0 in dims`; validate's 30 fallbacks on the H200, 2026-11-27), and the optimize loop's shape
    checks refused the corpus. Now only size dims count as empty; these calls reach the adapter's own rule."""
    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState

    assert SPEC.dims_problem((8, 256, 8, 8, 4, 0)) is None and SPEC.dims_problem((8, 256, 9, 8, 4, 1)) is None
    assert "n_shared" in SPEC.dims_problem((8, 256, 8, 8, 4, -1))
    assert "num_tokens" in SPEC.dims_problem((0, 256, 8, 8, 4, 0))
    assert SPEC.dims_problem((8, 256, 8, 8, 4)) is not None
    assert "positive" in get_op("linear").dims_problem((4, 0, 8))

    class Backend:
        devices, dtypes = ("cpu",), ("fp32", "bf16", "fp16")

    st = OpState(SPEC, op_part(OP, "adapter").ADAPTER, Backend(), CounterFile(tmp_path / "c", [OP]))
    def canon(dims):
        t, e, k = dims[:3]
        return {"scores": torch.randn(t, e), "bias": torch.zeros(e), "topk_weights": torch.empty(t, k),
                "topk_ids": torch.empty(t, k, dtype=torch.int32), **SPEC.scalars(dims)}

    assert "empty tensor" in st.prepare(canon((0, 256, 9, 8, 4, 1)))
    for dims in ((8, 256, 9, 8, 4, 1), (8, 256, 8, 8, 4, 0)):   # with and without the shared column: astra's
        ok = st.prepare(canon(dims))
        assert not isinstance(ok, str) and ok[1] == dims, ok


def test_kept_by_sglang_is_where_sglang_routes_past_flashinfer(monkeypatch):
    """The rows SGLang keeps by design are those it routes past flashinfer's kernel, told from the dims alone (bench
    marks them; validate reports them n/a, not failed: 6 such DeepSeek-scale 1024-expert rows failed validate on the
    H200 on 2026-11-30 while the adapter, rightly, handed them back). Calls without a shared column are astra's."""
    import sys
    import types

    A = op_part(OP, "adapter").ADAPTER
    monkeypatch.delitem(sys.modules, "sglang.srt.layers.moe.topk", raising=False)
    assert A.kept_by_sglang((2, 1024, 8, 32, 32, 0)) is None   # SGLang not loaded: nothing to defer to
    fake = types.ModuleType("sglang.srt.layers.moe.topk")
    fake._is_cuda, fake._use_aiter, fake.fused_topk_deepseek = True, False, object()
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.topk", fake)
    assert A.kept_by_sglang((8, 256, 8, 8, 4, 0)) is None      # DeepSeek-V3 without the shared column
    assert A.kept_by_sglang((8, 256, 9, 8, 4, 1)) is None      # with it
    assert A.kept_by_sglang((8, 384, 8, 1, 1, 0)) is None      # Kimi-K2: one group
    assert "outside flashinfer's limits" in A.kept_by_sglang((2, 1024, 8, 32, 32, 0))
    fake.fused_shared_expert_weight = lambda **kw: 1.0        # SGLang 0.5.23: the shared column stays astra's
    assert A.kept_by_sglang((8, 256, 9, 8, 4, 1)) is None       # (its constant weight: the ABI's shared_weight)
    fake._is_cuda = False
    assert "not CUDA" in A.kept_by_sglang((8, 256, 8, 8, 4, 0))


def test_only_one_group_calls_between_decode_and_prefill_stay_sglangs():
    """Every decode row (<= 256 tokens) and every prefill row (1k-16k) is astra's; one-group calls (Kimi-K2) of
    257-1023 tokens stay SGLang's (at 512 tokens both kernels lost there, H200, 2026-12-01); grouped ones do not."""
    ad = op_part(OP, "adapter")
    A = ad.ADAPTER
    assert A.max_tokens is None
    for dims in ((256, 384, 8, 1, 1, 0), (1024, 384, 8, 1, 1, 0), (16384, 384, 8, 1, 1, 0), (512, 256, 8, 8, 4, 0),
                 (16384, 256, 9, 8, 4, 1)):
        assert A.kept_by_sglang(dims) is None, dims
    for dims in ((257, 384, 8, 1, 1, 0), (512, 384, 8, 1, 1, 0), (1023, 384, 8, 1, 1, 0)):
        assert "one group" in A.kept_by_sglang(dims), dims
    from astra_sglang.harness.cases import select_shapes

    assert max(s.dims[0] for s in select_shapes(SPEC, "decode")) == ad.DECODE_TOKENS  # the decode corpus's reach
    assert min(s.dims[0] for s in select_shapes(SPEC, "prefill")) >= ad.WARP_TOKENS   # prefill is the warp kernel's
    assert f"#define ASTRA_ROUTER_WARP_TOKENS {ad.WARP_TOKENS} " in _kernel_src()      # the two thresholds agree


def _route_with_sigmoid_error(scores, bias, dims, rel: float, seed: int):
    """ids of route() where each sigmoid is off by up to `rel` (flashinfer's fast-math 0.5 tanhf(x/2) + 0.5 is off
    by ~3e-6): what another correct-looking implementation would pick."""
    s = torch.sigmoid(scores.to(torch.float64))
    g = torch.Generator().manual_seed(seed)
    sp = (s * (1 + rel * (2 * torch.rand(s.shape, generator=g, dtype=torch.float64) - 1))).to(torch.float32)
    keys = sp + bias.to(torch.float32)
    _, keys = SPEC_MOD._kept_groups(keys, int(dims[3]), int(dims[4]))
    return torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :int(dims[2]) - int(dims[5])]


@pytest.mark.parametrize("dist", ["normal", "peaked"])
def test_random_inputs_have_no_near_ties_a_sigmoids_rounding_could_reorder(dist):
    """bench's re-check marked every DeepSeek-V3 row FAILED, by production (H200, 2026-11-27): flashinfer's
    fast-math sigmoid reorders keys nearer than its ~3e-6 error about once in 2,000 rows, and 16,384 rows are
    judged. Random inputs now redraw such rows; the routes then agree under any such error, and the raw draws
    show why: every row that does reorder is one near_tie_rows flags."""
    dims = (4096, 256, 9, 8, 4, 1)
    gen = torch.Generator().manual_seed(7)
    inp = SPEC_MOD.make_inputs(dims, "bf16", gen, dist, device="cpu")
    x, b = inp["scores"], inp["bias"]
    assert not SPEC_MOD.near_tie_rows(x, b, dims).any()
    _, ref = SPEC_MOD.route(x.to(torch.float64), b, 8, 8, 4)
    for seed in range(4):
        assert torch.equal(_route_with_sigmoid_error(x, b, dims, 3e-6, seed), ref)
    # the raw draws (no redraw): the reordered rows are all flagged, and few rows are
    raw = SPEC_MOD._logits((4096, 256), torch.Generator().manual_seed(3), "cpu", dist).to(torch.bfloat16)
    flagged = SPEC_MOD.near_tie_rows(raw, b, dims)
    _, rref = SPEC_MOD.route(raw.to(torch.float64), b, 8, 8, 4)
    moved = torch.zeros(4096, dtype=torch.bool)
    for seed in range(4):
        moved |= (_route_with_sigmoid_error(raw, b, dims, 3e-6, seed) != rref).any(-1)
    assert not (moved & ~flagged).any() and flagged.float().mean() < 0.1


# --------------------------------------------------------------------------- the warp variant (ASTRA_ROUTER_WARP)
# kernel.cu's select_slots / finish emulated lane by lane in numpy (a lane axis of 32; shuffles as index arrays),
# against the reference's ids and the CTA kernel's weights bit for bit (its butterfly, in fp32).
import re  # noqa: E402

import numpy as np  # noqa: E402

_F32 = np.float32
_LANES = np.arange(32)


def _kernel_src() -> str:
    from astra_sglang.registry import op_dir

    return (op_dir(OP) / "kernel.cu").read_text()


def _networks():
    """The exchanges of kernel.cu's sort4 / sort8, read from the source (the emulation runs exactly those)."""
    src = _kernel_src()

    def body(name):
        i = src.index(f"void {name}(")
        return src[i:src.index("\n}\n", i)]

    s4 = [(int(a), int(b)) for a, b in re.findall(r"cx\(x(\d), x(\d)\)", body("sort4"))]
    s8 = [(int(a), int(b)) for a, b in re.findall(r"cx\(x\[(\d)\], x\[(\d)\]\)", body("sort8"))]
    return s4, s8


def warp_pick(e, routed, groups):
    """kernel.cu's wr::pick_v: (V values a lane, GL lanes a group), or None (the CTA kernel takes the shape)."""
    if routed > 8:
        return None
    if groups > 1:
        epg = e // groups
        for v in (1, 2, 4, 8):
            if 32 * v >= e:
                if epg % v or (epg // v) & (epg // v - 1):
                    return None
                return v, epg // v
        return None
    for v in (1, 2, 4, 8, 12):
        if 32 * v >= e:
            return (v, 32) if e % v == 0 else None
    return None


def _cx(x, i, j):
    hi, lo = np.maximum(x[..., i], x[..., j]), np.minimum(x[..., i], x[..., j])
    x[..., i], x[..., j] = hi, lo


def _merge_top(a, b):
    c = np.maximum(a, b[..., ::-1])
    for s in (4, 2, 1):
        for i in range(8):
            if not i & s:
                _cx(c, i, i + s)
    return c


def _lane_list(k, v, nets):
    s4, s8 = nets
    n = k.shape[0]
    lst = np.full((n, 32, 8), -np.inf, _F32)
    lst[..., :min(v, 8)] = k[..., :min(v, 8)]
    if v == 2:
        _cx(lst, 0, 1)
    elif v == 4:
        for i, j in s4:
            _cx(lst, i, j)
    elif v >= 8:
        for i, j in s8:
            _cx(lst, i, j)
    if v == 12:
        b = np.full((n, 32, 8), -np.inf, _F32)
        b[..., :4] = k[..., 8:12]
        for i, j in s4:
            _cx(b, i, j)
        lst = _merge_top(lst, b)
    return lst


def _ordered(f):
    u = f.astype(_F32).view(np.uint32)
    return np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000))


def canon_keys(k):
    """The kernel's key rules: NaN ranks as -1e30, -0 is +0."""
    k = np.where(k == k, k, _F32(-1e30)).astype(_F32)
    return np.where(k == 0, _F32(0), k).astype(_F32)


def warp_emulation(keys, sg, dims, scale=1.0, shared_div=1.0, renormalize=True, broken=None):
    """ASTRA_ROUTER_WARP's selection and weights for rows of fp32 keys / sigmoids [N, E] (keys already canonical):
    (ids [N, topk], weights [N, topk] fp32, rows that took the exact argmax rounds). `broken` names a deliberate
    error, to show the comparison catches it."""
    e, topk, groups, tg, shared = (int(d) for d in dims[1:])
    routed = topk - shared
    v, gl = warp_pick(e, routed, groups)
    shift = gl.bit_length() - 1
    n = keys.shape[0]
    k = np.full((n, 32, v), -np.inf, _F32)
    s = np.zeros((n, 32, v), _F32)
    k[:, :e // v] = keys.reshape(n, e // v, v)
    s[:, :e // v] = sg.reshape(n, e // v, v)
    lst = _lane_list(k, v, _networks())

    def merge_xor(lst, o):
        return _merge_top(lst, lst[:, _LANES ^ o])

    o = 1
    while o < gl:
        lst = merge_xor(lst, o)
        o <<= 1
    if groups > 1:
        g = _LANES >> shift
        score = (lst[..., 0] + lst[..., 1]).astype(_F32)
        grank = np.zeros((n, 32), np.int64)
        for j in range(groups):
            sj = score[:, j << shift][:, None]
            tie = (j > g) if broken == "group ties to the higher id" else (j < g)
            grank += (sj > score) | ((sj == score) & tie)
        kept = (g < groups) & (grank < tg)
        lst = np.where(kept[..., None], lst, _F32(-np.inf))
        k = np.where(kept[..., None], k, _F32(-np.inf))
        o = gl
        while o < 32:
            lst = merge_xor(lst, o)
            o <<= 1
    assert (lst == lst[:, :1]).all(), "the merged list must be the same in every lane"
    top = lst[:, 0]  # [N, 8]
    distinct = np.ones(n, bool)
    for r in range(routed - 1):
        distinct &= top[:, r] > top[:, r + 1]
    if broken == "no exact rounds":
        distinct[:] = True
    owner = np.zeros((n, 32), np.int64)
    oj = np.zeros((n, 32), np.int64)
    rows = np.arange(n)
    f = np.nonzero(distinct)[0]
    for r in range(routed):  # a ballot per slot: the lowest lane holding list[r], then its lowest index
        hit = (k[f] == top[f, r][:, None, None]).any(-1)
        assert hit.any(-1).all()
        w = (31 - np.argmax(hit[:, ::-1], -1)) if broken == "the highest lane" else np.argmax(hit, -1)
        owner[f, r] = w
        oj[f, r] = np.argmax(k[f, w] == top[f, r][:, None], -1)
    sl = np.nonzero(~distinct)[0]
    rk = k[sl].copy()
    for r in range(routed):  # exact argmax rounds: lane best (the lowest index), the highest key, the lowest lane
        bj = np.argmax(rk, -1)
        bk = np.take_along_axis(rk, bj[..., None], -1)[..., 0]
        u = _ordered(bk)
        w = np.argmax(u == u.max(-1, keepdims=True), -1)
        wj = bj[np.arange(len(sl)), w]
        rk[np.arange(len(sl)), w, wj] = -np.inf
        owner[sl, r], oj[sl, r] = w, wj
    ids = owner[:, :routed] * v + oj[:, :routed]
    w = np.zeros((n, 32), _F32)
    w[:, :routed] = s[rows[:, None], owner[:, :routed], oj[:, :routed]]
    if broken == "the sum in slot order":
        tot = np.zeros(n, _F32)
        for i in range(8):
            tot = (tot + w[:, i]).astype(_F32)
    else:
        a = [w[:, i] for i in range(8)]
        tot = (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))).astype(_F32)
    return (ids,) + _finish(w, tot, routed, topk, e, renormalize, scale, shared_div) + (sl,)


def _finish(w, tot, routed, topk, e, renormalize, scale, shared_div):
    """kernel.cu's last steps from each lane's routed sigmoid w [N, 32] and their sum: renormalize, scale, the
    shared columns (the 32-lane butterfly), in fp32."""
    den = np.where(tot > 0, tot, _F32(1)).astype(_F32) if renormalize else np.ones_like(tot)
    fw = ((w / den[:, None]).astype(_F32) * _F32(scale)).astype(_F32)
    fsum = fw.copy()
    for o in (16, 8, 4, 2, 1):
        fsum = (fsum + fsum[:, _LANES ^ o]).astype(_F32)
    out = fw[:, :topk].copy()
    out[:, routed:] = (fsum[:, routed:topk] / _F32(shared_div)).astype(_F32)
    return (out,)


def cta_weights(ids, sg, dims, scale=1.0, shared_div=1.0, renormalize=True):
    """The CTA kernel's weights for the reference's ids: slot r's sigmoid in lane r, its 32-lane butterfly sum."""
    e, topk, _, _, shared = (int(d) for d in dims[1:])
    routed = topk - shared
    n = ids.shape[0]
    w = np.zeros((n, 32), _F32)
    w[:, :routed] = np.take_along_axis(sg, ids, -1)
    tot = w.copy()
    for o in (16, 8, 4, 2, 1):
        tot = (tot + tot[:, _LANES ^ o]).astype(_F32)
    return _finish(w, tot[:, 0], routed, topk, e, renormalize, scale, shared_div)[0]


def _ref_ids(keys, dims):
    """The reference's selection (spec._kept_groups + a stable descending sort) on canonical fp32 keys."""
    _, keys_m = SPEC_MOD._kept_groups(torch.from_numpy(keys), int(dims[3]), int(dims[4]))
    return torch.sort(keys_m, dim=-1, descending=True, stable=True).indices[:, :int(dims[2]) - int(dims[5])].numpy()


def _tie_rows(n, dims, rng):
    """Heavy ties: keys from a few values (equal group scores, equal keys across groups and inside a lane), -0 and
    +0, NaN (-1e30), whole rows of one value; sigmoids arbitrary."""
    e = int(dims[1])
    k = (rng.integers(0, 4, (n, e)) / 4).astype(_F32)
    k[n // 4: n // 2] = rng.choice(np.array([0.0, -0.0, 0.5, -0.5], _F32), (n // 2 - n // 4, e))
    k[n // 2: n // 2 + 3] = _F32(0.25)
    k[n // 2 + 3: n // 2 + 6] = _F32(-0.0)
    nan = rng.random((n, e)) < 0.02
    k[nan] = np.nan
    # the last quarter: distinct keys above, the boundary tied (the ballot path's own tie: the lowest id)
    for r in range(3 * n // 4, n):
        k[r] = (rng.random(e) * 0.4).astype(_F32)
        at = rng.permutation(e)
        top = max(1, int(dims[2]) - int(dims[5]) - 1)
        k[r, at[:top]] = (0.9 + 0.01 * np.arange(top)).astype(_F32)
        k[r, at[top:top + max(2, e // 16)]] = _F32(0.8)
    sg = rng.random((n, e)).astype(_F32)
    return k, sg


def _spec_rows(dims, dist, seed):
    inp = SPEC.make_inputs((64,) + tuple(dims[1:]), "fp32", torch.Generator().manual_seed(seed), dist, device="cpu")
    sg = torch.sigmoid(inp["scores"].double()).float()
    return keys32(inp["scores"], inp["bias"]).numpy(), sg.numpy()


WARP_SHAPES = [(0, 256, 8, 8, 4, 0), (0, 256, 9, 8, 4, 1), (0, 384, 8, 1, 1, 0), (0, 64, 6, 8, 3, 0),
               (0, 64, 8, 8, 3, 2), (0, 16, 4, 8, 2, 0), (0, 32, 1, 4, 1, 0), (0, 8, 8, 1, 1, 0),
               (0, 128, 5, 4, 2, 1), (0, 160, 8, 1, 1, 0), (0, 3, 3, 1, 1, 0), (0, 96, 5, 3, 2, 0),
               (0, 256, 8, 32, 8, 0), (0, 256, 8, 16, 4, 0), (0, 8, 2, 8, 2, 0), (0, 384, 12, 1, 1, 4)]


def _check_warp(dims, keys, sg, broken=None):
    """(rows whose ids differ from the reference's, rows whose weights differ from the CTA kernel's bit for bit,
    rows that took the exact rounds)."""
    scale, apply = (2.5, 1) if dims[5] else (1.0, 0)
    keys = canon_keys(keys)
    ids, w, slow = warp_emulation(keys, sg, dims, scale=scale if apply else 1.0, shared_div=scale, broken=broken)
    ref = _ref_ids(keys, dims)
    bad_ids = (ids != ref).any(-1)
    ref_w = cta_weights(ref, sg, dims, scale=scale if apply else 1.0, shared_div=scale)
    bad_w = (w.view(np.uint32) != ref_w.view(np.uint32)).any(-1)
    return bad_ids, bad_w, slow


def test_warp_variant_takes_the_deepseek_and_kimi_rows_and_leaves_the_rest():
    assert warp_pick(256, 8, 8) == (8, 4)    # DeepSeek-V3: a group on 4 lanes of 8 experts
    assert warp_pick(384, 8, 1) == (12, 32)  # Kimi-K2: one group, 12 experts a lane
    assert warp_pick(1024, 32, 32) is None and warp_pick(512, 8, 1) is None  # too wide: the CTA kernel
    assert warp_pick(256, 9, 8) is None      # more than 8 routed
    assert warp_pick(96, 8, 32) is None      # 3 experts a group, V = 4: no whole lanes
    assert warp_pick(257, 8, 1) is None      # experts % V
    src = _kernel_src()
    assert "#define ASTRA_ROUTER_WARP 1" in src  # on by default (timed in context, 2026-11-30)
    # ... only for calls without a fused shared column: the CTA kernel keeps the timed shared rows
    assert "if (num_fused_shared_experts == 0 || ASTRA_ROUTER_WARP_SHARED || wr::many_tokens(num_tokens)) {" in src
    assert "#define ASTRA_ROUTER_WARP_TOKENS 1024" in src  # one warp a token from 1024 tokens (timed 2026-12-01)
    assert "#define ASTRA_ROUTER_WARP_SHARED 0" in src
    m = re.search(r"static const int kGrouped\[\] = \{([^}]*)\}, kOne\[\] = \{([^}]*)\};", src)
    assert m and m.group(1) == "1, 2, 4, 8" and m.group(2) == "1, 2, 4, 8, 12"  # what warp_pick mirrors


def test_warp_sort_networks_sort_every_0_1_input():
    s4, s8 = _networks()
    assert len(s4) == 5 and len(s8) == 19
    for size, net in ((4, s4), (8, s8)):
        x = ((np.arange(1 << size)[:, None] >> np.arange(size)) & 1).astype(_F32)
        for i, j in net:
            _cx(x, i, j)
        assert (np.diff(x, axis=-1) <= 0).all()  # 0-1 principle: a network sorting these sorts everything


@pytest.mark.parametrize("dims", WARP_SHAPES, ids=lambda d: "x".join(map(str, d[1:])))
def test_warp_variant_selection_and_weights_are_the_cta_kernels(dims):
    """Every row: ids equal the reference's (ties: the larger key, then the lowest id; groups: the larger score,
    then the lowest group), weights equal the CTA kernel's bit for bit (its renormalizing butterfly's order)."""
    rng = np.random.default_rng(int(dims[1]) * 31 + int(dims[2]))
    sets = [_spec_rows(dims, dist, seed) for seed, dist in enumerate(SPEC.distributions)]
    sets.append(_tie_rows(192, dims, rng))
    slow_rows = 0
    for keys, sg in sets:
        bad_ids, bad_w, slow = _check_warp(dims, keys, sg)
        assert not bad_ids.any() and not bad_w.any(), (dims, np.nonzero(bad_ids | bad_w)[0][:5])
        slow_rows += len(slow)
    if int(dims[2]) - int(dims[5]) > 1:
        assert slow_rows > 0  # the tie rows reach the exact rounds too


def test_warp_emulation_catches_a_broken_tie_rule():
    dims = (0, 256, 8, 8, 4, 0)
    rng = np.random.default_rng(3)
    keys, sg = _tie_rows(192, dims, rng)
    for broken in ("the highest lane", "group ties to the higher id", "no exact rounds"):
        bad_ids, _, _ = _check_warp(dims, keys, sg, broken=broken)
        assert bad_ids.any(), broken
    keys, sg = _spec_rows(dims, "normal", 0)
    _, bad_w, _ = _check_warp(dims, keys, sg, broken="the sum in slot order")
    assert bad_w.any()


@pytest.mark.nvcc
@pytest.mark.parametrize("flag, cta_warp, warp", [("-DASTRA_ROUTER_WARP_TOKENS=0", 15, 0),
                                                  ("-DASTRA_ROUTER_WARP=2", 0, 15), ("-DASTRA_ROUTER_WARP=1", 15, 15)])
def test_warp_variant_compiles_for_sm90a_without_spills(tmp_path, flag, cta_warp, warp):
    """The default build (=1, ASTRA_ROUTER_WARP_TOKENS 1024) holds both kernels; ASTRA_ROUTER_WARP_TOKENS=0 the =1
    kernel alone; =2 the =2 kernel alone (3 dtypes x V = 1, 2, 4, 8, 12 each)."""
    from astra_sglang.build import find_nvcc
    from astra_sglang.registry import op_dir

    r = subprocess.run([find_nvcc(), "-std=c++20", "-O3", "--expt-relaxed-constexpr", "-gencode",
                        "arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                        flag, "-o", str(tmp_path / "k.so"), str(op_dir(OP) / "kernel.cu")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warning" not in r.stderr.lower(), r.stderr[-2000:]
    kernels = {}
    for chunk in r.stderr.split("Compiling entry function '")[1:]:
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", chunk)
        kernels[chunk.split("'")[0]] = m.groups()
    assert len([k for k in kernels if "cta_warp_router_kernel" in k]) == cta_warp
    assert len([k for k in kernels if "warp_router_kernel" in k and "cta_warp" not in k]) == warp
    assert all(v == ("0", "0", "0") for v in kernels.values()), kernels
    sym = subprocess.run(["nm", "-D", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
    assert "astra_moe_grouped_router" in sym
