"""CPU tests of `astra-sglang profile`: kernel attribution, trace parsing and PDL clipping, shapes,
speedup lookup, the per-op table, and the shape telemetry files (profile corpus, patch counters,
load_shapes_file)."""
from __future__ import annotations

import gzip
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from astra_sglang.e2e import attribution as at
from astra_sglang.e2e.profile import Capture, analyze_capture, analyze_dir, capture_table, shapes_corpus, write_outputs
from astra_sglang.e2e.speedups import SpeedupTable
from astra_sglang.e2e.trace import KernelEvent, exclusive_times, load_json, parse_chrome_trace
from astra_sglang.errors import AstraError
from astra_sglang.registry import get_op
from astra_sglang.spec import load_shapes_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import step_fake_worker as fake  # noqa: E402

LLAMA = json.loads((HERE.parent / "e2e" / "configs" / "llama3-8b" / "config.json").read_text())


# ----------------------------------------------------------------------------- attribution

# names as SGLang 0.5.17 shows them on the H200 (torch profiler, 2026-11-23)
@pytest.mark.parametrize("name,op,cat,covered,astra", [
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "fused_add_rmsnorm", "op", True, False),
    ("void astra_farn::(anonymous namespace)::fused_add_rmsnorm_kernel<1>(...)", "fused_add_rmsnorm", "op", True, True),
    ("void (anonymous namespace)::act_and_mul_kernel<__nv_bfloat16, true>(ActivationParams)", "silu_and_mul", "op",
     True, False),
    ("void astra_silu::(anonymous namespace)::silu_and_mul_kernel<2>(...)", "silu_and_mul", "op", True, True),
    ("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)", "rmsnorm", "op", None, False),
    ("void (anonymous namespace)::fused_qknorm_warp<128>(...)", "qknorm", "op", None, False),
    ("void (anonymous namespace)::fused_rope_store_kernel<true>(...)", "rope+kv_store", "op", None, False),
    ("void store_kvcache<128>(...)", "kv_store", "op", None, False),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "gemm", "gemm", False, False),
    ("void cublasLt::splitKreduce_kernel<32, 16>(...)", "gemm", "gemm", False, False),
    ("fused_moe_kernel", "moe_gemm", "gemm", False, False),
    ("_fwd_grouped_kernel_stage1", "attention", "attention", False, False),
    ("_router_triton_kernel", "moe_routing", "op", None, False),
    ("void moe_align_block_size_kernel<int>(...)", "moe_align", "op", None, False),
    ("triton_per_fused_copy__mul_sum_0", "moe_combine", "op", None, False),
    ("GemmaFusedAddRMSNormKernel", "gemma_fused_add_rmsnorm", "op", None, False),
    ("void at::native::vectorized_elementwise_kernel<4>(...)", "torch elementwise/copy", "op", False, False),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4, 4> >(...)", "torch mean", "op", False, False),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
     "long, 4, 4> >(...)", "sampling/logits", "other", False, False),
])
def test_classify_real_kernel_names(name, op, cat, covered, astra):
    m = at.classify(name)
    assert (m.category, m.astra) == (cat, astra)
    if covered is None:
        # ops astra is starting to cover: a registered op's kernel_symbols may claim the name first
        from astra_sglang.registry import op_names

        assert m.op == op or m.op in op_names()
    else:
        assert m.op == op and m.covered == covered


def test_unknown_kernel_is_other_with_its_short_name():
    m = at.classify("void mystery::frob_kernel<float, 3>(float*, int)")
    assert m.category == "other" and m.op == "other: mystery::frob_kernel"


def test_astra_kernels_with_underscores_in_their_namespace_are_astra_s():
    """astra_gelu_tanh:: (and astra_kv_k::, astra_rope_k::) were read as SGLang's kernels, and gelu_tanh's as
    gelu's: a Gemma profile credited neither to astra."""
    m = at.classify("void astra_gelu_tanh::(anonymous namespace)::gelu_tanh_and_mul_kernel<__nv_bfloat16, 8>(...)")
    assert (m.op, m.astra) == ("gelu_tanh_and_mul", True)
    assert at.classify("void astra_kv_k::(anonymous namespace)::kv_store_kernel<2048>(...)").astra
    assert at.classify("void astra_gelu::(anonymous namespace)::gelu_and_mul_kernel<__nv_bfloat16, 8>(...)").op == \
        "gelu_and_mul"


def test_generic_act_and_mul_follows_the_models_activation():
    assert at.classify("act_and_mul_kernel<bf16>", hidden_act="gelu_pytorch_tanh", rules=()).op == "gelu_tanh_and_mul"


def test_specs_declare_kernel_symbols():
    for op in ("silu_and_mul", "fused_add_rmsnorm", "merge_state"):
        assert get_op(op).kernel_symbols
    assert at.classify("MergeStateKernel<bf16>").op == "merge_state"


def test_a_gemma_model_s_flashinfer_norm_kernels_are_the_gemma_ops():
    """Gemma's (1 + w) norms run FlashInfer's RMSNormKernel / FusedAddRMSNormKernel with weight bias 1: the same
    names as the plain norms. In a Gemma model they are the gemma ops, so arm A's kernels line up with arm B's
    astra gemma kernels in the in-graph prediction; elsewhere they stay the plain ops."""
    rms, farn = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)", \
        "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)"
    assert (at.classify(rms).op, at.classify(farn).op) == ("rmsnorm", "fused_add_rmsnorm")
    assert (at.classify(rms, gemma=True).op, at.classify(farn, gemma=True).op) == (
        "gemma_rmsnorm", "gemma_fused_add_rmsnorm")
    astra = "void astra_farn::(anonymous namespace)::fused_add_rmsnorm_kernel<__nv_bfloat16, 8>(...)"
    assert at.classify(astra, gemma=True).op == at.classify(astra).op   # astra's own kernels say which op they are


