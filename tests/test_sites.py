"""Where serving runs an op (astra_sglang/sites.py) and how bench folds the pairs into one row (bench.combine_sites)."""
from __future__ import annotations

import pytest

from astra_sglang.harness.bench import combine_sites, site_times
from astra_sglang.harness.results import BenchReport, BenchRow
from astra_sglang.models import ALL_MODELS, model
from astra_sglang.registry import get_op
from astra_sglang.sites import Site, first_dense, residual_norm_sites


def test_a_dense_models_residual_norm_sits_after_o_proj_and_after_down_proj():
    """Llama-2-7B (the first dense 4096 model): o_proj 32 x 128 in, gate_up 2 x 11008 out; down_proj 11008 in,
    qkv (32 + 2 x 32) x 128 out."""
    assert residual_norm_sites(4096) == (Site("llama-2-7b o_proj -> gate_up", 4096, 22016),
                                         Site("llama-2-7b down_proj -> qkv", 11008, 12288))
    # Llama-2-70B is served at TP 2 at least: its GEMMs are sharded, the norm is not
    a, d = residual_norm_sites(8192)
    assert (a.producer_k, a.consumer_width, d.producer_k, d.consumer_width) == (4096, 28672, 14336, 5120)
    assert "(TP 2)" in a.name


def test_moe_and_unknown_widths_keep_the_generic_pair():
    """DeepSeek-V3 (7168) and Qwen3-30B-A3B (2048) run MoE MLPs: no GEMM pair around the norm; MLA's 512 is no
    model's hidden size."""
    assert model("deepseek-v3").moe and not model("deepseek-v3").dense and not model("qwen3-30b-a3b").dense
    assert model("llama-3-8b").dense and model("mixtral-8x7b").moe
    for width in (7168, 2048, 512, 1536):
        assert residual_norm_sites(width) == ()
    with pytest.raises(KeyError, match="no dense rms model of hidden size 7168"):
        first_dense(7168, "rms")
    assert all(m.dense for m in ALL_MODELS if m.hidden in (4096, 5120, 8192) and m.name.startswith("llama"))


def test_fused_add_rmsnorm_names_its_sites_and_the_plain_norm_does_not():
    spec = get_op("fused_add_rmsnorm")
    assert spec.context_sites((64, 4096)) == residual_norm_sites(4096)
    assert spec.context_sites((1, 7168)) == ()
    assert get_op("rmsnorm").context_sites is None


def _timed(base, cand, spread, floor, launch, gemms="cuBLAS / cuBLAS", failed=""):
    return {"gemms": gemms, "marg": {"production": {"median": base, "spread": spread},
                                     "candidate": {"median": cand, "spread": spread / 2}},
            "neighbours_us": 20.0, "floor": ({"median": floor, "spread": 0.1}, launch), "failed": failed,
            "floor_note": ""}


def test_the_row_is_the_mean_of_its_sites():
    """Llama-3-8B 64 x 4096 (H200, 2026-11-28): 2.84 µs behind o_proj, 1.41 behind the split-K down_proj; the row
    is their mean, its spread the larger, and each floor's launch is kept where they differ."""
    one = _timed(3.24, 2.84, 0.3, 1.04, "plain")
    assert combine_sites([one]) is one
    assert site_times(one) == {"gemms": "cuBLAS / cuBLAS", "production_us": 3.24, "candidate_us": 2.84,
                               "floor_us": 1.04, "floor_launch": "plain"}   # what the row keeps of each pair
    both = combine_sites([one, _timed(1.66, 1.41, 0.2, 0.02, "PDL", failed="site 2 mismatch")])
    assert both["marg"]["production"] == {"median": pytest.approx(2.45), "spread": 0.3}
    assert both["marg"]["candidate"]["median"] == pytest.approx(2.125)
    assert both["floor"][0]["median"] == pytest.approx(0.53) and both["floor"][1] == "plain; PDL"
    assert both["gemms"] == "cuBLAS / cuBLAS" and both["failed"] == "site 2 mismatch"
    no_floor = _timed(1.0, 1.0, 0.1, 0.1, "PDL")
    no_floor["floor"] = None
    assert combine_sites([one, no_floor])["floor"] is None   # a mean of one floor would not be the row's floor


