"""e2e/neighbours.py: the kernel after each covered op, arm A vs arm B (CPU, synthetic traces)."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from astra_sglang.e2e.neighbours import compare_dir, consumer_effects, pairs, table
from astra_sglang.e2e.trace import KernelEvent

NORM_A = "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)"
NORM_B = "void astra_fused_add_rmsnorm::(anonymous namespace)::fused_add_rmsnorm_kernel<1>(...)"
GEMM = "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT"


def back_to_back(names_durs, steps: int, stream: int = 7):
    """steps x the (kernel name, µs) sequence, back to back on one stream."""
    ks, t = [], 0.0
    for _ in range(steps):
        for name, dur in names_durs:
            ks.append(KernelEvent(name, t, dur, stream=stream))
            t += dur
    return ks


def step(norm: str, norm_us: float, gemm_us: float, steps: int = 3, stream: int = 7):
    """steps x (norm, gemm, attention), back to back on one stream."""
    return back_to_back(((norm, norm_us), (GEMM, gemm_us), ("_fwd_grouped_kernel_stage1", 5.0)), steps, stream)


def test_pairs_follow_each_stream():
    ks = step(NORM_A, 3.0, 70.0, steps=2) + [KernelEvent(GEMM, 1.0, 9.0, stream=9)]   # another stream's kernel
    p = pairs(ks)
    assert list(p) == [("fused_add_rmsnorm", "gemm")]
    assert p[("fused_add_rmsnorm", "gemm")] == [(3.0, 70.0, 73.0), (3.0, 70.0, 73.0)]


def test_pairs_name_a_gemma_model_s_flashinfer_norm_the_gemma_op():
    p = pairs(step(NORM_A, 3.0, 70.0, steps=1), gemma=True)
    assert list(p) == [("gemma_fused_add_rmsnorm", "gemm")]


def test_a_faster_op_that_slows_its_consumer_is_a_loss():
    rows = consumer_effects(step(NORM_A, 3.0, 70.0), step(NORM_B, 2.5, 75.0), steps=3)
    r = rows[0]
    assert (r["op"], r["next"], r["calls_per_step"]) == ("fused_add_rmsnorm", "gemm", 1.0)
    assert r["op_delta_step_us"] == pytest.approx(-0.5) and r["next_delta_step_us"] == pytest.approx(5.0)
    assert r["span_delta_step_us"] == pytest.approx(4.5)


def pdl_step(producer_us: float, norm_early_us: float, steps: int = 2):
    """steps x (producer GEMM, norm, consumer GEMM): the norm launched with PDL starts norm_early_us before the
    producer ends and waits; its own work is 1.5 us after that."""
    ks, t = [], 0.0
    for _ in range(steps):
        ks.append(KernelEvent(GEMM, t, producer_us, stream=7))
        t += producer_us
        ks.append(KernelEvent(NORM_B, t - norm_early_us, norm_early_us + 1.5, stream=7))
        t += 1.5
        ks.append(KernelEvent(GEMM, t, 40.0, stream=7))
        t += 40.0
    return ks


def test_a_pdl_wait_on_the_producer_is_not_the_ops_time():
    # the norm waits 14 us on a slower producer in B: the same 1.5 us of its own, the same span to the consumer's end
    rows = consumer_effects(pdl_step(12.0, 0.5), pdl_step(26.0, 14.0), steps=2)
    r = next(x for x in rows if x["op"] == "fused_add_rmsnorm")
    assert r["op_us"] == pytest.approx((1.5, 1.5)) and r["span_us"] == pytest.approx((41.5, 41.5))
    assert r["span_delta_step_us"] == pytest.approx(0.0)


def test_an_op_taking_more_calls_counts_each_arms_calls():
    # B's op runs twice a step where A's ran once: the Δ per step is B's two calls against A's one
    a = step(NORM_A, 3.0, 70.0, steps=2)
    b = step(NORM_B, 2.5, 70.0, steps=4)
    r = consumer_effects(a, b, steps=2)[0]
    assert (r["calls_per_step"], r["calls_per_step_b"]) == (1.0, 2.0)
    assert r["op_delta_step_us"] == pytest.approx(2 * 2.5 - 3.0)
    assert "1 → 2" in table(consumer_effects(a, b, steps=2))


def _capture_dir(tmp_path, config=None, norm_b=NORM_B):
    caps = []
    for arm, norm, g in (("A", NORM_A, 70.0), ("B", norm_b, 75.0), ("A-TP1", NORM_A, 70.0)):
        ev = [{"ph": "X", "cat": "kernel", "name": k.name, "ts": k.ts, "dur": k.dur, "pid": 0, "tid": 7,
               "args": {"stream": 7, "device": 0}} for k in step(norm, 3.0 if arm != "B" else 2.5, g)]
        fn = f"{arm}-bs1-decode.trace.json.gz"
        with gzip.open(tmp_path / fn, "wt") as f:
            json.dump({"traceEvents": ev}, f)
        caps.append({"stage": "decode", "batch_size": 1, "tokens": 1, "steps": 3, "trace": fn, "arm": arm})
    (tmp_path / "profile-meta.json").write_text(json.dumps({"captures": caps, "config": config or {}}))
    return tmp_path


def test_compare_dir_pairs_each_arm_with_the_base_and_skips_other_ranks(tmp_path):
    res = compare_dir(_capture_dir(tmp_path))
    assert [(r["arm"], r["batch_size"]) for r in res] == [("B", 1)]
    assert res[0]["rows"][0]["span_delta_step_us"] == pytest.approx(4.5)
    # a Gemma: SGLang's FlashInfer norm in A is the gemma op astra's gemma kernel replaces in B (the capture's
    # config says so)
    gemma = compare_dir(_capture_dir(tmp_path, {"model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh"},
                                     "void astra_gfarn::(anonymous namespace)::gemma_fused_add_rmsnorm_kernel<1>(...)"))
    assert gemma[0]["rows"][0]["op"] == "gemma_fused_add_rmsnorm"


def test_cli_table_and_errors(tmp_path):
    d = _capture_dir(tmp_path / "cap") if (tmp_path / "cap").mkdir() is None else None
    p = subprocess.run([sys.executable, "-m", "astra_sglang.e2e.neighbours", str(d)], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert p.returncode == 0 and "| fused_add_rmsnorm → gemm | 1 | 3.00 → 2.50 |" in p.stdout
    p = subprocess.run([sys.executable, "-m", "astra_sglang.e2e.neighbours", str(tmp_path)], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert p.returncode == 2 and p.stderr.startswith("error:")


def test_the_table_classifies_as_the_profile_does_sglangs_router_gemm_included(tmp_path):
    """compare_dir reads each capture's eager shapes trace: a GEMM kernel that ran only the router's [T, hidden] x
    [hidden, experts] there is moe_gate in both arms' graph traces (the profile's op_classifier), so the norm's next
    kernel is moe_gate in A (SGLang's cuBLAS GEMM) and in B (astra's), not a gemm in one and moe_gate in the other."""
    cfg = {"hidden_size": 2048, "num_experts": 128, "hidden_act": "silu", "model_type": "qwen3_moe"}
    gate_a, gate_b = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", "void astra_moeg::(anonymous namespace)::moe_gate_kernel<1>"

    def kernels(names_durs, steps=3):
        ks, t = [], 0.0
        for _ in range(steps):
            for name, dur in names_durs:
                ks.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur, "pid": 0, "tid": 7,
                           "args": {"stream": 7, "device": 0}})
                t += dur
        return ks

    def write(fn, events):
        with gzip.open(tmp_path / fn, "wt") as f:
            json.dump({"traceEvents": events}, f)

    caps = []
    for arm, norm, gate, g_us in (("A", NORM_A, gate_a, 5.0), ("B", NORM_B, gate_b, 2.8)):
        write(f"{arm}-dec.json.gz", kernels([(norm, 2.0), (gate, g_us), ("_router_triton_kernel", 2.0)]))
        eager = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 10.0, "pid": 0, "tid": 1,
                  "args": {"Input Dims": [[1, 2048], [2048, 128]]}},
                 {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1.0, "dur": 2.0, "pid": 0,
                  "tid": 1, "args": {"correlation": 5}},
                 {"ph": "X", "cat": "kernel", "name": gate, "ts": 20.0, "dur": g_us, "pid": 0, "tid": 7,
                  "args": {"stream": 7, "device": 0, "correlation": 5}}]
        write(f"{arm}-eager.json.gz", eager)
        caps.append({"stage": "decode", "batch_size": 1, "tokens": 1, "steps": 3, "trace": f"{arm}-dec.json.gz",
                     "shapes_trace": f"{arm}-eager.json.gz", "arm": arm})
    (tmp_path / "profile-meta.json").write_text(json.dumps({"captures": caps, "config": cfg}))
    (res,) = compare_dir(tmp_path)
    rows = {(r["op"], r["next"]): r for r in res["rows"]}
    assert ("fused_add_rmsnorm", "moe_gate") in rows and ("fused_add_rmsnorm", "gemm") not in rows
    gate = rows[("moe_gate", "moe_router")]
    assert gate["op_us"] == pytest.approx((5.0, 2.8)) and gate["op_delta_step_us"] == pytest.approx(-2.2)


REDUCE = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true>(...)"
LINEAR_B = "void astra_lin::(anonymous namespace)::linear_fma_kernel<__nv_bfloat16, 2, 1>(...)"


def test_a_split_k_gemm_is_one_call_named_by_its_gemm_kernel():
    """cuBLAS's split-K GEMM ends in a reduce kernel whose name every split-K GEMM shares (the profile cannot call it
    a projection). In A, down_proj ran as GEMM + reduce before the norm, and the (linear, norm) pair B's astra linear
    made had no counterpart: B's row counted 2 calls a step against A's 1 (Llama-3-8B, batch 4, H200, 2026-11-28)."""
    from astra_sglang.e2e.attribution import Match, classify

    def match(name):   # as profile.op_classifier names a model's projection GEMM kernels
        return Match("linear", "op", True, "astra" in name) if name in (GEMM, LINEAR_B) else classify(name)

    a, b, t = [], [], 0.0
    for _ in range(2):   # per step: o_proj (one nvjet kernel) -> norm, down_proj (split-K: nvjet + reduce) -> norm
        for ks, seq in ((a, ((GEMM, 6.0), (NORM_A, 2.0), (GEMM, 8.0), (REDUCE, 1.0), (NORM_A, 2.0))),
                        (b, ((LINEAR_B, 5.0), (NORM_B, 1.5), (LINEAR_B, 7.0), (NORM_B, 1.5)))):
            u = t
            for name, dur in seq:
                ks.append(KernelEvent(name, u, dur, stream=7))
                u += dur
        t += 100.0
    pa = pairs(a, of=lambda k: match(k.name))
    assert len(pa[("linear", "fused_add_rmsnorm")]) == 4        # both projections, the split one included
    assert sorted(x[0] for x in pa[("linear", "fused_add_rmsnorm")]) == [6.0, 6.0, 9.0, 9.0]  # GEMM + its reduce
    assert ("gemm", "fused_add_rmsnorm") not in pa
    r = next(x for x in consumer_effects(a, b, steps=2, of=lambda k: match(k.name)) if x["op"] == "linear")
    assert (r["calls_per_step"], r["calls_per_step_b"]) == (2.0, 2.0)
    assert r["op_delta_step_us"] == pytest.approx((5.0 + 7.0) - (6.0 + 9.0))


def test_the_call_before_each_op_splits_a_split_k_producer_off():
    """Llama-3-8B at batch 64 (H200, 2026-11-28): fused_add_rmsnorm runs behind o_proj (one nvjet kernel) and behind
    the split-K down_proj (nvjet + cuBLAS's reduce, which releases a PDL-launched kernel early). Launched plainly in B,
    the norm lost 0.6 µs behind the split-K GEMM only; the rows by the call before say which."""
    from astra_sglang.e2e.neighbours import producer_effects, producer_pairs, producer_table

    def arm(norm_after_split: float):   # per step: o_proj -> norm -> gate_up, down_proj (split-K) -> norm -> qkv
        return back_to_back(((GEMM, 6.0), (NORM_A, 2.25), (GEMM, 60.0), (GEMM, 30.0), (REDUCE, 2.5),
                             (NORM_A, norm_after_split), (GEMM, 16.0)), steps=2)

    pa = producer_pairs(arm(1.54))
    assert sorted(pa) == [("gemm", "fused_add_rmsnorm"), ("gemm (split-K)", "fused_add_rmsnorm")]
    rows = {r["before"]: r for r in producer_effects(arm(1.54), arm(2.14), steps=2)}
    split, plain = rows["gemm (split-K)"], rows["gemm"]
    assert split["op_us"] == pytest.approx((1.54, 2.14)) and split["op_delta_step_us"] == pytest.approx(0.6)
    assert plain["op_delta_step_us"] == pytest.approx(0.0) and split["calls_per_step"] == 1.0
    assert "| gemm (split-K) → fused_add_rmsnorm | 1 | 1.54 → 2.14 | +0.6 |" in producer_table(list(rows.values()))


def test_compare_dir_reports_the_call_before_each_op_too(tmp_path):
    (res,) = compare_dir(_capture_dir(tmp_path))
    (row,) = res["producers"]   # each step's norm follows the previous step's attention kernel
    assert row["op"] == "fused_add_rmsnorm" and row["op_us"] == pytest.approx((3.0, 2.5))
    from astra_sglang.e2e.neighbours import report

    md = report([res])
    assert "### The call before each covered op" in md and "→ fused_add_rmsnorm |" in md


def test_a_fused_op_in_one_arm_keeps_its_rows_and_the_prediction_counts_each_kernel_once():
    """Gemma-2-9B, batch 16 (H200, 2026-11-29, results/2026-11-29-h200/session18): arm A runs SGLang's two norms
    (gemma_rmsnorm -> gemma_fused_add_rmsnorm) between o_proj and gate_up, arm B astra's one fused op. Its rows
    must be there with "—" for A, or the members' rows claim their whole span as saved; and the norm -> norm span
    holds the second norm, which its own row counts again (603 µs saved predicted that way, 282 µs this way, for a
    step 287 µs faster)."""
    from astra_sglang.e2e.neighbours import saved_with_consumers

    rms = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(...)"
    fused = "void astra_gpan::(anonymous namespace)::gemma_post_attention_norms_kernel<__nv_bfloat16, 8, 1>(...)"

    a = back_to_back(((GEMM, 6.0), (rms, 1.7), (NORM_A, 2.7), (GEMM, 40.0)), steps=2)
    b = back_to_back(((GEMM, 6.0), (fused, 1.6), (GEMM, 40.5)), steps=2)
    rows = {(r["op"], r["next"]): r for r in consumer_effects(a, b, steps=2, gemma=True)}
    new = rows[("gemma_post_attention_norms", "gemm")]
    assert new["op_us"] == (None, pytest.approx(1.6)) and (new["calls_per_step"], new["calls_per_step_b"]) == (0, 1)
    assert new["span_delta_step_us"] == pytest.approx(42.1)
    gone = rows[("gemma_rmsnorm", "gemma_fused_add_rmsnorm")]
    assert gone["op_us"][1] is None and gone["op_delta_step_us"] == pytest.approx(-1.7)
    # own times 1.7 + 2.7 -> 1.6, the consumer 40.0 -> 40.5: 2.3 µs saved a step
    assert saved_with_consumers(list(rows.values())) == pytest.approx(2.3)
    assert "| gemma_post_attention_norms → gemm | 0 → 1 | — → 1.60 |" in table(list(rows.values()))
