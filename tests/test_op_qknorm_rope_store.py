"""qknorm_rope_store (kernels/qknorm_rope_store/): the FUSED op of Qwen3 attention, q/k RMSNorm, rope and the KV
store in one launch, at two call sites (Qwen3-MoE's apply_qk_norm_rope, dense Qwen3's forward). q goes into its own
contiguous q_out (ASTRA_QKRS_Q_OUT=0: in place, for a step A/B). On CPU: the spec loads through the registry with the
ABI the patch adapter is written against; its fp64 reference is qknorm's reference followed by rope_store's (q's
result as q_out); the corpus is sane; the harness runs every edge shape on CPU; expand, normalize, the sequence,
returns and the self-check at both sites with q_out separate and in place; validate's layer driver on stand-ins; the
kernel and both production launchers (Qwen3-MoE: SGLang's two JIT kernels back to back; dense: its three, extracted
from the real sglang 0.5.17 and 0.5.23 sources) build with nvcc for sm_90.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from adapter_env import adapter_attr_under_env  # noqa: E402
from astra_sglang.registry import get_op, op_part, shipped_kernel  # noqa: E402

OP = "qknorm_rope_store"

SIGNATURE = (
    'extern "C" cudaError_t astra_qknorm_rope_store(const void* q, void* q_out, void* k, const void* v, '
    "void* k_cache, void* v_cache, const void* q_weight, const void* k_weight, const void* cos_sin_cache, "
    "const void* positions, const void* out_loc, int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, "
    "int64_t head_dim, int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t q_out_stride, "
    "int64_t is_neox, double eps, int dtype, cudaStream_t stream)")


def _has_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))


# ------------------------------------------------------------------------------------------ the contract
def test_spec_loads_with_the_fixed_abi():
    spec = get_op(OP)
    assert spec.name == OP and spec.symbol == "astra_qknorm_rope_store"
    assert spec.dim_names == ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride",
                              "v_stride", "q_out_stride")
    assert spec.dim_names == get_op("rope_store").dim_names + ("q_out_stride",)
    # q an input, its result in q_out (an output) right after it
    ptrs = [(a.name, a.role) for a in spec.abi if a.ctype == "ptr"]
    assert ptrs == [("q", "in"), ("q_out", "out"), ("k", "inout"), ("v", "in"), ("k_cache", "inout"),
                    ("v_cache", "inout"), ("q_weight", "in"), ("k_weight", "in"), ("cos_sin_cache", "in"),
                    ("positions", "in"), ("out_loc", "in")]
    n = len(ptrs) + len(spec.dim_names)
    assert [(a.name, a.ctype) for a in spec.abi[n:]] == [("is_neox", "i64"), ("eps", "f64"), ("dtype", "i32")]
    assert spec.c_signature() == SIGNATURE
    # the kernel's and both launchers' definitions take the spec's parameters, in order
    for name in ("kernel.cu", "launch_jit.cu.in", "launch_jit_dense.cu.in"):
        src = " ".join((shipped_kernel(OP).parent / name).read_text().split())
        assert SIGNATURE.split(" ", 2)[2] in src, name
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
    assert spec.scalars((1, 32, 4, 128, 5120, 5120, 5120, 4096)) == {"is_neox": 1, "eps": 1e-6}
    assert spec.scalars((5, 8, 2, 128, 1536, 1536, 1536, 1024))["is_neox"] == 0  # the GPT-J edge shape


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
    assert v.supports((1, 32, 8, 128, 6144, 6144, 6144, 4096), "bf16") is None
    assert "KV rows" in v.supports((3, 5, 1, 64, 448, 448, 448, 320), "bf16")  # 128-byte rows


# ------------------------------------------------------------------------------------------ reference
def _small_inputs(dims, dtype="fp16", seed=0):
    return get_op(OP).make_inputs(dims, dtype, torch.Generator().manual_seed(seed), device="cpu")


@pytest.mark.parametrize("neox", [1, 0])
@pytest.mark.parametrize("dims", [(4, 4, 2, 64, 512, 512, 512, 256), (3, 2, 1, 128, 512, 640, 256, 256)])
def test_reference_is_qknorm_then_rope_store(dims, neox):
    """fp64: qknorm's reference (in place on q, k), then rope_store's reference on its outputs; q's heads so are
    q_out ([tokens, q_out_stride]), q itself an input."""
    spec, qkn, rs = get_op(OP), get_op("qknorm"), get_op("rope_store")
    t, hq, hk, d, qs, ks, vs, qos = dims
    inp = _small_inputs(dims, seed=neox)
    assert inp["q_out"].shape == (t, qos)
    d64 = {n: x.double() for n, x in inp.items()}
    scal = {"is_neox": neox, "eps": 1e-6}
    ref = spec.reference(d64, dims, scal)
    normed = qkn.reference({n: d64[n] for n in ("q", "k", "q_weight", "k_weight")}, dims[:6], {"eps": 1e-6})
    chained = rs.reference({**{n: d64[n] for n in ("v", "k_cache", "v_cache", "cos_sin_cache", "positions",
                                                     "out_loc")}, "q": normed["q"], "k": normed["k"]},
                           dims[:7], {"is_neox": neox})
    assert sorted(ref) == ["k", "k_cache", "q_out", "v_cache"]
    assert ref["q_out"].shape == (t, qos)
    assert torch.allclose(ref["q_out"], chained["q"][:, : hq * d], rtol=0, atol=1e-12)
    for name in ("k", "k_cache", "v_cache"):
        assert torch.allclose(ref[name], chained[name], rtol=0, atol=1e-12), name
    # the columns past the heads are untouched; the cache holds the rotated k and v at each slot only
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
    dims = (3, 4, 2, 64, 512, 512, 512, 256)
    inp = _small_inputs(dims)
    d64 = {n: x.double() for n, x in inp.items()}
    scal = {"is_neox": 1, "eps": 1e-6}
    rows = spec.reference(d64, dims, scal)
    views = {**d64, "q": d64["q"][:, :256].reshape(3, 4, 64), "q_out": d64["q_out"].reshape(3, 4, 64),
             "k": d64["k"][:, :128].reshape(3, 2, 64), "v": d64["v"][:, :128].reshape(3, 2, 64)}
    got = spec.reference(views, dims, scal)
    assert got["q_out"].shape == (3, 4, 64) and got["k"].shape == (3, 2, 64)
    assert torch.allclose(got["q_out"].reshape(3, -1), rows["q_out"], atol=1e-12)
    # inputs only (harness/oracle.py reference_walk): q's heads' shape
    no_out = {n: x for n, x in views.items() if n != "q_out"}
    assert spec.reference(no_out, dims, scal)["q_out"].shape == (3, 4, 64)
    assert torch.allclose(got["k"].reshape(3, -1), rows["k"][:, :128], atol=1e-12)
    assert torch.allclose(got["k_cache"], rows["k_cache"], atol=1e-12)
    assert torch.allclose(got["v_cache"], rows["v_cache"], atol=1e-12)


def test_rope_after_the_norm_keeps_each_head_s_norm():
    """A rotation keeps the 2-norm of every head: after the fused op a head's norm is that of the normed, weighted
    head (independent of rope), for NeoX and GPT-J alike."""
    spec = get_op(OP)
    dims = (5, 3, 1, 128, 640, 640, 640, 384)
    inp = _small_inputs(dims, "bf16", seed=4)
    d64 = {n: x.double() for n, x in inp.items()}
    for neox in (1, 0):
        out = spec.reference(d64, dims, {"is_neox": neox, "eps": 1e-6})["q_out"].reshape(5, 3, 128)
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
    dims = {s.dims[:7] for s in spec.corpus}
    assert {s.dims for s in rs.corpus} <= dims
    # the dense rows: qknorm_rope's shapes with v's block after k
    assert {(t, hq, hk, d, qs, qs, qs) for t, hq, hk, d, qs, ks in (s.dims[:6] for s in qr.corpus)} <= dims
    # q_out contiguous everywhere (the harness poisons all of it): the patch's own buffer
    assert all(s.dims[7] == s.dims[1] * s.dims[3] for s in spec.corpus + spec.edge_shapes)
    tags = {t for s in spec.corpus for t in s.tags}
    assert {"decode", "prefill"} <= tags
    assert {s.dims[0] for s in spec.corpus} >= {1, 16, 64, 256, 1024, 16384}
    # qwen3-32b's per-rank heads are those of a Qwen3-MoE row (deduplicated)
    assert {s.source.split(" tp")[0] for s in spec.corpus} == {"qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-8b"}
    for s in spec.corpus:
        assert spec.variant("jit_dense").supports(s.dims, "bf16") is None, s.dims
    v = spec.variant("jit")
    for s in list(spec.corpus) + list(spec.edge_shapes):
        t, hq, hk, d, qs, ks, vs, qos = s.dims
        assert d in (64, 128, 256) and hq >= 1 and hk >= 1
        assert qs >= hq * d and ks >= hk * d and vs >= hk * d
        if "edge" not in s.tags:
            assert qs == ks == vs == (hq + 2 * hk) * d and d == 128  # column blocks of the qkv output
        for dt in spec.dtypes:
            assert v.supports(s.dims, dt) is None, (s.dims, dt)
        # rope_store's bytes (q read, q_out written: q's bytes in place) plus the two weight vectors
        assert spec.bytes_moved(s.dims, "bf16") == rs.bytes_moved(s.dims[:7], "bf16") + 2 * d * 2
    edge = {s.dims for s in spec.edge_shapes}
    assert (5, 8, 2, 128, 1536, 1536, 1536, 1024) in edge  # GPT-J
    assert {s.dims[3] for s in spec.edge_shapes} == {64, 128, 256}
    assert any(s.dims[4:7] == (1024, 256, 256) for s in spec.edge_shapes)  # separate contiguous q, k, v
    assert (1, 1, 1, 128, 384, 384, 384, 128) in edge
    assert v.supports((1, 8, 1, 96, 1280, 1280, 1280, 768), "bf16") is not None
    assert "q_out" in v.supports((3, 8, 2, 128, 1536, 1536, 1536, 1000), "bf16")  # q_out rows shorter than q's heads
    assert v.supports((3, 8, 2, 128, 1536, 1536, 1536, 1536), "bf16") is None     # q_out = q's layout: in place
    assert "dims" in v.supports((3, 8, 2, 128, 1536, 1536, 1536), "bf16")         # the old seven


def test_model_dims_from_a_config():
    spec = op_part(OP, "spec")
    cfg = {"num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 2048}
    assert spec.model_dims(cfg, 16, 2) == (16, 16, 2, 128, 2560, 2560, 2560, 2048)


# ------------------------------------------------------------------------------------------ kernel source
def test_shipped_kernel_passes_the_static_checks_and_declares_the_abi():
    from astra_sglang.static_checks import scan_file

    src = shipped_kernel(OP)
    assert scan_file(src) == []
    assert scan_file(src.parent / "launch_jit.cu.in") == []
    assert scan_file(src.parent / "launch_jit_dense.cu.in") == []
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


# ---------------------------------------------------------------- q_out: the attention's q in its own buffer
from q_out_self_check import torch_qknorm as _norm, torch_rope as _rotate  # noqa: E402 (this section's stand-ins)
SPEC = get_op(OP)
HQ, HK, D, SLOTS = 4, 2, 64, 16
BF16 = torch.bfloat16
EPS = 1e-6


@pytest.fixture
def stub_sglang(monkeypatch):
    """Stand-ins for the SGLang names the adapter's expand and sequence reach at both sites: the JIT q/k norm, the
    fused rope + store (MoE), the JIT rope and store_cache (dense), sglang.srt.models.utils (a bf16 pool of SLOTS
    rows, the fused store on, no runtime config published). -> (the calls made, the pool)."""
    calls = []
    pool = types.SimpleNamespace(k=torch.zeros(SLOTS, HK * D, dtype=BF16), v=torch.zeros(SLOTS, HK * D, dtype=BF16))

    def qknorm(q, k, q_weight, k_weight, eps, head_dim):
        calls.append(("norm", q.data_ptr(), tuple(q.stride())))
        q.copy_(_norm(q, q_weight, eps))
        k.copy_(_norm(k, k_weight, eps))

    def rope(q, k, cos_sin_cache, positions, is_neox):
        calls.append(("rope", q.data_ptr(), tuple(q.stride())))
        q.copy_(_rotate(q, cos_sin_cache, positions, is_neox))
        k.copy_(_rotate(k, cos_sin_cache, positions, is_neox))

    def rope_store(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
        calls.append(("rope_store", q.data_ptr(), tuple(q.stride())))
        rope(q, k, cos_sin_cache, positions, is_neox)
        calls.pop()
        t = k.shape[0]
        k_cache.index_copy_(0, out_loc, k.reshape(t, -1))
        v_cache.index_copy_(0, out_loc, v.reshape(t, -1))

    def store_cache(k, v, kc, vc, loc, reserved_skip_index=-1):
        calls.append(("store", tuple(k.shape)))
        kc.index_copy_(0, loc, k)
        vc.index_copy_(0, loc, v)

    def create_arg(value, layer, forward_batch):
        return types.SimpleNamespace(k_buffer=pool.k, v_buffer=pool.v, cache_loc=forward_batch.out_cache_loc)

    def get_exec():
        raise ValueError("no runtime config outside a server")

    mods = {n: types.ModuleType(n) for n in (
        "sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
        "sglang.kernels.ops.attention.rope", "sglang.kernels.ops.kvcache", "sglang.kernels.ops.kvcache.kvcache",
        "sglang.kernels.ops.layernorm", "sglang.kernels.ops.layernorm.norm", "sglang.srt", "sglang.srt.models",
        "sglang.srt.models.utils")}
    mods["sglang.kernels.ops.layernorm.norm"].fused_inplace_qknorm = qknorm
    mods["sglang.kernels.ops.attention.rope"].apply_rope_with_cos_sin_cache_inplace = rope
    mods["sglang.kernels.ops.attention.rope"].apply_rope_inplace_with_kvcache = rope_store
    mods["sglang.kernels.ops.kvcache.kvcache"].store_cache = store_cache
    utils = mods["sglang.srt.models.utils"]
    utils.create_fused_set_kv_buffer_arg = create_arg
    utils.enable_fused_set_kv_buffer = lambda fb: True
    utils.get_exec = get_exec
    mods["sglang.srt.models"].utils = utils
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return calls, pool


def _layer(site: str, t=5, seed=0):
    """A Qwen3 attention stand-in expand accepts on the CPU (its norm, rope and pool checks stubbed by the caller),
    and the arguments to call the site's method with: MoE apply_qk_norm_rope(self, qkv, positions, forward_batch),
    dense forward(self, positions, hidden_states, forward_batch), whose qkv_proj returns a fixed output."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (HQ + 2 * HK) * D, generator=g).to(BF16)
    cache = op_part("rope_store", "spec").qkv.cos_sin_cache(D, 64, "cpu")
    rope = types.SimpleNamespace(cos_sin_cache=cache, is_neox_style=True)
    norms = [types.SimpleNamespace(weight=(1 + 0.25 * torch.randn(D, generator=g)).to(BF16), variance_epsilon=EPS)
             for _ in range(2)]
    layer = types.SimpleNamespace(head_dim=D, num_heads=HQ, num_kv_heads=HK, q_size=HQ * D, kv_size=HK * D,
                                  rotary_emb=rope, q_norm=norms[0], k_norm=norms[1], qkv_proj=lambda h: (qkv, None),
                                  attn=types.SimpleNamespace(k_scale=None, v_scale=None, layer_id=0),
                                  compatible_with_fused_kv_buffer=True, _used_fused_qk_norm_rope_last_call=None)
    fb = types.SimpleNamespace(out_cache_loc=torch.randperm(SLOTS, generator=g)[:t])
    args = {"self": layer, "positions": torch.randint(0, 64, (t,), generator=g), "forward_batch": fb}
    if site == "moe":
        args["qkv"] = qkv
    else:
        args["hidden_states"] = torch.zeros(t, 8, dtype=BF16)
    return layer, qkv, args


