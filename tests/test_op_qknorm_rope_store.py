"""qknorm_rope_store (kernels/qknorm_rope_store/): the FUSED op of Qwen3 attention, q/k RMSNorm, rope and the KV
store in one launch, at two call sites (Qwen3-MoE's apply_qk_norm_rope, dense Qwen3's forward). On CPU: the spec loads
through the registry with the ABI the patch adapter is written against; its fp64 reference is qknorm's reference
followed by rope_store's; the corpus is sane; the harness runs every edge shape on CPU; both production launchers
(Qwen3-MoE: SGLang's two JIT kernels back to back; dense: its three) extract from the real sglang 0.5.17 and 0.5.23
sources and build with nvcc for sm_90.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part, shipped_kernel  # noqa: E402

OP = "qknorm_rope_store"


def _has_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))


# ------------------------------------------------------------------------------------------ the contract
def test_spec_loads_with_the_fixed_abi():
    spec = get_op(OP)
    assert spec.name == OP and spec.symbol == "astra_qknorm_rope_store"
    assert spec.dim_names == ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride",
                              "v_stride")
    assert spec.dim_names == get_op("rope_store").dim_names
    ptrs = [(a.name, a.role) for a in spec.abi if a.ctype == "ptr"]
    assert ptrs == [("q", "inout"), ("k", "inout"), ("v", "in"), ("k_cache", "inout"), ("v_cache", "inout"),
                    ("q_weight", "in"), ("k_weight", "in"), ("cos_sin_cache", "in"), ("positions", "in"),
                    ("out_loc", "in")]
    n = len(ptrs) + len(spec.dim_names)
    assert [(a.name, a.ctype) for a in spec.abi[n:]] == [("is_neox", "i64"), ("eps", "f64"), ("dtype", "i32")]
    assert spec.c_signature() == (
        'extern "C" cudaError_t astra_qknorm_rope_store(void* q, void* k, const void* v, void* k_cache, '
        "void* v_cache, const void* q_weight, const void* k_weight, const void* cos_sin_cache, "
        "const void* positions, const void* out_loc, int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, "
        "int64_t head_dim, int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t is_neox, double eps, "
        "int dtype, cudaStream_t stream)")
    assert spec.dtypes == ("fp16", "bf16") and spec.distributions == ("normal", "large")
    assert spec.replaces == ("sglang.srt.models.qwen3_moe:Qwen3MoeAttention.apply_qk_norm_rope",
                             "sglang.srt.models.qwen3:Qwen3Attention.forward")
    assert spec.kernel_symbols == (r"astra_qkrs::",)
    # one member set per call site: the profile finds whichever ran
    assert spec.fused_member_sets() == (("qknorm", "rope_store"), ("qknorm", "rope", "kv_store"))
    assert spec.fused_sites() == (
        ("sglang.srt.models.qwen3_moe:Qwen3MoeAttention.apply_qk_norm_rope", ("qknorm", "rope_store"), "jit"),
        ("sglang.srt.models.qwen3:Qwen3Attention.forward", ("qknorm", "rope", "kv_store"), "jit_dense"))
    assert "FUSED" in spec.summary and "sum" in spec.summary
    assert spec.scalars((1, 32, 4, 128, 5120, 5120, 5120)) == {"is_neox": 1, "eps": 1e-6}
    assert spec.scalars((5, 8, 2, 128, 1536, 1536, 1536))["is_neox"] == 0  # the GPT-J edge shape


def test_jit_variant_launches_both_headers_and_guards_both_launchers_facts():
    """One launcher over qknorm.cuh and rope.cuh; its source facts are the union of the qknorm and rope_store jit
    variants' (a sibling's facts changing fails here, so this launcher is reviewed with theirs)."""
    v = get_op(OP).variant("jit")
    assert [(s.root, s.path) for s in v.sources] == [("sglang_jit", "csrc/elementwise/qknorm.cuh"),
                                                     ("sglang_jit", "csrc/elementwise/rope.cuh")]
    assert v.flag_profile == get_op("rope_store").variant("jit").flag_profile
    assert v.include_roots == ("tvm_ffi", "dlpack")
    assert get_op(OP).default_variant({}) == "jit"


def test_dense_variant_launches_three_headers_and_guards_its_siblings_facts():
    """Dense Qwen3's sequence: qknorm_rope's launcher (norm, then the non-fused rope) and kv_store's store, their
    facts reused; it refuses KV rows the store does not instantiate."""
    v = get_op(OP).variant("jit_dense")
    assert [s.path for s in v.sources] == ["csrc/elementwise/qknorm.cuh", "csrc/elementwise/rope.cuh",
                                           "csrc/elementwise/kvcache.cuh"]
    assert v.launcher == "launch_jit_dense.cu.in"
    assert v.source_facts == (get_op("qknorm_rope").variant("jit").source_facts
                              + get_op("kv_store").variant("jit").source_facts)
    assert v.supports((1, 32, 8, 128, 6144, 6144, 6144), "bf16") is None
    assert "KV rows" in v.supports((3, 5, 1, 64, 448, 448, 448), "bf16")  # 128-byte rows


# ------------------------------------------------------------------------------------------ reference
def _small_inputs(dims, dtype="fp16", seed=0):
    return get_op(OP).make_inputs(dims, dtype, torch.Generator().manual_seed(seed), device="cpu")


@pytest.mark.parametrize("neox", [1, 0])
@pytest.mark.parametrize("dims", [(4, 4, 2, 64, 512, 512, 512), (3, 2, 1, 128, 512, 640, 256)])
def test_reference_is_qknorm_then_rope_store(dims, neox):
    """fp64: qknorm's reference (in place on q, k), then rope_store's reference on its outputs."""
    spec, qkn, rs = get_op(OP), get_op("qknorm"), get_op("rope_store")
    t, hq, hk, d, qs, ks, vs = dims
    inp = _small_inputs(dims, seed=neox)
    d64 = {n: x.double() for n, x in inp.items()}
    scal = {"is_neox": neox, "eps": 1e-6}
    ref = spec.reference(d64, dims, scal)
    normed = qkn.reference({n: d64[n] for n in ("q", "k", "q_weight", "k_weight")}, dims[:6], {"eps": 1e-6})
    chained = rs.reference({**{n: d64[n] for n in ("v", "k_cache", "v_cache", "cos_sin_cache", "positions",
                                                     "out_loc")}, "q": normed["q"], "k": normed["k"]},
                           dims, {"is_neox": neox})
    assert sorted(ref) == sorted(chained) == ["k", "k_cache", "q", "v_cache"]
    for name in ref:
        assert torch.allclose(ref[name], chained[name], rtol=0, atol=1e-12), name
    # the columns past the heads are untouched; the cache holds the rotated k and v at each slot only
    assert torch.equal(ref["q"][:, hq * d:], d64["q"][:, hq * d:])
    assert torch.equal(ref["k"][:, hk * d:], d64["k"][:, hk * d:])
    loc = inp["out_loc"]
    assert torch.equal(ref["k_cache"][loc], ref["k"][:, : hk * d])
    assert torch.equal(ref["v_cache"][loc], d64["v"][:, : hk * d])
    others = [i for i in range(ref["k_cache"].shape[0]) if i not in set(loc.tolist())][:20]
    assert torch.equal(ref["k_cache"][others], d64["k_cache"][others])


def test_reference_takes_the_patch_s_head_views():
    """The patch hands [tokens, heads, head_dim] views of q, k and v: same answer as the harness's row buffers
    (each [tokens, stride] from its block's first column)."""
    spec = get_op(OP)
    dims = (3, 4, 2, 64, 512, 512, 512)
    inp = _small_inputs(dims)
    d64 = {n: x.double() for n, x in inp.items()}
    scal = {"is_neox": 1, "eps": 1e-6}
    rows = spec.reference(d64, dims, scal)
    views = {**d64, "q": d64["q"][:, :256].reshape(3, 4, 64), "k": d64["k"][:, :128].reshape(3, 2, 64),
             "v": d64["v"][:, :128].reshape(3, 2, 64)}
    got = spec.reference(views, dims, scal)
    assert got["q"].shape == (3, 4, 64) and got["k"].shape == (3, 2, 64)
    assert torch.allclose(got["q"].reshape(3, -1), rows["q"][:, :256], atol=1e-12)
    assert torch.allclose(got["k"].reshape(3, -1), rows["k"][:, :128], atol=1e-12)
    assert torch.allclose(got["k_cache"], rows["k_cache"], atol=1e-12)
    assert torch.allclose(got["v_cache"], rows["v_cache"], atol=1e-12)


def test_rope_after_the_norm_keeps_each_head_s_norm():
    """A rotation keeps the 2-norm of every head: after the fused op a head's norm is that of the normed, weighted
    head (independent of rope), for NeoX and GPT-J alike."""
    spec = get_op(OP)
    dims = (5, 3, 1, 128, 640, 640, 640)
    inp = _small_inputs(dims, "bf16", seed=4)
    d64 = {n: x.double() for n, x in inp.items()}
    for neox in (1, 0):
        out = spec.reference(d64, dims, {"is_neox": neox, "eps": 1e-6})["q"][:, :384].reshape(5, 3, 128)
        x = d64["q"][:, :384].reshape(5, 3, 128)
        normed = torch.nn.functional.rms_norm(x, (128,), d64["q_weight"], eps=1e-6)
        assert torch.allclose(out.norm(dim=-1), normed.norm(dim=-1), rtol=1e-6)  # fp32 cos^2 + sin^2


def test_harness_runs_every_edge_shape_and_distribution_on_cpu(monkeypatch):
    """make_inputs, the guard regions, in-place roles, scalars and the tolerance rule fit together."""
    from reference_harness import run_edge_cases_on_cpu

    mod = op_part(OP, "spec")
    monkeypatch.setattr(mod, "MAX_POSITION", 64)  # CPU-sized cos/sin cache and KV pool
    monkeypatch.setattr(mod, "cache_slots", lambda t: max(32, 2 * t))
    run_edge_cases_on_cpu(get_op(OP))


# ------------------------------------------------------------------------------------------ corpus
def test_corpus_is_rope_store_s_and_qknorm_rope_s_models_and_every_shape_is_supported():
    spec, rs, qr = get_op(OP), get_op("rope_store"), get_op("qknorm_rope")
    dims = {s.dims for s in spec.corpus}
    assert {s.dims for s in rs.corpus} <= dims
    # the dense rows: qknorm_rope's shapes with v's block after k
    assert {(t, hq, hk, d, qs, qs, qs) for t, hq, hk, d, qs, ks in (s.dims for s in qr.corpus)} <= dims
    tags = {t for s in spec.corpus for t in s.tags}
    assert {"decode", "prefill"} <= tags
    assert {s.dims[0] for s in spec.corpus} >= {1, 16, 64, 256, 1024, 16384}
    # qwen3-32b's per-rank heads are those of a Qwen3-MoE row (deduplicated)
    assert {s.source.split(" tp")[0] for s in spec.corpus} == {"qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-8b"}
    for s in spec.corpus:
        assert spec.variant("jit_dense").supports(s.dims, "bf16") is None, s.dims
    v = spec.variant("jit")
    for s in list(spec.corpus) + list(spec.edge_shapes):
        t, hq, hk, d, qs, ks, vs = s.dims
        assert d in (64, 128, 256) and hq >= 1 and hk >= 1
        assert qs >= hq * d and ks >= hk * d and vs >= hk * d
        if "edge" not in s.tags:
            assert qs == ks == vs == (hq + 2 * hk) * d and d == 128  # column blocks of the qkv output
        for dt in spec.dtypes:
            assert v.supports(s.dims, dt) is None, (s.dims, dt)
        # rope_store's bytes plus the two weight vectors
        assert spec.bytes_moved(s.dims, "bf16") == rs.bytes_moved(s.dims, "bf16") + 2 * d * 2
    edge = {s.dims for s in spec.edge_shapes}
    assert (5, 8, 2, 128, 1536, 1536, 1536) in edge  # GPT-J
    assert {s.dims[3] for s in spec.edge_shapes} == {64, 128, 256}
    assert any(s.dims[4:] == (1024, 256, 256) for s in spec.edge_shapes)  # separate contiguous q, k, v
    assert (1, 1, 1, 128, 384, 384, 384) in edge
    assert v.supports((1, 8, 1, 96, 1280, 1280, 1280), "bf16") is not None


def test_model_dims_from_a_config():
    spec = op_part(OP, "spec")
    cfg = {"num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 2048}
    assert spec.model_dims(cfg, 16, 2) == (16, 16, 2, 128, 2560, 2560, 2560)


# ------------------------------------------------------------------------------------------ kernel source
def test_shipped_kernel_passes_the_static_checks_and_declares_the_abi():
    from astra_sglang.static_checks import scan_file

    src = shipped_kernel(OP)
    assert scan_file(src) == []
    assert scan_file(src.parent / "launch_jit.cu.in") == []
    text = src.read_text()
    assert "namespace astra_qkrs {" in text and "namespace {" in text
    assert "torch" not in text.lower().replace("pytorch", "")
    assert "#include \"" not in text  # self-contained: toolkit headers only
    assert get_op(OP).c_signature().split("(")[0] in text
    assert "griddepcontrol.wait" in text and "griddepcontrol.launch_dependents" in text


# ------------------------------------------------------------------------------------------ builds
# (the shipped kernel's build and exported symbols: tests/test_kernels_linkage.py, over every op folder)
def _sglang_src(version: str, request) -> Path:
    if version == "0.5.23":
        return Path(request.getfixturevalue("wheel_sources")["sglang"])
    return Path(request.getfixturevalue("sglang_0_5_17_source"))


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("variant", ["jit", "jit_dense"])
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_production_launcher_extracts_and_builds_its_headers_in_one_unit(version, variant, request, tmp_path):
    """The launcher includes qknorm.cuh and rope.cuh (dense: and kvcache.cuh, whose names 0.5.17 would collide with
    qknorm.cuh's) in one translation unit and launches the norm kernel, then the fused rope + store kernel (dense:
    the rope kernel, then the store kernel): all link into the library (0.5.17: anonymous namespace; 0.5.23:
    sglang::), and the source facts pick the kernels of each version."""
    if not _has_nvcc():
        pytest.skip("needs nvcc")
    from astra_sglang.build import Arch
    from astra_sglang.build.workspace import Workspace
    from astra_sglang.extract import discover, extract
    from astra_sglang.static_checks import scan_file

    ws_src = request.getfixturevalue("wheel_sources")
    roots = discover(_sglang_src(version, request), ws_src["flashinfer"], ws_src["tvm"])
    dest = tmp_path / OP
    extract(get_op(OP), roots, dest, Arch(9, 0), variant=variant)
    ws = Workspace.open(OP, path=dest)
    assert ws.manifest["sources"]["sglang_jit"]["version"] == version
    assert ws.manifest["launch_facts"]["BLOCK_SIZE"] == "128" and ws.manifest["launch_facts"]["WARPS_PER_BLOCK"] == "4"
    text = ws.baseline.read_text()
    first = "fused_qknorm_half_warp" if version == "0.5.23" else "QKNormKernelWarp"
    assert f"#define ASTRA_QK_FIRST_{first} 1" in text
    assert scan_file(ws.baseline, ws.include_dirs) == []
    res = ws.build()
    assert res.ok, res.log[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    assert get_op(OP).symbol in syms
    if shutil.which("strings") and shutil.which("c++filt"):
        names = subprocess.run(f"strings {res.library} | c++filt", shell=True, capture_output=True,
                               text=True).stdout
        assert "fused_qknorm_warp<128l, true, __nv_bfloat16>" in names
        if variant == "jit":
            assert "fused_rope_store_kernel<true, 128l, true, __nv_bfloat16, __nv_bfloat16, long, 16u>" in names
        else:
            assert "fused_rope_kernel<true, 128l, true, __nv_bfloat16, __nv_bfloat16, long, 16u>" in names
            assert "store_kvcache" in names