def test_shape_hints_from_config():
    h = at.shape_hints(LLAMA, 8)
    assert h["fused_add_rmsnorm"] == "8x4096" and h["silu_and_mul"] == "8x14336"
    moe = {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
           "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}
    assert at.shape_hints(moe, 4)["silu_and_mul"] == "32x768"
    assert at.shape_hints(moe, 4)["moe_gate"] == f"4x{moe['hidden_size']}x{moe['num_experts']}"  # tokens x hidden x experts
    assert at.covered_dims("silu_and_mul", "32x768") == (32, 768)
    assert at.covered_dims("rope", "q 1x32x128, k 1x8x128") is None
    gemma = json.loads((HERE.parent / "e2e" / "configs" / "gemma2-9b" / "config.json").read_text())
    g = at.shape_hints(gemma, 1)   # the Gemma family's ops get shapes too (their bench rows are tokens x width)
    assert (g["gemma_rmsnorm"], g["gemma_fused_add_rmsnorm"], g["gelu_tanh_and_mul"]) == ("1x3584", "1x3584", "1x14336")


def test_a_gemma3_config_names_its_activation_hidden_activation_only():
    """Gemma-3's config (transformers 5, e2e/configs/gemma3-12b) has no hidden_act: the profile still reads gelu tanh,
    so SGLang's generic act_and_mul kernel is gelu_tanh_and_mul there, and the norms are the gemma ops."""
    from e2e.profile import op_classifier

    g3 = json.loads((HERE.parent / "e2e" / "configs" / "gemma3-12b" / "config.json").read_text())
    assert "hidden_act" not in g3 and g3["hidden_activation"] == "gelu_pytorch_tanh"
    match = op_classifier(g3)
    assert match("void device::act_and_mul_kernel<__nv_bfloat16>(...)").op == "gelu_tanh_and_mul"  # the functor's
    # name is not in the kernel's: the model's activation decides (it read silu before, from the absent hidden_act)
    assert match("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)").op == "gemma_rmsnorm"
    h = at.shape_hints(g3, 1)
    assert (h["gemma_rmsnorm"], h["gelu_tanh_and_mul"]) == ("1x3840", "1x15360")


def test_lookup_dims_come_from_the_ops_spec_where_no_hint_spells_them():
    """qknorm, rope and kv_store bench rows carry head counts and qkv strides (1x32x8x128x6144x6144 for
    Llama-3-8B); the profile showed them "unmeasured" until the lookup asked the op's spec."""
    assert at.lookup_dims("qknorm", "q 1x32x128, k 1x8x128", LLAMA, 1) == (1, 32, 8, 128, 6144, 6144)
    assert at.lookup_dims("rope", "", LLAMA, 8) == (8, 32, 8, 128, 128, 6144, 6144)
    assert at.lookup_dims("kv_store", "", LLAMA, 1) == (1, 1024, 1024, 6144, 6144)
    assert at.lookup_dims("qknorm", "", LLAMA, 1, tp=2) == (1, 16, 4, 128, 3072, 3072)
    assert at.lookup_dims("silu_and_mul", "8x14336", LLAMA, 8) == (8, 14336)   # no hook: the hint
    assert at.lookup_dims("moe_routing", "1x128 top8", LLAMA, 1) is None       # not a registry op
    assert at.lookup_dims("qknorm", "q 1x32x128, k 1x8x128") is None            # no config: no dims


def test_prediction_for_ops_all_counts_only_the_default_ops():
    """`--ops all` patches the default ops; a DEFAULT_OFF op's bench speedup (rope 0.87x) is no saving."""
    from astra_sglang.e2e.step import predicted_from_profile

    def cap(arm, rows):
        return {"arm": arm, "batch_size": 1, "stage": "decode", "kernel_us_per_step": 1000.0, "ops": rows}

    rows = [{"op": "fused_add_rmsnorm", "covered": True, "speedup": 1.5, "saved_us": 10.0, "us_per_step": 30.0},
            {"op": "rope", "covered": True, "speedup": 0.87, "saved_us": -5.0, "us_per_step": 30.0}]
    p = predicted_from_profile({"captures": [cap("A", rows), cap("B", rows)]}, "A", ["B"], {"B": "all"})
    assert p[("B", 1)]["saved_us"] == 10.0
    named = predicted_from_profile({"captures": [cap("A", rows), cap("B", rows)]}, "A", ["B"], {"B": ["rope"]})
    assert named[("B", 1)]["saved_us"] == -5.0


def test_a_patched_base_keeps_the_in_graph_prediction_and_drops_the_bench_one():
    """--base-ops all,-moe_align: arm A runs astra's other ops, so bench speedups over SGLang's kernels do not apply
    to its profile (they read -16 and +64 us for 40 and 19 measured, H200 2026-11-29); the in-graph one does."""
    from astra_sglang.e2e.step import predicted_from_profile

    def cap(arm, us):
        return {"arm": arm, "batch_size": 64, "stage": "decode", "kernel_us_per_step": 1000.0 + us,
                "ops": [{"op": "moe_align", "covered": True, "speedup": 1.7, "saved_us": 50.0, "us_per_step": us},
                        {"op": "fused_add_rmsnorm", "covered": True, "speedup": 1.4, "saved_us": 30.0,
                         "us_per_step": 60.0}]}

    analysis = {"captures": [cap("A", 90.0), cap("B", 50.0)]}
    p = predicted_from_profile(analysis, "A", ["B"], {"A": ["all", "-moe_align"], "B": "all"}, patched_base=True)
    assert p[("B", 64)]["saved_us"] is None and p[("B", 64)]["unmeasured_ops"] == []
    assert p[("B", 64)]["in_context_saved_us"] == 40.0 and p[("B", 64)]["kernel_step_delta_us"] == 40.0
    assert predicted_from_profile(analysis, "A", ["B"], {"B": "all"})[("B", 64)]["saved_us"] == 80.0


# ----------------------------------------------------------------------------- traces

def _k(name, ts, dur, stream=7):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, "device": 0}}


def test_pdl_overlap_is_clipped_and_charged_to_the_producer():
    # the norm launched with PDL starts 3 µs before the GEMM ends and waits inside
    tr = parse_chrome_trace({"traceEvents": [_k("nvjet_gemm", 0, 10), _k("FusedAddRMSNormKernel", 7, 5),
                                             _k("other_stream", 2, 4, stream=9)]})
    busy = exclusive_times(tr.kernels)
    ex = {k.name: k.excl for k in tr.kernels}
    assert ex == {"nvjet_gemm": 10, "FusedAddRMSNormKernel": 2, "other_stream": 4}
    assert busy == 16


def test_nested_overlap_never_goes_negative():
    evs = [KernelEvent("a", 0, 10), KernelEvent("b", 1, 3), KernelEvent("c", 5, 10)]
    exclusive_times(evs)
    assert [e.excl for e in evs] == [10, 0, 5]


def test_shapes_come_from_the_launching_torch_op():
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100, "tid": 1,
           "args": {"Input Dims": [[8, 4096], [4096, 14336]]}},
          {"ph": "X", "cat": "cpu_op", "name": "sgl_kernel::fused_add_rmsnorm", "ts": 200, "dur": 50, "tid": 1,
           "args": {"Input Dims": [[8, 4096], [8, 4096], [4096], []]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 210, "dur": 5, "tid": 1,
           "args": {"correlation": 42}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 400, "dur": 5, "tid": 1,
           "args": {"correlation": 43}},
          {**_k("FusedAddRMSNormKernel", 1000, 3), "args": {"stream": 7, "correlation": 42}},
          {**_k("orphan", 1010, 3), "args": {"stream": 7, "correlation": 43}}]
    tr = parse_chrome_trace({"traceEvents": ev})
    k = {x.name: x for x in tr.kernels}
    assert k["FusedAddRMSNormKernel"].torch_op == "sgl_kernel::fused_add_rmsnorm"
    assert k["FusedAddRMSNormKernel"].shapes[0] == [8, 4096]
    assert k["orphan"].shapes is None          # launched outside any recorded op


# ----------------------------------------------------------------------------- speedups

def _bench(path: Path, date: str, rows):
    path.write_text(json.dumps({"op": "fused_add_rmsnorm", "date": date, "rows": rows}))