def _cpu_adapter(monkeypatch, q_out: bool):
    mod = op_part(OP, "adapter")
    monkeypatch.setattr(mod, "DEVICES", ("cpu",))
    monkeypatch.setattr(mod, "Q_OUT", q_out)
    monkeypatch.setattr(mod, "_dense_store_path", lambda attn, fb: None)  # the pool checks: tests/test_patch_fused.py
    monkeypatch.setattr(mod, "_qknorm_path", lambda attn, d, dtype: None)
    monkeypatch.setattr(mod, "_rope_path", lambda rope: None)
    return mod


def _want(c, site: str, t=5):
    """The canonical dict c with its own copies of qkv and the pool: SGLang's sequence on them gives the expected
    result without touching c's."""
    qkv = c["qkv"].clone()
    w = {**c, "qkv": qkv, "q": qkv[:, : HQ * D].view(t, HQ, D), "k": qkv[:, HQ * D:(HQ + HK) * D].view(t, HK, D),
         "v": qkv[:, (HQ + HK) * D:], "k_cache": c["k_cache"].clone(), "v_cache": c["v_cache"].clone(),
         "site": site}
    if c["q_out"] is c["q"]:
        w["q_out"] = w["q"]
    else:
        w["q_out"] = torch.empty_like(c["q_out"])
    return w