def test_the_footer_says_which_rows_were_timed_at_their_sites(tmp_path):
    rows = [BenchRow.make("64x4096", "bf16", [3.0] * 5, [2.5] * 5, 1 << 20, 4000.0),
            BenchRow.make("64x7168", "bf16", [3.0] * 5, [2.5] * 5, 1 << 20, 4000.0)]
    for r in rows:
        r.set_context({"median": 2.4, "spread": 0.1}, {"median": 2.0, "spread": 0.1}, 20.0, "in-context")
    rows[0].context_sites = [{**s.as_dict(), "production_us": 2.4} for s in residual_norm_sites(4096)]
    rep = BenchReport(op="fused_add_rmsnorm", rows=rows, ceiling_gbps=4000.0, replays=5, context_site_rule="serving")
    foot = next(x for x in rep.table().splitlines() if x.startswith("sites: "))
    assert "1 of 2 rows" in foot and "llama-2-7b o_proj -> gate_up, llama-2-7b down_proj -> qkv" in foot
    back = BenchReport.from_json(rep.to_json(tmp_path / "r.json"))
    assert back.context_site_rule == "serving" and back.rows[0].context_sites[1]["producer_k"] == 11008
    assert back.rows[1].context_sites == []


def test_an_activation_sits_between_gate_up_and_down_proj_of_its_model():
    """silu_and_mul 14336 wide is Llama-3-8B's MLP at TP 1 (before Llama-2-70B's at TP 2): gate_up reads the 4096
    hidden, down_proj writes it. Sharded widths name their TP; a MoE expert's width (DeepSeek-V3 2048 / 8) has none."""
    from astra_sglang.sites import mlp_activation_sites

    assert mlp_activation_sites(14336, "silu") == (Site("llama-3-8b gate_up -> down_proj", 4096, 4096),)
    assert mlp_activation_sites(3696, "silu") == (Site("qwen2.5-72b (TP 8) gate_up -> down_proj", 8192, 8192),)
    assert mlp_activation_sites(14336, "gelu_tanh") == (Site("gemma-2-9b gate_up -> down_proj", 3584, 3584),)
    assert mlp_activation_sites(256, "silu") == () and mlp_activation_sites(14336, "gelu") == ()
    for op, act in (("silu_and_mul", "silu"), ("gelu_tanh_and_mul", "gelu_tanh"), ("gelu_and_mul", "gelu")):
        spec = get_op(op)
        assert spec.context_sites((64, 14336)) == mlp_activation_sites(14336, act)


def test_gemmas_post_attention_norms_sit_where_a_patched_gemma_runs_them():
    """Gemma-2-9B: o_proj 16 x 256 in, gate_up 2 x 14336 out; down_proj 14336 in, qkv (16 + 2 x 8) x 256 out (the
    op also takes the layer boundary: post_feedforward_layernorm + the next input_layernorm)."""
    spec = get_op("gemma_post_attention_norms")
    assert spec.context_sites((64, 3584)) == (Site("gemma-2-9b o_proj -> gate_up", 4096, 28672),
                                              Site("gemma-2-9b down_proj -> qkv", 14336, 8192))
    assert residual_norm_sites(3584) != residual_norm_sites(3584, "gemma")   # Qwen2.5-7B's rms norm: its own pairs


def test_the_single_gemma_norms_sit_in_a_pair_of_norms_between_two_gemms():
    """An unpatched Gemma layer: o_proj -> post_attention_layernorm (gemma_rmsnorm) -> pre_feedforward_layernorm
    (gemma_fused_add_rmsnorm) -> gate_up, and down_proj -> post_feedforward_layernorm -> the next input_layernorm ->
    qkv. gemma_rmsnorm has the other norm after it, gemma_fused_add_rmsnorm before it."""
    from astra_sglang.harness.bench import sites_need_norm
    from astra_sglang.sites import gemma_norm_pair_sites

    first, second = get_op("gemma_rmsnorm").context_sites((16, 3584)), get_op("gemma_fused_add_rmsnorm").context_sites(
        (16, 3584))
    pairs = [(x.producer_k, x.consumer_width) for x in first]
    assert pairs == [(4096, 28672), (14336, 8192)] == [(x.producer_k, x.consumer_width) for x in second]
    assert all(x.norm_after and not x.norm_before for x in first)
    assert all(x.norm_before and not x.norm_after for x in second)
    assert second[0].as_dict()["norm_before"] is True and "norm_after" not in second[0].as_dict()
    assert "gemma-3-27b" in gemma_norm_pair_sites(5376, True)[0].name and gemma_norm_pair_sites(4096, False) == ()
    assert sites_need_norm(get_op("gemma_fused_add_rmsnorm"), [(1, 2304)])
    assert not sites_need_norm(get_op("gemma_rmsnorm"), [(1024, 2304)])   # prefill keeps the one pair


def test_bench_times_only_decode_rows_at_their_sites():
    """Prefill rows are judged chained: their in-context time keeps one pair, not two (each pair is a timing)."""
    from astra_sglang.harness.bench import serving_sites

    farn = get_op("fused_add_rmsnorm")
    assert serving_sites(farn, (256, 4096)) == residual_norm_sites(4096)
    assert serving_sites(farn, (257, 4096)) == () and serving_sites(farn, (4096, 4096)) == ()
    assert serving_sites(get_op("rmsnorm"), (16, 4096)) == ()