def test_speedup_lookup_newest_exact_then_nearest(tmp_path):
    _bench(tmp_path / "old.json", "2026-11-20T00:00", [{"shape": "8x4096", "dtype": "bf16", "speedup": 1.1}])
    _bench(tmp_path / "new.json", "2026-11-22T00:00", [{"shape": "8x4096", "dtype": "bf16", "speedup": 1.5},
                                                      {"shape": "64x4096", "dtype": "bf16", "speedup": 1.2}])
    (tmp_path / "junk.json").write_text("not json")
    t = SpeedupTable.from_dirs([tmp_path])
    s = t.lookup("fused_add_rmsnorm", (8, 4096))
    assert s.value == 1.5 and s.exact and s.label() == "1.50x"
    n = t.lookup("fused_add_rmsnorm", (48, 4096))
    assert n.value == 1.2 and not n.exact and n.label() == "~1.20x (64x4096)"
    assert t.lookup("fused_add_rmsnorm", (8, 2048)) is None
    assert t.lookup("silu_and_mul", (8, 4096)) is None
    assert t.lookup("fused_add_rmsnorm", (1, 4096)) is None  # 8x from the nearest row: not a prediction
    assert t.lookup("fused_add_rmsnorm", (512, 4096)) is None
    assert t.lookup("fused_add_rmsnorm", (256, 4096)).shape == "64x4096"  # 4x: still the nearest


def test_speedup_lookup_reads_records_kept_compressed(tmp_path):
    """results/ keeps a JSON over 50 KB as NAME.json.xz (tests/test_layout.py): linear's newest bench is one. It is a
    record like any other; a cut-off .xz is skipped like bad JSON."""
    import lzma

    with lzma.open(tmp_path / "bench.json.xz", "wt") as f:
        json.dump({"op": "fused_add_rmsnorm", "date": "2026-11-27T00:00",
                   "rows": [{"shape": "1x4096", "dtype": "bf16", "speedup": 1.25}]}, f)
    _bench(tmp_path / "older.json", "2026-11-20T00:00", [{"shape": "1x4096", "dtype": "bf16", "speedup": 1.1}])
    (tmp_path / "cut.json.xz").write_bytes((tmp_path / "bench.json.xz").read_bytes()[:40])
    s = SpeedupTable.from_dirs([tmp_path]).lookup("fused_add_rmsnorm", (1, 4096))
    assert s.value == 1.25 and s.source.endswith("bench.json.xz")


def test_a_bench_between_astras_linears_does_not_scale_the_unpatched_step(tmp_path):
    """bench --neighbours astra times production's kernel between astra's linears, where the unpatched step never
    ran it (fused_add_rmsnorm 1 x 4096: 2.06x there, 1.44x between cuBLAS GEMMs, H200 2026-11-28): the newest such
    record must not become the profile's speedup."""
    _bench(tmp_path / "cublas.json", "2026-11-28T14:00", [{"shape": "1x4096", "dtype": "bf16", "speedup": 1.44}])
    d = json.loads((tmp_path / "cublas.json").read_text())
    (tmp_path / "astra.json").write_text(json.dumps(dict(d, date="2026-11-28T14:01", context_neighbours="astra",
                                                         rows=[dict(d["rows"][0], speedup=2.06)])))
    s = SpeedupTable.from_dirs([tmp_path]).lookup("fused_add_rmsnorm", (1, 4096))
    assert s.value == 1.44 and s.source.endswith("cublas.json")


def test_the_newest_shipped_benches_in_results_are_all_read():
    """Every bench record of a shipped kernel under results/, plain or compressed, reaches the table (the
    compression of 2026-11-28 hid twelve of them, linear's newest bench among them, until the table read .xz)."""
    results = Path(__file__).resolve().parents[1] / "results"
    read = {s for v in SpeedupTable.from_dirs([results]).by_op.values() for _d, s, _r, _v in v}
    assert any(s.endswith("linear-mma/bench.json.xz") for s in read)
    assert len([s for s in read if s.endswith(".json.xz")]) >= 12


def test_speedup_lookup_takes_only_the_shipped_kernels_benches(tmp_path):
    """A PDL experiment or a deliberately wrong kernel is benched too; only kernels/<op>/kernel.cu counts
    (the profile showed a pdl0 variant's 0.86x as fused_add_rmsnorm's speedup before this)."""
    row = [{"shape": "1x4096", "dtype": "bf16", "speedup": 0.86}]
    (tmp_path / "variant.json").write_text(json.dumps({"op": "fused_add_rmsnorm", "date": "2026-11-24T00:00",
                                                       "candidate": "/tmp/astra-variants.w83k/pdl0.cu", "rows": row}))
    (tmp_path / "cheat.json").write_text(json.dumps({"op": "silu_and_mul", "date": "2026-11-24T00:00",
                                                     "candidate": "tests/bad_candidates/cheat_capture_skip.cu",
                                                     "rows": [{"shape": "1x4096", "dtype": "bf16", "speedup": 9.0}]}))
    (tmp_path / "shipped.json").write_text(json.dumps({
        "op": "fused_add_rmsnorm", "date": "2026-11-23T00:00", "candidate": "/root/repo/kernels/fused_add_rmsnorm/kernel.cu",
        "rows": [{"shape": "1x4096", "dtype": "bf16", "speedup": 1.3}]}))
    t = SpeedupTable.from_dirs([tmp_path])
    assert t.lookup("fused_add_rmsnorm", (1, 4096)).value == 1.3   # the older shipped bench, not the newer variant
    assert t.lookup("silu_and_mul", (1, 4096)) is None
    # a trial of kernels/<op>/kernel.cu itself that was reverted (linear's 16-warp CTAs, 2026-11-27): its record
    # says so, and the newest shipped bench stands
    (tmp_path / "trial.json").write_text(json.dumps({
        "op": "fused_add_rmsnorm", "date": "2026-11-25T00:00", "candidate": "/r/kernels/fused_add_rmsnorm/kernel.cu",
        "shipped": False, "rows": [{"shape": "1x4096", "dtype": "bf16", "speedup": 1.1}]}))
    assert SpeedupTable.from_dirs([tmp_path]).lookup("fused_add_rmsnorm", (1, 4096)).value == 1.3


def test_speedup_lookup_of_a_call_site_reads_the_bench_against_its_production(tmp_path):
    """qknorm_rope_store is benched against Qwen3-MoE's two kernels (variant jit) and dense Qwen3's three
    (jit_dense): a site's lookup reads its own variant's file, whichever is newer; no variant: the newest."""
    cand = "/r/kernels/qknorm_rope_store/kernel.cu"
    for name, variant, date, sp in (("moe", "jit", "2026-11-26T12:00", 1.9), ("dense", "jit_dense",
                                                                              "2026-11-26T14:00", 2.5)):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "op": "qknorm_rope_store", "variant": variant, "date": date, "candidate": cand,
            "rows": [{"shape": "1x32x4x128x5120x5120x5120", "dtype": "bf16", "speedup": sp}]}))
    t = SpeedupTable.from_dirs([tmp_path])
    dims = (1, 32, 4, 128, 5120, 5120, 5120)
    assert t.lookup("qknorm_rope_store", dims, variant="jit").value == 1.9
    assert t.lookup("qknorm_rope_store", dims, variant="jit_dense").value == 2.5
    assert t.lookup("qknorm_rope_store", dims).value == 2.5


def test_speedup_is_over_the_installed_callable_where_the_bench_timed_it(tmp_path):
    """moe_combine's <= 32-token rows: 1.13x over the extracted JIT sum, 0.63x over the torch.compile'd
    callable SGLang runs (H200, 2026-11-26). The profile predicts with the second."""
    rows = [{"shape": "1x8x2048", "dtype": "bf16", "speedup": 1.135, "context_installed_us": 1.086,
             "context_cand_us": 1.723},
            {"shape": "8x8x2048", "dtype": "bf16", "speedup": 1.110, "context_installed_us": None,
             "context_cand_us": 2.265}]
    (tmp_path / "b.json").write_text(json.dumps({"op": "moe_combine", "date": "2026-11-26T00:00",
                                                 "candidate": "kernels/moe_combine/kernel.cu", "rows": rows}))
    t = SpeedupTable.from_dirs([tmp_path])
    assert t.lookup("moe_combine", (1, 8, 2048)).value == pytest.approx(1.086 / 1.723)
    assert t.lookup("moe_combine", (8, 8, 2048)).value == 1.110   # installed not timed: the row's own