@pytest.mark.parametrize("site", ["moe", "dense"])
@pytest.mark.parametrize("q_out", [True, False])
def test_expand_gives_q_its_own_contiguous_buffer_unless_switched_off(site, q_out, monkeypatch, stub_sglang):
    """ASTRA_QKRS_Q_OUT on (default): q_out is a fresh contiguous [t, hq, d] apart from qkv (q_out_stride hq * d);
    off: q_out is q's own view of qkv (q_out_stride = q_stride, in place), the A/B's arm A. Both call sites."""
    mod = _cpu_adapter(monkeypatch, q_out)
    layer, qkv, args = _layer(site)
    canon = mod.ADAPTER.expand(args)
    assert not isinstance(canon, str), canon
    assert canon.get("site", "moe") == site
    q = canon["q"]
    assert q.shape == (5, HQ, D) and q.data_ptr() == qkv.data_ptr() and q.stride(0) == (HQ + 2 * HK) * D
    views, dims = mod.ADAPTER.normalize(canon)
    assert dims[:7] == (5, HQ, HK, D, 512, 512, 512) and views["q_out"] is canon["q_out"]
    assert views["site"] == site
    if q_out:
        qo = canon["q_out"]
        assert qo.shape == (5, HQ, D) and qo.is_contiguous() and qo.dtype == qkv.dtype and dims[7] == HQ * D
        assert qo.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    else:
        assert canon["q_out"] is q and dims[7] == 512
    assert SPEC.variant("jit" if site == "moe" else "jit_dense").supports(dims, "bf16") is None