def test_a_moe_combine_sits_after_the_experts_and_before_astras_norm():
    """Qwen3-30B-A3B: the experts' down GEMM takes 768 in; after the combine the next layer's input norm (astra's, in
    a patched server) and its qkv, (32 + 2 x 4) x 128 out. Qwen3-235B-A22B at its least TP 4. DeepSeek-V3 (MLA),
    gpt-oss (its own MoE kernels) and Mixtral (SGLang adds its two experts with torch.add) keep the generic pair."""
    from astra_sglang.harness.bench import serving_sites, sites_need_norm
    from astra_sglang.sites import moe_output_sites

    (s,) = moe_output_sites("qwen3-30b-a3b")
    assert (s.producer_k, s.consumer_width, s.norm_after) == (768, 5120, True)
    assert s.as_dict()["norm_after"] is True and "norm_after" not in residual_norm_sites(4096)[0].as_dict()
    (big,) = moe_output_sites("qwen3-235b-a22b")
    assert (big.producer_k, big.consumer_width) == (384, 2304) and "(TP 4)" in big.name
    for name in ("deepseek-v3", "gpt-oss-120b", "mixtral-8x7b", "llama-3-8b", "no-such-model"):
        assert moe_output_sites(name) == ()
    spec = get_op("moe_combine")
    assert serving_sites(spec, (8, 8, 2048)) == (s,) and serving_sites(spec, (8, 9, 7168)) == ()
    assert serving_sites(spec, (1024, 8, 2048)) == ()   # prefill keeps the one pair
    assert sites_need_norm(spec, [(1, 8, 2048)]) and not sites_need_norm(spec, [(1, 8, 7168), (1024, 8, 2048)])
    assert not sites_need_norm(get_op("fused_add_rmsnorm"), [(16, 4096)])


def test_without_the_norm_built_a_norm_site_is_said_not_timed():
    """bench builds astra's rmsnorm when a row's site needs it; a worker without it says so in the row's note
    rather than timing the site without the norm."""
    from astra_sglang.harness.bench import time_in_context

    (s,) = get_op("moe_combine").context_sites((1, 8, 2048))
    note = time_in_context(get_op("moe_combine"), None, [], [], [], (1, 8, 2048), "bf16", {}, 1.0, 1.0, 1, None,
                           sites=[s], norm=None)
    assert "astra's norm beside the op" in note


def test_the_q_k_norm_and_rope_sit_between_the_qkv_gemm_and_sglangs_next_pdl_kernel():
    """Qwen3 runs qkv -> q/k norm -> rope -> attention; Llama qkv -> rope -> KV store -> attention. The follower (a
    PDL JIT kernel that waits first) is astra's rmsnorm in bench (norm_after), the attention a GEMM to the hidden
    size. A model's least TP of those heads; rope's rows of heads only Qwen3 has get its q/k norm before rope too
    (norm_before); prefill rows keep the generic pair."""
    from astra_sglang.harness.bench import serving_sites, sites_need_norm
    from astra_sglang.sites import attention_input_sites

    qkn, rope = get_op("qknorm"), get_op("rope")
    (s,) = serving_sites(qkn, (16, 32, 8, 128, 6144, 6144))
    assert (s.producer_k, s.consumer_width, s.norm_after, s.norm_before) == (4096, 4096, True, False)
    assert s.name == "qwen3-8b qkv -> q/k norm -> rope -> attention"
    (s,) = serving_sites(qkn, (1, 8, 1, 128, 1280, 1280))
    assert s.name.startswith("qwen3-32b (TP 8)") and s.producer_k == 5120
    (s,) = serving_sites(rope, (64, 16, 2, 128, 128, 2560, 2560))
    assert s.name == "llama-3-70b (TP 4) qkv -> rope -> KV store -> attention" and s.producer_k == 8192
    (s,) = serving_sites(rope, (16, 32, 4, 128, 128, 5120, 5120))   # heads only Qwen3-32B (TP 2) has
    assert s.name == "qwen3-32b (TP 2) qkv -> q/k norm -> rope -> KV store -> attention"
    assert (s.producer_k, s.norm_before, s.norm_after) == (5120, True, True)
    assert s.as_dict()["norm_before"] is s.as_dict()["norm_after"] is True
    assert serving_sites(qkn, (1024, 32, 8, 128, 6144, 6144)) == ()
    (s,) = serving_sites(get_op("qknorm_rope"), (16, 32, 8, 128, 6144, 6144, 4096))  # fused: then the KV store
    assert s.name == "qwen3-8b qkv -> q/k norm + rope -> KV store -> attention"
    assert (s.producer_k, s.norm_after, s.norm_before) == (4096, True, False)
    assert sites_need_norm(rope, [(1, 28, 4, 128, 128, 4608, 4608)])
    assert attention_input_sites((("llama-3-8b", (1, 2)),), (7, 3, 128), "rope", "KV store") == ()