# ----------------------------------------------------------------------------- per-op table

def _capture_dir(tmp_path: Path, patched=False, bs=8, steps=4) -> Path:
    d = tmp_path / "cap"
    d.mkdir(exist_ok=True)
    arm = "B" if patched else "A"
    with gzip.open(d / f"{arm}-dec.json.gz", "wt") as f:
        json.dump(fake.trace(bs, steps, patched, False), f)
    with gzip.open(d / f"{arm}-eager.json.gz", "wt") as f:
        json.dump(fake.trace(bs, 1, patched, True), f)
    meta_p = d / "profile-meta.json"
    meta = json.loads(meta_p.read_text()) if meta_p.exists() else {"model": "llama3-8b", "config": LLAMA, "captures": []}
    meta["captures"].append({"stage": "decode", "batch_size": bs, "tokens": bs, "steps": steps,
                             "trace": f"{arm}-dec.json.gz", "shapes_trace": f"{arm}-eager.json.gz", "arm": arm})
    meta_p.write_text(json.dumps(meta))
    return d


def test_analyze_capture_shares_calls_speedup_and_amdahl(tmp_path):
    d = _capture_dir(tmp_path)
    bench = tmp_path / "bench.json"
    _bench(bench, "2026-11-22", [{"shape": "8x4096", "dtype": "bf16", "speedup": 2.0}])
    a = analyze_dir(d, SpeedupTable.from_dirs([bench]))
    c = a["captures"][0]
    step = sum(d for _, d in fake.kernels(8, False))
    assert c["kernel_us_per_step"] == pytest.approx(step)
    rows = {r["op"]: r for r in c["ops"]}
    farn = rows["fused_add_rmsnorm"]
    assert farn["calls_per_step"] == 2 * fake.LAYERS and farn["us_per_call"] == pytest.approx(50.0)
    assert farn["raw_us_per_step"] == pytest.approx(51.0 * 2 * fake.LAYERS)     # the PDL wait is in the raw time
    assert farn["speedup"] == 2.0 and farn["saved_us"] == pytest.approx(farn["us_per_step"] / 2)
    assert c["predicted_gain"] == pytest.approx(farn["saved_us"] / step)
    assert "8x4096" in farn["shapes"][0] and farn["shape_source"] == "profiler"
    assert rows["silu_and_mul"]["speedup_label"] == "unmeasured"
    assert rows["gemm"]["category"] == "gemm" and not rows["gemm"]["covered"]
    assert sum(r["share"] for r in c["ops"]) == pytest.approx(1.0)
    assert farn["attainable"] is None and c["bounded_ops"] == [] and "could save at most" not in capture_table(c)


def test_the_in_context_floor_bounds_what_any_kernel_could_save(tmp_path):
    """A bench row that timed the floor (its "headroom") gives the op's most possible saving beside the predicted one."""
    d = _capture_dir(tmp_path)
    bench = tmp_path / "bench.json"
    _bench(bench, "2026-11-27", [{"shape": "8x4096", "dtype": "bf16", "speedup": 1.25, "headroom": 4.0}])
    t = SpeedupTable.from_dirs([bench])
    assert t.lookup("fused_add_rmsnorm", (8, 4096)).attainable == 4.0
    assert t.lookup("fused_add_rmsnorm", (16, 4096)).attainable == 4.0  # the nearest row carries it too
    c = analyze_dir(d, t)["captures"][0]
    farn = next(r for r in c["ops"] if r["op"] == "fused_add_rmsnorm")
    assert farn["saved_us"] == pytest.approx(farn["us_per_step"] * 0.2)
    assert farn["attainable"] == 4.0 and farn["attainable_saved_us"] == pytest.approx(farn["us_per_step"] * 0.75)
    assert c["bounded_ops"] == ["fused_add_rmsnorm"]
    assert c["attainable_saved_us"] == pytest.approx(farn["attainable_saved_us"])
    head = capture_table(c)
    assert (f"fused_add_rmsnorm: the shipped kernels save {farn['saved_us']:.1f} µs" in head
            and f"could save at most {farn['attainable_saved_us']:.1f} µs" in head)


def test_patched_capture_says_astra_ran_and_predicts_nothing(tmp_path):
    d = _capture_dir(tmp_path, patched=True)
    c = analyze_dir(d, SpeedupTable([]))["captures"][0]
    farn = next(r for r in c["ops"] if r["op"] == "fused_add_rmsnorm")
    assert farn["astra_kernel"] and farn["predicted_gain"] == 0.0
    # with no bench record of its shapes too (linear's rows have no config shape): it ran, it is not "unmeasured"
    assert farn["speedup_label"] == "patched (astra kernel ran)"


def test_outputs_table_plot_and_shapes_corpus(tmp_path):
    d = _capture_dir(tmp_path)
    _capture_dir(tmp_path, bs=32)
    a = analyze_dir(d, SpeedupTable([]))
    out = tmp_path / "out"
    md = write_outputs(a, out, LLAMA, "llama3-8b")
    assert "| fused_add_rmsnorm |" in md and "PDL" in md or "programmatic dependent launch" in md
    assert (out / "profile.json").is_file() and (out / "profile-decode.png").is_file()
    corpus = json.loads((out / "shapes.json").read_text())
    farn = {tuple(e["dims"]): e for e in corpus["ops"]["fused_add_rmsnorm"]}
    assert set(farn) == {(8, 4096), (32, 4096)} and farn[(8, 4096)]["count"] == 2 * fake.LAYERS * 4
    shapes = load_shapes_file(out / "shapes.json", get_op("fused_add_rmsnorm"))
    assert {s.dims for s in shapes} == {(8, 4096), (32, 4096)} and "file" in shapes[0].tags
    assert corpus == shapes_corpus(a, LLAMA, "llama3-8b")


# ----------------------------------------------------------------------------- shapes files

def test_load_shapes_file_merges_orders_and_rejects_bad_input(tmp_path):
    spec = get_op("silu_and_mul")
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"format": "astra-shapes/1", "ops": {"silu_and_mul": [
        {"dims": [1, 14336], "count": 5}, {"dims": [64, 14336], "count": 50, "tags": ["decode"]},
        {"dims": [1, 14336], "count": 7, "tags": ["live"]}]}}))
    got = load_shapes_file(p, spec)
    assert [s.dims for s in got] == [(64, 14336), (1, 14336)]
    assert "count 12" in got[1].source and "live" in got[1].tags
    with pytest.raises(AstraError, match="no shapes for fused_add_rmsnorm"):
        load_shapes_file(p, get_op("fused_add_rmsnorm"))
    for bad, msg in ((json.dumps({"format": "astra-shapes/1", "ops": {"silu_and_mul": [{"dims": [1, 2, 3]}]}}),
                      "2 positive integers"),
                     (json.dumps({"format": "astra-shapes/1", "ops": {"silu_and_mul": [{"dims": [0, 8]}]}}),
                      "positive integers"),
                     (json.dumps({"ops": {}}), "not a shapes corpus"), ("{", "not JSON")):
        p.write_text(bad)
        with pytest.raises(AstraError, match=msg):
            load_shapes_file(p, spec)
    with pytest.raises(AstraError, match="cannot read"):
        load_shapes_file(tmp_path / "missing.json", spec)