def test_normalize_declines_a_q_out_that_overlaps_q_otherwise(monkeypatch, stub_sglang):
    """The kernel's warp reads a head row whole before writing it: q_out may be q itself or apart from it."""
    mod = _cpu_adapter(monkeypatch, True)
    layer, qkv, args = _layer("moe")
    base = mod.ADAPTER.expand(args)
    shifted = qkv[:, D: D + HQ * D].view(5, HQ, D)                      # one head over: overlaps, not q
    assert "overlaps" in mod.ADAPTER.normalize({**base, "q_out": shifted})
    assert "shape" in mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, 2, 2 * D, dtype=BF16)})
    assert "strides" in mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, D, HQ, dtype=BF16).transpose(1, 2)})
    assert "not [tokens" in mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, HQ * D, dtype=BF16)})
    assert mod.ADAPTER.normalize({**base, "q_out": base["q"]})[1][7] == 512     # q itself: in place
    assert mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, HQ, D, dtype=BF16)})[1][7] == HQ * D
    from astra_sglang.patch.adapters import q_out_stride  # the check the other q_out ops share

    assert mod.q_out_stride is q_out_stride


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_the_q_out_switch_is_read_from_the_environment_when_the_adapter_is_imported(value, on):
    assert adapter_attr_under_env(OP, "Q_OUT", "ASTRA_QKRS_Q_OUT", value) == str(on)


def test_the_moe_site_returns_q_out_as_the_method_s_q():
    """apply_qk_norm_rope's result: q_out as q, contiguous [tokens, q_size] (its caller, forward_prepare_native, hands
    q, k, v to forward_core, whose self.attn(q, k, v, ...) goes to fa3, which copies a strided q), k and v column
    views of qkv, and the flag that tells forward_core the KV is stored. q_out = q (ASTRA_QKRS_Q_OUT=0) or none: q's
    column view, as SGLang returns it."""
    returns = op_part(OP, "adapter").ADAPTER.returns
    qkv = torch.randn(2, HQ * D + 2 * HK * D)
    q_out = torch.randn(2, HQ * D)
    layer = types.SimpleNamespace(_used_fused_qk_norm_rope_last_call=None)
    c = {"layer": layer, "qkv": qkv, "sizes": [HQ * D, HK * D, HK * D], "q": qkv[:, : HQ * D].view(2, HQ, D),
         "q_out": q_out.view(2, HQ, D)}
    q, k, v = returns(c)
    assert layer._used_fused_qk_norm_rope_last_call is False
    assert q.data_ptr() == q_out.data_ptr() and q.shape == (2, HQ * D) and q.is_contiguous()
    assert k.data_ptr() == qkv[:, HQ * D:].data_ptr() and k.shape == (2, HK * D) and v.shape == (2, HK * D)
    for cc in ({**c, "q_out": c["q"]}, {n: x for n, x in c.items() if n != "q_out"}):
        q, k, v = returns(cc)
        assert q.data_ptr() == qkv.data_ptr() and q.shape == (2, HQ * D) and q.stride() == (qkv.shape[1], 1)