def test_spec_shapes_and_check_selection_take_a_file(tmp_path):
    p = tmp_path / "live-2026.json"
    p.write_text(json.dumps({"format": "astra-shapes/1", "ops": {"silu_and_mul": [{"dims": [3, 14336], "count": 2}]}}))
    spec = get_op("silu_and_mul")
    assert [s.dims for s in spec.shapes(str(p))] == [(3, 14336)]
    try:
        from astra_sglang.harness.cases import select_shapes
    except ImportError:
        return
    assert [s.dims for s in select_shapes(spec, str(p))] == [(3, 14336)]


def test_counter_shape_histogram_across_processes(tmp_path):
    from astra_sglang.patch.counters import CounterFile, read_shapes_file, shape_totals, shapes_corpus

    c = CounterFile(tmp_path, ["silu_and_mul", "fused_add_rmsnorm"])
    for _ in range(3):
        c.record_shape("silu_and_mul", (8, 14336), "bf16")
    c.record_shape("silu_and_mul", (64, 14336), "bf16", captured=True)
    c.record_shape("fused_add_rmsnorm", (8, 4096), "bf16")
    slots = read_shapes_file(c.shp_path)
    assert {(s["op"], tuple(s["dims"]), s["count"], s["captured"]) for s in slots} == {
        ("silu_and_mul", (8, 14336), 3, 0), ("silu_and_mul", (64, 14336), 1, 1), ("fused_add_rmsnorm", (8, 4096), 1, 0)}
    # a second process (here: a child) adds to the same directory
    code = ("import sys; from astra_sglang.patch.counters import CounterFile; "
            f"c = CounterFile(r'{tmp_path}', ['silu_and_mul']); c.record_shape('silu_and_mul', (8, 14336), 'bf16')")
    subprocess.run([sys.executable, "-c", code], check=True)
    tot = shape_totals(tmp_path)
    assert tot["silu_and_mul"][0] == {"dims": [8, 14336], "dtype": "bf16", "count": 4, "captured": 0}
    corpus = shapes_corpus(tmp_path)
    f = tmp_path / "corpus.json"
    f.write_text(json.dumps(corpus))
    assert [s.dims for s in load_shapes_file(f, get_op("silu_and_mul"))] == [(8, 14336), (64, 14336)]


# ----------------------------------------------------------------------------- CLI

def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "astra_sglang.cli", *args], capture_output=True, text=True,
                          cwd=cwd or "/")