def test_the_dense_site_attends_on_q_out_without_its_store_then_o_proj():
    """Dense Qwen3Attention.forward's rest: the attention on q_out ([tokens, q_size], contiguous), k and v column views,
    save_kv_cache=False (the kernel stored the KV), then o_proj; q_out = q: q's column view."""
    seen = {}
    qkv = torch.randn(2, HQ * D + 2 * HK * D)
    q_out = torch.randn(2, HQ * D)

    def attention(q, k, v, forward_batch, save_kv_cache=True):
        seen.update(q=q, k=k, fb=forward_batch, save=save_kv_cache)
        return q

    layer = types.SimpleNamespace(attn=attention, o_proj=lambda x: (x * 2, None))
    returns = op_part(OP, "adapter").ADAPTER.returns
    c = {"site": "dense", "layer": layer, "qkv": qkv, "sizes": [HQ * D, HK * D, HK * D], "forward_batch": "fb",
         "q": qkv[:, : HQ * D].view(2, HQ, D), "q_out": q_out.view(2, HQ, D)}
    out = returns(c)
    assert seen["fb"] == "fb" and seen["save"] is False
    assert seen["q"].data_ptr() == q_out.data_ptr() and seen["q"].shape == (2, HQ * D) and seen["q"].is_contiguous()
    assert seen["k"].data_ptr() == qkv[:, HQ * D:].data_ptr()
    assert torch.equal(out, q_out * 2)
    out = returns({**c, "q_out": c["q"]})
    assert seen["q"].data_ptr() == qkv.data_ptr() and torch.equal(out, qkv[:, : HQ * D] * 2)


@pytest.mark.parametrize("site", ["moe", "dense"])
@pytest.mark.parametrize("q_out", [True, False])
def test_sequence_norms_and_rotates_q_into_q_out_and_leaves_q(site, q_out, monkeypatch, stub_sglang):
    """SGLang's sequence (the self-check's expected result and the fallback): q's rows copied into q_out, normed and
    rotated there (MoE: the norm, then the fused rope + store; dense: the norm, the rope, then the store), q as it
    was; k normed and rotated in place and stored with v. q_out = q: all in place on q, as before q_out."""
    calls, pool = stub_sglang
    mod = _cpu_adapter(monkeypatch, q_out)
    layer, qkv, args = _layer(site)
    before = qkv.clone()
    c = mod.ADAPTER.expand(args)
    cache, pos, loc = c["cos_sin_cache"], c["positions"], c["out_loc"]
    want_q = _rotate(_norm(before[:, : HQ * D].view(5, HQ, D), layer.q_norm.weight, EPS), cache, pos, True)
    want_k = _rotate(_norm(before[:, HQ * D: (HQ + HK) * D].view(5, HK, D), layer.k_norm.weight, EPS), cache, pos,
                     True)
    mod.ADAPTER.sequence(c)
    assert [x[0] for x in calls] == (["norm", "rope_store"] if site == "moe" else ["norm", "rope", "store"])
    assert torch.equal(c["k"], want_k) and torch.equal(pool.k[loc], want_k.reshape(5, -1))
    assert torch.equal(pool.v[loc], before[:, (HQ + HK) * D:])
    where = c["q_out"].data_ptr() if q_out else qkv.data_ptr()
    assert calls[0][1] == calls[1][1] == where  # the norm and the rope ran on q_out (switch off: q)
    assert torch.equal(c["q_out"], want_q)
    if q_out:
        assert torch.equal(qkv[:, : HQ * D], before[:, : HQ * D])


@pytest.mark.parametrize("site", ["moe", "dense"])
@pytest.mark.parametrize("kernel_ok", [True, False])
def test_the_self_check_never_writes_q_when_q_out_is_separate(site, kernel_ok, monkeypatch, stub_sglang, tmp_path):
    """The patch's first call of a shape class, on the CPU (a torch stand-in for the kernel, SGLang's sequence
    stubbed): q is an input, untouched whether the self-check passes or fails; on a failure k and the cache rows are
    restored and SGLang's sequence reruns on the real q, so q_out, k and the caches are SGLang's and the op
    disables."""
    from q_out_self_check import run_self_check

    calls, pool = stub_sglang
    mod = _cpu_adapter(monkeypatch, True)
    layer, qkv, args = _layer(site)
    before = qkv.clone()
    canon = mod.ADAPTER.expand(args)
    want = _want(canon, site)  # SGLang's sequence on copies of the same qkv and pool
    mod.ADAPTER.sequence(want)

    st = run_self_check(SPEC, mod.ADAPTER, canon, tmp_path, kernel_ok, written=("q_out", "k", "k_cache", "v_cache"))
    assert torch.equal(qkv[:, : HQ * D], before[:, : HQ * D])            # q: never written
    assert torch.equal(qkv[:, (HQ + HK) * D:], before[:, (HQ + HK) * D:])  # v: never written
    assert st.last_check is not None and st.last_check.ok == kernel_ok
    if kernel_ok:
        assert not st.disabled
        assert (canon["q_out"].double() - want["q_out"].double()).abs().max() < 0.1
    else:
        assert st.disabled and "self-check mismatch" in st.disabled
        assert torch.equal(canon["q_out"], want["q_out"]) and torch.equal(qkv[:, HQ * D:], want["qkv"][:, HQ * D:])
        assert torch.equal(pool.k, want["k_cache"]) and torch.equal(pool.v, want["v_cache"])


@pytest.mark.parametrize("site", ["moe", "dense"])
def test_validate_s_layer_driver_unpacks_the_eight_dims_and_reports_q_out(site, monkeypatch, stub_sglang):
    """layer.py (validate) on stand-ins for SGLang's Qwen3MoeAttention / Qwen3Attention, norms, rope and forward
    context: the op's eight dims unpack (gemma_qknorm_rope's layer had refused every case when its dims gained
    q_out_stride), and the q the attention gets is reported as q_out, k and the caches as stored; the row buffer's q is
    the input, unchanged. SGLang's own layers run only on a GPU validate."""
    from contextlib import nullcontext

    layer_mod = op_part(OP, "layer")
    spec_mod = op_part(OP, "spec")
    monkeypatch.setattr(spec_mod, "MAX_POSITION", 64)
    monkeypatch.setattr(spec_mod, "cache_slots", lambda t: max(32, 2 * t))
    dims = (3, HQ, HK, D, 512, 512, 512, HQ * D)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(4), "normal", device="cpu")
    q_before, kc_before = inp["q"].clone(), inp["k_cache"].clone()
    pos, loc, cache = inp["positions"], inp["out_loc"], inp["cos_sin_cache"]

    def norm_rope(self, qkv, positions):  # the q/k norm then the rope, in place on qkv's column views
        t = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        for x, n, h in ((q, self.q_norm, self.num_heads), (k, self.k_norm, self.num_kv_heads)):
            xv = x.view(t, h, self.head_dim)
            xv.copy_(_rotate(_norm(xv, n.weight, n.variance_epsilon), self.rotary_emb.cos_sin_cache, positions,
                             self.rotary_emb.is_neox_style))
        return q, k, v

    class Qwen3MoeAttention:  # apply_qk_norm_rope's non-fused branch, its fused store into the op's caches
        def apply_qk_norm_rope(self, qkv, positions, forward_batch):
            q, k, v = norm_rope(self, qkv, positions)
            inp["k_cache"][forward_batch.out_cache_loc] = k
            inp["v_cache"][forward_batch.out_cache_loc] = v
            self._used_fused_qk_norm_rope_last_call = False
            return q, k, v

    class Qwen3Attention:  # forward: prepare (GEMM, norm, rope), the attention (which stores the KV), o_proj
        def forward_prepare_native(self, positions, hidden_states):
            return norm_rope(self, self.qkv_proj(hidden_states)[0], positions)

        def forward(self, positions, hidden_states, forward_batch):
            q, k, v = self.forward_prepare_native(positions=positions, hidden_states=hidden_states)
            out, _ = self.o_proj(self.attn(q, k, v, forward_batch, save_kv_cache=True))
            return out

    for name, cls in (("qwen3_moe", Qwen3MoeAttention), ("qwen3", Qwen3Attention)):
        m = types.ModuleType(f"sglang.srt.models.{name}")
        setattr(m, cls.__name__, cls)
        monkeypatch.setitem(sys.modules, m.__name__, m)
    fc = types.ModuleType("sglang.srt.model_executor.forward_context")
    fc.forward_context = lambda ctx: nullcontext()
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor", types.ModuleType("sglang.srt.model_executor"))
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.forward_context", fc)
    monkeypatch.setattr(layer_mod, "qk_norms_and_rope", lambda inp, d, eps, neox: (
        types.SimpleNamespace(weight=inp["q_weight"], variance_epsilon=eps),
        types.SimpleNamespace(weight=inp["k_weight"], variance_epsilon=eps),
        types.SimpleNamespace(cos_sin_cache=inp["cos_sin_cache"], is_neox_style=neox)))
    monkeypatch.setattr(layer_mod, "kv_pool_context", lambda inp, hk, d: None)
    monkeypatch.setattr(layer_mod, "server_defaults", nullcontext)
    monkeypatch.setattr(layer_mod, "DENSE_HEADS", {(HQ, HK, D)} if site == "dense" else set())

    out = layer_mod.run_layer(inp, dims, SPEC.scalars(dims))
    assert set(out) == {"q_out", "k", "k_cache", "v_cache"}
    want_q = _rotate(_norm(q_before[:, : HQ * D].view(3, HQ, D), inp["q_weight"], EPS), cache, pos, True)
    assert torch.equal(out["q_out"], want_q.reshape(3, -1)) and torch.equal(inp["q"], q_before)
    want_k = out["k"][:, : HK * D]
    assert torch.equal(out["k_cache"][loc], want_k)
    others = torch.ones(kc_before.shape[0], dtype=torch.bool)
    others[loc] = False
    assert torch.equal(out["k_cache"][others], kc_before[others])
    assert torch.equal(out["v_cache"][loc], inp["v"][:, : HK * D])
    with pytest.raises(ValueError, match="bf16 KV cache"):
        layer_mod.run_layer(SPEC.make_inputs(dims, "fp16", torch.Generator().manual_seed(4), device="cpu"), dims, {})