def test_profile_cli_analyze_and_errors(tmp_path):
    d = _capture_dir(tmp_path)
    r = _cli("profile", "--analyze", str(d), "--out", str(tmp_path / "o"), "--results", str(tmp_path / "cap"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "profile.md").is_file() and "fused_add_rmsnorm" in r.stdout
    for args, msg in ((["--model-path", "nope-model"], "no such directory or shipped config"),
                      (["--model-path", "llama3-8b", "--tp", "0"], "--tp must be >= 1"),
                      (["--model-path", "llama3-8b", "--batch-size", "1,x"], "--batch-size"),
                      (["--analyze", str(tmp_path)], "no profile-meta.json"),
                      (["--from-counters", str(tmp_path)], "no shape telemetry"),
                      ([], "give --model-path, --url or --analyze")):
        r = _cli("profile", "--out", str(tmp_path / "e"), *args)
        assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("error:") and msg in r.stderr, \
            (args, r.stderr)


def test_profile_cli_model_path_with_stand_in_worker(tmp_path):
    r = _cli("profile", "--model-path", "llama3-8b", "--batch-size", "1,8", "--steps", "3", "--out",
             str(tmp_path / "p"), "--worker-module", str(HERE / "step_fake_worker.py"))
    assert r.returncode == 0, r.stderr
    a = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert [(c["stage"], c["batch_size"]) for c in a["captures"]] == [("prefill", 1), ("decode", 1),
                                                                        ("prefill", 8), ("decode", 8)]
    assert (tmp_path / "p" / "model" / "tokenizer.json").is_file()


def test_profile_cli_from_counters(tmp_path):
    from astra_sglang.patch.counters import CounterFile

    CounterFile(tmp_path / "cnt", ["silu_and_mul"]).record_shape("silu_and_mul", (4, 14336), "bf16")
    r = _cli("profile", "--from-counters", str(tmp_path / "cnt"), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o" / "shapes.json").read_text())["ops"]["silu_and_mul"][0]["dims"] == [4, 14336]


def test_profile_cli_url_against_a_stand_in_server(tmp_path):
    import http.server
    import threading

    got = {}

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got.update(body, path=self.path)
            d = Path(body["output_dir"])
            d.mkdir(parents=True, exist_ok=True)
            with gzip.open(d / "1700000000-TP-0.trace.json.gz", "wt") as f:   # as SGLang names them
                json.dump(fake.trace(8, body["num_steps"], False, False), f)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = _cli("profile", "--url", f"http://127.0.0.1:{srv.server_address[1]}", "--steps", "4",
                 "--model-path", "llama3-8b", "--out", str(tmp_path / "u"))
    finally:
        srv.shutdown()
    assert r.returncode == 0, r.stderr
    assert got["path"] == "/start_profile" and got["activities"] == ["GPU"] and got["num_steps"] == 4
    c = json.loads((tmp_path / "u" / "profile.json").read_text())["captures"][0]
    assert c["stage"] == "server" and c["kernel_us_per_step"] == pytest.approx(sum(d for _, d in fake.kernels(8, False)))
    r = _cli("profile", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "v"))
    assert r.returncode != 0 and "POST /start_profile failed" in r.stderr


def test_fused_op_prediction_reads_its_members_kernels():
    """A fused op (qknorm_rope_store) has no kernel of its own in an unpatched step: its members' SGLang kernels
    (qknorm, rope_store) are its time there. The capture lists it apart from the rows; the step prediction for an
    arm that patches it swaps the members for it, in the bench column and in the in-graph one."""
    from astra_sglang.e2e.speedups import Speedup
    from astra_sglang.e2e.step import predicted_from_profile

    qwen3_moe = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-30b-a3b" / "config.json").read_text())

    class Table(SpeedupTable):
        def lookup(self, op, dims, dtype="bf16", variant=None):
            return Speedup(2.0, "x", True, "bench.json", "2026-11-26") if op == "qknorm_rope_store" else None

    kernels = []
    for i in range(4):   # two layers of each kernel per step, two steps
        kernels.append(KernelEvent("fused_qknorm_warp<128>", ts=100.0 * i, dur=1.0))
        kernels.append(KernelEvent("fused_rope_store_kernel<true>", ts=100.0 * i + 10, dur=2.0))
        kernels.append(KernelEvent("nvjet_gemm", ts=100.0 * i + 20, dur=50.0))
    exclusive_times(kernels)
    c = analyze_capture(kernels, Capture("decode", 1, 1, 2, "t.json"), qwen3_moe, Table([]))
    (f,) = c["fused"]
    assert f["op"] == "qknorm_rope_store" and f["replaces"] == ["qknorm", "rope_store"]
    assert f["us_per_step"] == pytest.approx(6.0) and f["saved_us"] == pytest.approx(3.0)

    base = {"arm": "A", "batch_size": 1, "stage": "decode", "kernel_us_per_step": 106.0, "ops": c["ops"],
            "fused": c["fused"]}
    patched = {"arm": "B", "batch_size": 1, "stage": "decode", "kernel_us_per_step": 104.0, "fused": [],
               "ops": [{"op": "qknorm_rope_store", "covered": True, "speedup": None, "saved_us": 0.0,
                        "us_per_step": 4.0}]}
    p = predicted_from_profile({"captures": [base, patched]}, "A", ["B"], {"B": ["qknorm_rope_store"]})[("B", 1)]
    assert p["saved_us"] == pytest.approx(3.0) and p["in_context_saved_us"] == pytest.approx(2.0)
    # an arm without the fused op keeps its members' own rows (none measured here)
    q = predicted_from_profile({"captures": [base, patched]}, "A", ["B"], {"B": ["qknorm"]})[("B", 1)]
    assert q["saved_us"] is None and q["unmeasured_ops"] == ["qknorm"]


def test_a_fused_op_with_two_call_sites_reads_the_members_that_ran_and_the_widest_fused_op_counts():
    """Dense Qwen3 runs qknorm, rope and the KV store: qknorm_rope_store's dense member set (qknorm, rope,
    kv_store) and qknorm_rope's (qknorm, rope) both ran. An arm patching both runs only the wider one (it replaces
    the method that calls the narrower), so the prediction counts it alone."""
    from astra_sglang.e2e.speedups import Speedup
    from astra_sglang.e2e.step import predicted_from_profile

    qwen3 = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-8b" / "config.json").read_text())
    speed = {"qknorm_rope_store": 2.0, "qknorm_rope": 1.5}

    class Table(SpeedupTable):
        def lookup(self, op, dims, dtype="bf16", variant=None):
            return Speedup(speed[op], "x", True, "bench.json", "2026-11-26") if op in speed else None

    kernels = []
    for i in range(4):
        kernels.append(KernelEvent("fused_qknorm_warp<128>", ts=100.0 * i, dur=1.0))
        kernels.append(KernelEvent("fused_rope_kernel<true>", ts=100.0 * i + 10, dur=1.0))
        kernels.append(KernelEvent("store_kvcache<2048>", ts=100.0 * i + 20, dur=2.0))
        kernels.append(KernelEvent("nvjet_gemm", ts=100.0 * i + 30, dur=50.0))
    exclusive_times(kernels)
    c = analyze_capture(kernels, Capture("decode", 1, 1, 2, "t.json"), qwen3, Table([]))
    fused = {f["op"]: f for f in c["fused"]}
    # dense_rope_store's members ran too, but its call site is Llama's attention: not in a qwen3 model
    assert sorted(fused) == ["qknorm_rope", "qknorm_rope_store"]
    assert fused["qknorm_rope_store"]["replaces"] == ["qknorm", "rope", "kv_store"]
    assert fused["qknorm_rope_store"]["us_per_step"] == pytest.approx(8.0)
    assert fused["qknorm_rope"]["replaces"] == ["qknorm", "rope"]
    base = {"arm": "A", "batch_size": 1, "stage": "decode", "kernel_us_per_step": 108.0, "ops": c["ops"],
            "fused": c["fused"]}
    patched = {"arm": "B", "batch_size": 1, "stage": "decode", "kernel_us_per_step": 104.0, "fused": [], "ops": []}
    p = predicted_from_profile({"captures": [base, patched]}, "A", ["B"],
                               {"B": ["qknorm_rope", "qknorm_rope_store"]})[("B", 1)]
    assert p["saved_us"] == pytest.approx(4.0)  # 8 µs at 2x; qknorm_rope's 4 µs at 1.5x is not added
    # an arm that patched only the narrower op ran its kernel: the in-graph saving is that op's against its members
    narrow = dict(patched, ops=[{"op": "qknorm_rope", "covered": True, "speedup": None, "saved_us": 0.0,
                                 "us_per_step": 3.0}])
    q = predicted_from_profile({"captures": [base, narrow]}, "A", ["B"], {"B": ["qknorm_rope"]})[("B", 1)]
    assert q["saved_us"] == pytest.approx(4.0 * (1 - 1 / 1.5))
    assert q["in_context_saved_us"] == pytest.approx(4.0 - 3.0)


def test_a_fused_op_s_call_site_in_a_model_module_counts_only_for_that_model_type():
    from astra_sglang.e2e.profile import _site_of_model

    assert _site_of_model("sglang.srt.models.llama:LlamaAttention.forward", "llama")
    assert _site_of_model("sglang.srt.models.llama:LlamaAttention.forward", "mistral")  # a LlamaForCausalLM
    assert _site_of_model("sglang.srt.models.qwen2:Qwen2Attention.forward", "qwen2")  # dense_rope_store's Qwen2 site
    assert not _site_of_model("sglang.srt.models.llama:LlamaAttention.forward", "qwen3")
    assert not _site_of_model("sglang.srt.models.qwen3:Qwen3Attention.forward", "qwen3_moe")
    assert _site_of_model("sglang.srt.models.qwen3:Qwen3Attention.forward", "")  # unknown model: any
    assert _site_of_model("sglang.kernels.ops.attention.rope:apply_rope_inplace_with_kvcache", "qwen3")


def test_decode_projections_are_linear_where_the_eager_step_shows_only_such_shapes():
    """linear's production is every decode-sized unquantized projection: a GEMM kernel is it only where the eager
    step shows nothing but [T <= MAX_TOKENS, K] x [K, N] projections; the lm_head (N the vocabulary), a prefill, a bias or a
    row wider than the adapter takes keep a name a gemm."""
    from astra_sglang.e2e.profile import _is_projection_gemm, projection_gemm_kernels
    from astra_sglang.kernels.linear.adapter import MAX_TOKENS

    cfg = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-8b" / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    assert _is_projection_gemm([[1, h], [h, 6144]], cfg)            # qkv as aten::mm sees it
    assert _is_projection_gemm([[2, h], [6144, h]], cfg)            # aten::linear's [N, K]
    assert _is_projection_gemm([[1, 1, 12288], [12288, h]], cfg)    # down_proj, [batch, seq, K]
    assert not _is_projection_gemm([[1, h], [h, v]], cfg)           # the lm_head
    assert not _is_projection_gemm([[1, h], [h, (v + 63) // 64 * 32]], cfg)  # the lm_head on one of 2 TP ranks
    assert _is_projection_gemm([[MAX_TOKENS, h], [h, h]], cfg)      # o_proj at 8 tokens: the tensor-core path
    assert not _is_projection_gemm([[MAX_TOKENS, h], [h, 6144]], cfg)  # qkv at 8 tokens: cuBLAS's, as fast
    assert not _is_projection_gemm([[MAX_TOKENS + 1, h], [h, h]], cfg)  # more tokens: cuBLAS's
    assert _is_projection_gemm([[2, 14336], [14336, h]], cfg)       # Llama's down_proj: the 2-row CTAs
    assert not _is_projection_gemm([[4, 14336], [14336, h]], cfg)   # at 4 tokens: longer than MMA_MAX_IN_FEATURES
    assert _is_projection_gemm([[1, 18944], [18944, h]], cfg)       # a Qwen2.5-7B-long down_proj: 2-row CTAs too
    assert _is_projection_gemm([[1, 24576], [24576, h]], cfg)       # Gemma-7B-long: 2-row CTAs (2026-12-01)
    assert not _is_projection_gemm([[1, 28672], [28672, h]], cfg)   # longer than MAX_IN_FEATURES
    assert not _is_projection_gemm([[1, h], [h, 6144], [6144]], cfg)  # a bias
    assert not _is_projection_gemm("garbage", cfg)

    def ev(name, shapes):
        k = KernelEvent(name, ts=0.0, dur=1.0)
        k.shapes, k.torch_op = shapes, "aten::mm"
        return k

    names = projection_gemm_kernels([ev("nvjet_a", [[1, h], [h, 6144]]), ev("nvjet_a", [[1, h], [h, h]]),
                                     ev("nvjet_b", [[1, 12288], [12288, h]]), ev("nvjet_b", [[1, h], [h, v]])], cfg)
    assert names == {"nvjet_a"}


def test_an_arm_env_that_widens_linear_s_rule_widens_the_attribution_for_every_arm(monkeypatch):
    """A step A/B of linear's bound (`--arm-env B:ASTRA_LINEAR_MAX_IN_FEATURES=...`): arm A's cuBLAS down_proj must sit
    in linear's row too, or the in-graph prediction compares B's astra down_proj against nothing in A (it read +19.6%
    for a measured -5.95%, 2026-11-30). The widest rule of the arms (and the driver's own) attributes every arm."""
    from astra_sglang.e2e.profile import _is_projection_gemm, linear_bounds, projection_gemm_kernels
    from astra_sglang.errors import AstraError
    from astra_sglang.kernels.linear import adapter

    monkeypatch.delenv("ASTRA_LINEAR_MAX_IN_FEATURES", raising=False)
    cfg = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-8b" / "config.json").read_text())
    h = cfg["hidden_size"]
    wide = {"ASTRA_LINEAR_MAX_IN_FEATURES": "30000"}
    assert linear_bounds({}) is None and linear_bounds({"arm_env": {"A": {}, "B": {}}}) is None
    assert linear_bounds({"arm_env": {"B": wide}}) == (30000, adapter.MMA_MAX_IN_FEATURES)
    # an arm that narrows it: the other arms (and this process) still take more, so the widest stands
    assert linear_bounds({"arm_env": {"A": {"ASTRA_LINEAR_MAX_IN_FEATURES": "12288"}}}) == (
        adapter.MAX_IN_FEATURES, adapter.MMA_MAX_IN_FEATURES)
    long_row = [[1, 28672], [28672, h]]
    assert not _is_projection_gemm(long_row, cfg)
    assert _is_projection_gemm(long_row, cfg, linear_bounds({"arm_env": {"B": wide}}))
    k = KernelEvent("nvjet_down", ts=0.0, dur=1.0)
    k.shapes, k.torch_op = long_row, "aten::mm"
    assert projection_gemm_kernels([k], cfg) == set()
    assert projection_gemm_kernels([k], cfg, bounds=(30000, 12288)) == {"nvjet_down"}
    assert "28672 > 24576" in adapter.declined(1, 28672, h) and adapter.declined(1, 28672, h, (30000, 12288)) is None
    with pytest.raises(AstraError, match="ASTRA_LINEAR_MAX_IN_FEATURES='wide'"):
        linear_bounds({"arm_env": {"B": {"ASTRA_LINEAR_MAX_IN_FEATURES": "wide"}}})


def test_linear_s_prediction_reads_each_projection_kernel_at_its_own_shapes():
    """A step runs several projections: each kernel name's time is discounted by the bench speedup of the shapes it
    ran (the lowest where it ran several); a name with an unmeasured shape saves nothing; no measured name at all
    reads "unmeasured"."""
    from astra_sglang.e2e.speedups import Speedup

    cfg = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-8b" / "config.json").read_text())
    h = cfg["hidden_size"]
    table = {(1, h, 6144): 2.0, (1, h, h): 1.25, (1, 12288, h): 4.0}

    class Table(SpeedupTable):
        def lookup(self, op, dims, dtype="bf16", variant=None):
            sp = table.get(tuple(dims)) if op == "linear" else None
            return Speedup(sp, "x", True, "bench.json", "2026-11-26") if sp else None

    def ev(name, ts, dur, shapes=None):
        k = KernelEvent(name, ts=ts, dur=dur)
        k.shapes, k.torch_op = shapes, "aten::mm" if shapes else None
        return k

    eager = [ev("nvjet_qkv_o", 0, 1.0, [[1, h], [h, 6144]]), ev("nvjet_qkv_o", 10, 1.0, [[1, h], [h, h]]),
             ev("nvjet_down", 20, 1.0, [[1, 12288], [12288, h]]), ev("nvjet_up", 30, 1.0, [[1, h], [h, 24576]])]
    graph = [ev("nvjet_qkv_o", 0, 10.0), ev("nvjet_down", 20, 8.0), ev("nvjet_up", 40, 6.0)]
    exclusive_times(graph)
    c = analyze_capture(graph, Capture("decode", 1, 1, 1, "t.json"), cfg, Table([]), eager)
    lin = {r["op"]: r for r in c["ops"]}["linear"]
    # qkv_o at its lower speedup (1.25x: 2 µs of 10), down at 4x (6 of 8), up unmeasured (0)
    assert lin["us_per_step"] == pytest.approx(24.0) and lin["saved_us"] == pytest.approx(8.0)
    assert lin["speedup_label"] == "per projection" and lin["speedup"] == pytest.approx(24.0 / 16.0)
    assert c["predicted_saved_us"] == pytest.approx(8.0)
    table.clear()
    c = analyze_capture(graph, Capture("decode", 1, 1, 1, "t.json"), cfg, Table([]), eager)
    lin = {r["op"]: r for r in c["ops"]}["linear"]
    assert lin["speedup_label"] == "unmeasured" and lin["saved_us"] == 0.0


def test_cublas_split_k_reduce_counts_with_the_projection_gemm_before_it():
    """cuBLAS runs some decode projections as split-K: a GEMM kernel, then cublasLt::splitKreduce_kernel, whose name
    every split-K GEMM shares. A reduce right after a projection GEMM on its stream is that F.linear's (the bench's
    installed baseline times both): linear's time and its prediction include it, with no call of its own. A reduce
    after another GEMM (the lm_head) stays a gemm."""
    from astra_sglang.e2e.speedups import Speedup

    cfg = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-8b" / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]

    class Table(SpeedupTable):
        def lookup(self, op, dims, dtype="bf16", variant=None):
            return Speedup(2.0, "x", True, "bench.json", "2026-11-27") if op == "linear" else None

    def ev(name, ts, dur, shapes=None, stream=7):
        k = KernelEvent(name, ts=ts, dur=dur, stream=stream)
        k.shapes, k.torch_op = shapes, "aten::mm" if shapes else None
        return k

    red = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)"
    eager = [ev("nvjet_o_splitK", 0, 1.0, [[4, h], [h, h]]), ev("nvjet_lm", 10, 1.0, [[4, h], [h, v]])]
    graph = [ev("nvjet_o_splitK", 0, 8.0), ev(red, 9, 2.0), ev("nvjet_lm", 20, 30.0), ev(red, 51, 3.0),
             ev(red, 60, 1.0, stream=9)]   # another stream's reduce: not after this projection
    exclusive_times(graph)
    c = analyze_capture(graph, Capture("decode", 4, 4, 1, "t.json"), cfg, Table([]), eager)
    rows = {r["op"]: r for r in c["ops"]}
    assert rows["linear"]["us_per_step"] == pytest.approx(10.0) and rows["linear"]["calls_per_step"] == 1
    assert rows["linear"]["saved_us"] == pytest.approx(5.0)          # the GEMM and its reduce, at 2x
    assert rows["gemm"]["us_per_step"] == pytest.approx(34.0) and rows["gemm"]["calls_per_step"] == 3


def test_sglangs_router_gemm_is_moe_gate_where_the_eager_step_shows_its_shapes():
    """SGLang's gate runs as cuBLAS, whose kernel names every linear shares: a GEMM kernel is moe_gate's production
    only where the eager step shows it ran the router's [T, hidden] x [hidden, experts] and nothing else. The graph
    capture (no shapes) takes kernels of that name as the same GEMM; a name that also ran another linear stays a
    gemm. The prediction then reads moe_gate's bench speedup."""
    from astra_sglang.e2e.speedups import Speedup

    qwen3_moe = json.loads((HERE.parent / "e2e" / "configs" / "qwen3-30b-a3b" / "config.json").read_text())
    h, e = qwen3_moe["hidden_size"], qwen3_moe["num_experts"]

    class Table(SpeedupTable):
        def lookup(self, op, dims, dtype="bf16", variant=None):
            return Speedup(2.0, "x", True, "bench.json", "2026-11-26") if op == "moe_gate" else None

    def ev(name, ts, dur, shapes=None):
        k = KernelEvent(name, ts=ts, dur=dur)
        k.shapes, k.torch_op = shapes, "aten::mm" if shapes else None
        return k

    eager = [ev("nvjet_64x8_2x1", 0, 5.0, [[1, h], [h, e]]),          # the gate only
             ev("nvjet_64x8_4x1", 10, 7.0, [[1, h], [h, 5120]]),       # qkv
             ev("nvjet_shared", 20, 5.0, [[1, h], [h, e]]),            # the gate here ...
             ev("nvjet_shared", 30, 5.0, [[1, 4096], [4096, h]])]      # ... and o_proj there
    graph = [ev("nvjet_64x8_2x1", 100.0 * i, 5.0) for i in range(2)] + \
            [ev("nvjet_64x8_4x1", 100.0 * i + 10, 7.0) for i in range(2)] + \
            [ev("nvjet_shared", 100.0 * i + 20, 5.0) for i in range(2)]
    exclusive_times(graph)
    c = analyze_capture(graph, Capture("decode", 1, 1, 2, "t.json"), qwen3_moe, Table([]), eager)
    rows = {r["op"]: r for r in c["ops"]}
    gate = rows["moe_gate"]
    assert gate["category"] == "op" and gate["covered"] and not gate["astra_kernel"]
    assert gate["us_per_step"] == pytest.approx(5.0) and gate["calls_per_step"] == 1
    assert gate["shapes"] == [f"1x{h}, {h}x{e} (aten::mm)"] and gate["shape_source"] == "profiler"
    assert gate["speedup"] == 2.0 and gate["saved_us"] == pytest.approx(2.5)
    assert rows["linear"]["us_per_step"] == pytest.approx(7.0)  # qkv: a decode projection, linear's production
    assert rows["gemm"]["us_per_step"] == pytest.approx(5.0)    # the shared name stays gemm
    # a dense model has no router: nothing is re-attributed
    llama = json.loads((HERE.parent / "e2e" / "configs" / "llama3-8b" / "config.json").read_text())
    d = analyze_capture(graph, Capture("decode", 1, 1, 2, "t.json"), llama, Table([]), eager)
    assert "moe_gate" not in {r["op"] for r in d["ops"]}


def _config(name):
    return json.loads((HERE.parent / "e2e" / "configs" / name / "config.json").read_text())


def test_the_fused_mlp_and_gemma_norm_ops_have_dims_from_a_config():
    """The profile's fused rows look their bench speedup up by the spec's model_dims (an empty hint otherwise finds
    nothing: 'unmeasured'): gemma_post_attention_norms (tokens, hidden), the fused gate_up GEMVs (tokens, H, I / tp);
    no dense-MLP dims for a MoE config."""
    g2, llama, moe = _config("gemma2-9b"), _config("llama3-8b"), _config("qwen3-30b-a3b")
    assert at.lookup_dims("gemma_post_attention_norms", "", g2, 2) == (2, 3584)
    assert at.lookup_dims("gate_up_gelu_tanh", "", g2, 1) == (1, 3584, 14336)
    assert at.lookup_dims("gate_up_gelu", "", _config("gemma-7b"), 1) == (1, 3072, 24576)  # Gemma-1's erf GELU MLP
    assert at.lookup_dims("gate_up_silu", "", llama, 1, tp=2) == (1, 4096, 7168)
    assert at.lookup_dims("gate_up_silu", "", moe, 1) is None


@pytest.mark.parametrize("model", ["gemma2-9b", "gemma3-12b"])
def test_a_gemma_step_predicts_the_fused_norm_pair_from_its_kept_bench_record(model):
    """Unpatched Gemma kernels (SGLang's two Gemma norm kernels): the fused row of gemma_post_attention_norms takes its
    speedup from the bench record kept under results/ at the config's (1, hidden) row, not 'unmeasured'; Gemma-3's
    model_type (gemma3_text) is its site's module (gemma3_causal)."""
    kernels = []
    for i in range(4):
        kernels.append(KernelEvent("void RMSNormKernel<8, __nv_bfloat16>(...)", ts=100.0 * i, dur=2.0))
        kernels.append(KernelEvent("void FusedAddRMSNormKernel<8, __nv_bfloat16>(...)", ts=100.0 * i + 10, dur=2.0))
        kernels.append(KernelEvent("nvjet_gemm", ts=100.0 * i + 20, dur=50.0))
    exclusive_times(kernels)
    table = SpeedupTable.from_dirs([HERE.parent / "results"])
    c = analyze_capture(kernels, Capture("decode", 1, 1, 2, "t.json"), _config(model), table)
    rows = {f["op"]: f for f in c["fused"]}
    f = rows["gemma_post_attention_norms"]
    assert f["replaces"] == ["gemma_rmsnorm", "gemma_fused_add_rmsnorm"] and f["speedup"] and f["speedup"] > 1.0
    assert f["speedup_label"] != "unmeasured" and f["saved_us"] > 0


def test_load_json_reads_plain_gzip_and_xz_traces(tmp_path):
    """results/ keeps traces as .json.gz or .json.xz: each reads as the plain file does; another suffix is plain."""
    data = {"traceEvents": [{"ph": "X", "name": "k", "ts": 1.0, "dur": 2.0}]}
    text = json.dumps(data)
    (tmp_path / "t.json").write_text(text)
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        f.write(text)
    with lzma.open(tmp_path / "t.json.xz", "wt") as f:
        f.write(text)
    for name in ("t.json", "t.json.gz", "t.json.xz"):
        assert load_json(tmp_path / name) == data
    assert (tmp_path / "t.json.xz").read_bytes()[:6] == b"\xfd7zXZ\x00"   # really xz, not plain text