@pytest.mark.nvcc
def test_kernel_builds_for_sm90_and_exports_the_symbol(tmp_path):
    if not _has_nvcc():
        pytest.skip("needs nvcc")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    lib = tmp_path / "k.so"
    r = subprocess.run([nvcc, "-arch=sm_90", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                        str(shipped_kernel(OP)), "-o", str(lib)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert " T astra_qknorm_rope_store" in syms


@pytest.mark.gpu
@pytest.mark.nvcc
def test_kernel_writes_q_out_as_it_wrote_q_in_place(tmp_path, monkeypatch):
    """A GPU: q_out apart and q_out = q (ASTRA_QKRS_Q_OUT=0) write the same q bit for bit, q untouched, k and the
    caches equal (tests/q_out_self_check.py); every edge shape, a decode row of each site's models, a prefill row."""
    from q_out_self_check import assert_q_out_is_q_in_place

    rows = [(2, 32, 4, 128, 5120, 5120, 5120, 4096), (2, 32, 8, 128, 6144, 6144, 6144, 4096),
            (300, 16, 1, 128, 2304, 2304, 2304, 2048)]
    assert_q_out_is_q_in_place(SPEC, tmp_path, monkeypatch, rows, same=("k", "k_cache", "v_cache"))


def test_rope_path_takes_the_plain_rotary_embedding_only(monkeypatch):
    """_rope_path (shared by qknorm_rope, qknorm_rope_store and dense_rope_store) takes SGLang's RotaryEmbedding as
    forward_cuda runs it, and declines a subclass with its own forward_cuda, the fallback kernel, a partial rotary, and
    0.5.23's `_force_native` (an RL on-policy target pins the native rope: SGLang would not run the kernel)."""
    class RotaryEmbedding:
        head_size = rotary_dim = 128

        def forward_cuda(self):
            pass

    class Own(RotaryEmbedding):
        def forward_cuda(self):
            pass

    monkeypatch.setitem(sys.modules, "sglang.srt.layers.rotary_embedding.base",
                        types.SimpleNamespace(RotaryEmbedding=RotaryEmbedding))
    path = op_part(OP, "adapter")._rope_path
    assert path(RotaryEmbedding()) is None
    for change, why in ((lambda r: setattr(r, "_force_native", True), "native path"),
                        (lambda r: setattr(r, "use_fallback_kernel", True), "fallback kernel"),
                        (lambda r: setattr(r, "rotary_dim", 64), "partial rotary")):
        r = RotaryEmbedding()
        change(r)
        assert why in path(r)
    assert "own forward_cuda" in path(Own())


@pytest.mark.wheels
def test_0_5_23_pins_the_native_rope_by_force_native(request):
    """The attribute _rope_path reads, in 0.5.23's RotaryEmbedding: set from the RL on-policy target, and then
    _forward_method is forward_native."""
    from sglang_source import _sglang_root

    src = (_sglang_root("0.5.23", request) / "srt/layers/rotary_embedding/base.py").read_text()
    assert "self._force_native = (" in src and "rl_on_policy_target is not None" in src
    assert "if self._force_native or _is_musa:\n            self._forward_method = self.forward_native" in src
