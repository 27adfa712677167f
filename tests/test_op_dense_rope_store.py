"""dense_rope_store (kernels/dense_rope_store/): the FUSED rope + KV store of dense attention (Llama, Gemma-2, Qwen2,
Qwen2-MoE, Mixtral), where SGLang runs its rope kernel and then the attention backend's KV store. q goes into its own
contiguous q_out (ASTRA_DRS_Q_OUT=0: in place, for a step A/B). On CPU: the spec is rope_store's computation (q's
result as q_out) under its own name and production; the corpus is its models' and every row fits the store's
launcher; the harness runs the edge shapes on CPU; the adapter binds the attentions' forward and discovery finds them
in real SGLang, whose bodies are one sequence; expand, normalize, the sequence, returns and the self-check with q_out
separate and in place; validate's layer driver on stand-ins; the kernel and the production launcher (SGLang's two JIT
kernels back to back, extracted from sglang 0.5.17 and 0.5.23) build with nvcc.

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

OP = "dense_rope_store"


SIGNATURE = (
    'extern "C" cudaError_t astra_dense_rope_store(const void* q, void* q_out, void* k, const void* v, '
    "void* k_cache, void* v_cache, const void* cos_sin_cache, const void* positions, const void* out_loc, "
    "int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride, "
    "int64_t k_stride, int64_t v_stride, int64_t q_out_stride, int64_t is_neox, int dtype, cudaStream_t stream)")


def test_spec_is_rope_store_s_computation_with_its_own_production():
    spec, rs = get_op(OP), get_op("rope_store")
    assert spec.symbol == "astra_dense_rope_store"
    assert spec.c_signature() == SIGNATURE
    # rope_store's ABI but for q: an input, its result in q_out (an output); q_out_stride the last dim
    ours = [(a.name, a.role, a.ctype) for a in spec.abi]
    theirs = [(a.name, a.role, a.ctype) for a in rs.abi]
    assert theirs[0] == ("q", "inout", "ptr")
    vs = theirs.index(("v_stride", "", "i64")) + 1
    assert ours == ([("q", "in", "ptr"), ("q_out", "out", "ptr")] + theirs[1:vs] + [("q_out_stride", "", "i64")]
                    + theirs[vs:])
    assert spec.dim_names == rs.dim_names + ("q_out_stride",)
    for name in ("kernel.cu", "launch_jit.cu.in"):  # both definitions' parameters are the spec's, in order
        src = " ".join((shipped_kernel(OP).parent / name).read_text().split())
        assert SIGNATURE.split(" ", 2)[2] in src, name
    assert spec.replaces == ("sglang.srt.models.llama:LlamaAttention.forward",
                             "sglang.srt.models.gemma2:Gemma2Attention.forward",
                             "sglang.srt.models.gemma:GemmaAttention.forward",
                             "sglang.srt.models.qwen2:Qwen2Attention.forward",
                             "sglang.srt.models.qwen2_moe:Qwen2MoeAttention.forward",
                             "sglang.srt.models.mixtral:MixtralAttention.forward")
    assert spec.fused_member_sets() == (("rope", "kv_store"),)
    assert spec.kernel_symbols == (r"astra_drs::",)
    v = spec.variant("jit")
    assert [s.path for s in v.sources] == ["csrc/elementwise/rope.cuh", "csrc/elementwise/kvcache.cuh"]
    assert v.source_facts == (get_op("rope").variant("jit").source_facts
                              + get_op("kv_store").variant("jit").source_facts)
    assert "FUSED" in spec.summary and "sum" in spec.summary


def test_corpus_is_the_replaced_attentions_models_and_every_shape_fits_the_store():
    spec = get_op(OP)
    assert {s.source.split(" tp")[0] for s in spec.corpus} == {"llama-3-8b", "llama-3-70b", "gemma-2-2b", "gemma-2-9b",
                                                                "gemma-2-27b", "gemma-2b", "gemma-7b", "qwen2.5-7b"}
    assert any("mixtral-8x7b tp2" in s.source for s in spec.corpus)  # Llama-3-8B's TP-2 rows, the same heads
    assert (1, 28, 4, 128, 4608, 4608, 4608, 3584) in {s.dims for s in spec.corpus}  # qwen2.5-7b, one decode token
    assert (1, 16, 8, 256, 8192, 8192, 8192, 4096) in {s.dims for s in spec.corpus}  # gemma-2-9b: head_dim 256
    assert {s.dims[0] for s in spec.corpus} >= {1, 16, 64, 256, 1024, 16384}
    assert (1, 32, 8, 128, 6144, 6144, 6144, 4096) in {s.dims for s in spec.corpus}  # llama-3-8b, one decode token
    # q_out contiguous everywhere (the harness poisons all of it): the patch's own buffer
    assert all(s.dims[7] == s.dims[1] * s.dims[3] for s in spec.corpus + spec.edge_shapes)
    # rope_store's edge shapes the store takes, each with its contiguous q_out; the GPT-J one stays GPT-J
    rs = get_op("rope_store")
    assert [s.dims[:7] for s in spec.edge_shapes] == [s.dims for s in rs.edge_shapes
                                                       if s.dims in {e.dims[:7] for e in spec.edge_shapes}]
    assert [spec.scalars(s.dims) for s in spec.edge_shapes] == [rs.scalars(s.dims[:7]) for s in spec.edge_shapes]
    assert {spec.scalars(s.dims)["is_neox"] for s in spec.edge_shapes} == {0, 1}
    v = spec.variant("jit")
    for s in list(spec.corpus) + list(spec.edge_shapes):
        for dt in spec.dtypes:
            assert v.supports(s.dims, dt) is None, (s.dims, dt)
    assert "KV rows" in v.supports((3, 5, 1, 64, 448, 448, 448, 320), "fp16")  # 128-byte rows: not a store width
    assert "q_out" in v.supports((3, 8, 2, 128, 1536, 1536, 1536, 1000), "bf16")  # q_out rows shorter than q's heads
    assert v.supports((3, 8, 2, 128, 1536, 1536, 1536, 1536), "bf16") is None     # q_out = q's layout: in place


def test_harness_runs_every_edge_shape_on_cpu(monkeypatch):
    from reference_harness import run_edge_cases_on_cpu

    rs = op_part("rope_store", "spec")
    monkeypatch.setattr(rs, "MAX_POSITION", 64)  # CPU-sized cos/sin cache and KV pool (make_inputs is rope_store's)
    monkeypatch.setattr(rs, "cache_slots", lambda t: max(32, 2 * t))
    run_edge_cases_on_cpu(get_op(OP))


def test_shipped_kernel_passes_the_static_checks_and_declares_the_abi():
    from astra_sglang.static_checks import scan_file

    src = shipped_kernel(OP)
    assert scan_file(src) == [] and scan_file(src.parent / "launch_jit.cu.in") == []
    text = src.read_text()
    assert "namespace astra_drs {" in text and "namespace {" in text and "#include \"" not in text
    assert get_op(OP).c_signature().split("(")[0] in text
    assert "griddepcontrol.wait" in text


def test_the_adapter_fits_the_spec_and_binds_llama_attention_forward():  # Gemma2Attention.forward: the same
    from astra_sglang.patch.adapters import Binder, adapter_mismatch, get_adapter

    def forward(self, positions, hidden_states, forward_batch):  # SGLang's LlamaAttention.forward
        raise AssertionError("not called")

    spec, ad = get_op(OP), get_adapter(OP)
    assert adapter_mismatch(spec, ad) is None and Binder(forward, ad, spec).ok
    assert ad.slot_indexed == {"k_cache": "out_loc", "v_cache": "out_loc"}
    assert not getattr(op_part(OP, "adapter"), "DEFAULT_OFF", "")  # on in --ops all


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_discovery_finds_every_replaced_attention_forward_in_real_sglang(version, request):
    from astra_sglang.patch.discover import discover_for_specs

    root = Path(request.getfixturevalue("sglang_0_5_17_source") if version == "0.5.17"
                else request.getfixturevalue("wheel_sources")["sglang"])
    disc = discover_for_specs([get_op(OP)], roots={"sglang": root / "sglang"})
    found = [(s.kind, s.module, s.local_name) for s in disc.for_op(OP)]
    for target in get_op(OP).replaces:
        module, name = target.split(":")
        assert ("definition", module, name) in found, target


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("target", [t for t in get_op(OP).replaces if "LlamaAttention" not in t])
def test_each_replaced_attention_forward_is_llama_s_sequence_over_the_attributes_the_adapter_reads(
        version, target, request):
    """The adapter replaces each forward with Llama's fused sequence (validate drives LlamaAttention.forward): every
    body must be qkv GEMM, split, rope, attention, o_proj, over the attributes the adapter reads, and the model must not
    be a hybrid-SWA one (its pool is then the plain MHA pool the fused store writes; Gemma-2's sliding window is the
    attention's)."""
    import ast

    root = Path(request.getfixturevalue("sglang_0_5_17_source") if version == "0.5.17"
                else request.getfixturevalue("wheel_sources")["sglang"]) / "sglang"
    module, name = target.split(":")
    cls = name.split(".")[0]
    path = root / (module.split(".", 1)[1].replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    f = next(n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert [a.arg for a in f.args.args] == ["self", "positions", "hidden_states", "forward_batch"]
    assert [ast.unparse(n) for n in f.body] == [
        "qkv, _ = self.qkv_proj(hidden_states)",
        "q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)",
        "q, k = self.rotary_emb(positions, q, k)",
        "attn_output = self.attn(q, k, v, forward_batch)",
        "output, _ = self.o_proj(attn_output)",
        "return output"]
    init = next(n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stored = {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert {"num_heads", "num_kv_heads", "head_dim", "q_size", "kv_size", "qkv_proj", "rotary_emb", "attn",
            "o_proj"} <= stored
    text = path.read_text()
    assert "get_rope(" in text and "RadixAttention(" in text
    cfg = (root / "srt/configs/model_config.py").read_text()
    swa = cfg[cfg.index("def is_hybrid_swa_model"):]
    arch = {"Gemma2Attention": "Gemma2ForCausalLM", "GemmaAttention": "GemmaForCausalLM",
            "Qwen2Attention": "Qwen2ForCausalLM",
            "Qwen2MoeAttention": "Qwen2MoeForCausalLM", "MixtralAttention": "MixtralForCausalLM"}[cls]
    assert arch not in swa[:swa.index("\ndef ", 10)]


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_production_launcher_extracts_and_builds_both_headers_in_one_unit(version, request, tmp_path):
    """rope.cuh and kvcache.cuh in one translation unit: the rope kernel, then the store kernel of each version."""
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        pytest.skip("needs nvcc")
    from astra_sglang.build import Arch
    from astra_sglang.build.workspace import Workspace
    from astra_sglang.extract import discover, extract

    ws_src = request.getfixturevalue("wheel_sources")
    src = (Path(ws_src["sglang"]) if version == "0.5.23"
           else Path(request.getfixturevalue("sglang_0_5_17_source")))
    dest = tmp_path / OP
    extract(get_op(OP), discover(src, ws_src["flashinfer"], ws_src["tvm"]), dest, Arch(9, 0))
    ws = Workspace.open(OP, path=dest)
    assert ws.manifest["sources"]["sglang_jit"]["version"] == version
    kv = "store_kvcache_kernel" if version == "0.5.23" else "store_kvcache"
    assert f"#define ASTRA_KV_{kv} 1" in ws.baseline.read_text()
    res = ws.build()
    assert res.ok, res.log[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    assert get_op(OP).symbol in syms


# ---------------------------------------------------------------- q_out: the attention's q in its own buffer
from q_out_self_check import torch_rope as _rotate  # noqa: E402 (this section's stand-in)
SPEC = get_op(OP)
HQ, HK, D, SLOTS = 4, 2, 64, 16
BF16 = torch.bfloat16


@pytest.fixture
def stub_sglang(monkeypatch):
    """Stand-ins for the SGLang names the dense adapter's sequence and expand reach: the JIT rope (in place on its q
    and k), store_cache, create_fused_set_kv_buffer_arg (a bf16 pool of SLOTS rows). -> the calls made."""
    calls = []
    pool = types.SimpleNamespace(k=torch.zeros(SLOTS, HK * D, dtype=BF16), v=torch.zeros(SLOTS, HK * D, dtype=BF16))

    def rope(q, k, cos_sin_cache, positions, is_neox):
        calls.append(("rope", q.data_ptr(), tuple(q.stride())))
        q.copy_(_rotate(q, cos_sin_cache, positions, is_neox))
        k.copy_(_rotate(k, cos_sin_cache, positions, is_neox))

    def store_cache(k, v, kc, vc, loc, reserved_skip_index=-1):
        calls.append(("store", tuple(k.shape)))
        kc.index_copy_(0, loc, k)
        vc.index_copy_(0, loc, v)

    def create_arg(value, layer, forward_batch):
        return types.SimpleNamespace(k_buffer=pool.k, v_buffer=pool.v, cache_loc=forward_batch.out_cache_loc)

    mods = {n: types.ModuleType(n) for n in (
        "sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
        "sglang.kernels.ops.attention.rope", "sglang.kernels.ops.kvcache", "sglang.kernels.ops.kvcache.kvcache",
        "sglang.srt", "sglang.srt.models", "sglang.srt.models.utils")}
    mods["sglang.kernels.ops.attention.rope"].apply_rope_with_cos_sin_cache_inplace = rope
    mods["sglang.kernels.ops.kvcache.kvcache"].store_cache = store_cache
    mods["sglang.srt.models.utils"].create_fused_set_kv_buffer_arg = create_arg
    mods["sglang.srt.models"].utils = mods["sglang.srt.models.utils"]
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return calls, pool


def _dense_layer(t=5, seed=0):
    """An attention stand-in expand accepts on the CPU (its store and rope checks stubbed by the caller): a qkv_proj
    returning a fixed [t, (HQ + 2 HK) D] output; with the arguments to call forward with."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (HQ + 2 * HK) * D, generator=g).to(BF16)
    cache = op_part("rope_store", "spec").qkv.cos_sin_cache(D, 64, "cpu")
    rope = types.SimpleNamespace(cos_sin_cache=cache, is_neox_style=True)
    layer = types.SimpleNamespace(head_dim=D, num_heads=HQ, num_kv_heads=HK, q_size=HQ * D, kv_size=HK * D,
                                  rotary_emb=rope, qkv_proj=lambda h: (qkv, None),
                                  attn=types.SimpleNamespace(k_scale=None, v_scale=None, layer_id=0))
    fb = types.SimpleNamespace(out_cache_loc=torch.randperm(SLOTS, generator=g)[:t])
    args = {"self": layer, "positions": torch.randint(0, 64, (t,), generator=g),
            "hidden_states": torch.zeros(t, 8, dtype=BF16), "forward_batch": fb}
    return layer, qkv, args


def _cpu_adapter(monkeypatch, q_out: bool):
    mod = op_part(OP, "adapter")
    monkeypatch.setattr(mod, "DEVICES", ("cpu",))
    monkeypatch.setattr(mod, "Q_OUT", q_out)
    monkeypatch.setattr(mod, "_dense_store_path", lambda attn, fb: None)  # the pool checks: tests/test_patch_fused.py
    monkeypatch.setattr(mod, "_rope_path", lambda rope: None)
    return mod


@pytest.mark.parametrize("q_out", [True, False])
def test_expand_gives_q_its_own_contiguous_buffer_unless_switched_off(q_out, monkeypatch, stub_sglang):
    """ASTRA_DRS_Q_OUT on (default): q_out is a fresh contiguous [t, hq, d] apart from qkv (q_out_stride hq * d);
    off: q_out is q's own view of qkv (q_out_stride = q_stride, in place), the A/B's arm A."""
    mod = _cpu_adapter(monkeypatch, q_out)
    layer, qkv, args = _dense_layer()
    canon = mod.ADAPTER.expand(args)
    assert not isinstance(canon, str), canon
    q = canon["q"]
    assert q.shape == (5, HQ, D) and q.data_ptr() == qkv.data_ptr() and q.stride(0) == (HQ + 2 * HK) * D
    views, dims = mod.ADAPTER.normalize(canon)
    assert dims[:7] == (5, HQ, HK, D, 512, 512, 512) and views["q_out"] is canon["q_out"]
    if q_out:
        qo = canon["q_out"]
        assert qo.shape == (5, HQ, D) and qo.is_contiguous() and qo.dtype == qkv.dtype and dims[7] == HQ * D
        assert qo.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    else:
        assert canon["q_out"] is q and dims[7] == 512
    assert SPEC.variant("jit").supports(dims, "bf16") is None


def test_normalize_declines_a_q_out_that_overlaps_q_otherwise(monkeypatch, stub_sglang):
    """The kernel reads each q element before writing it, in one thread: q_out may be q itself or apart from it."""
    mod = _cpu_adapter(monkeypatch, True)
    layer, qkv, args = _dense_layer()
    base = mod.ADAPTER.expand(args)
    shifted = qkv[:, D: D + HQ * D].view(5, HQ, D)                      # one head over: overlaps, not q
    assert "overlaps" in mod.ADAPTER.normalize({**base, "q_out": shifted})
    assert "shape" in mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, 2, 2 * D, dtype=BF16)})
    assert "strides" in mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, D, HQ, dtype=BF16).transpose(1, 2)})
    assert "not [tokens" in mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, HQ * D, dtype=BF16)})
    assert mod.ADAPTER.normalize({**base, "q_out": base["q"]})[1][7] == 512     # q itself: in place
    assert mod.ADAPTER.normalize({**base, "q_out": torch.empty(5, HQ, D, dtype=BF16)})[1][7] == HQ * D
    # the check is gemma_qknorm_rope's, shared (patch/adapters.py)
    from astra_sglang.patch.adapters import q_out_stride
    assert mod.q_out_stride is q_out_stride and op_part("gemma_qknorm_rope", "adapter").q_out_stride is q_out_stride


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_the_q_out_switch_is_read_from_the_environment_when_the_adapter_is_imported(value, on):
    assert adapter_attr_under_env(OP, "Q_OUT", "ASTRA_DRS_Q_OUT", value) == str(on)


def test_returns_runs_the_attention_on_q_out_without_its_store_then_o_proj():
    """The attention gets q_out, contiguous [tokens, q_size] (fa3 copies a strided q), k and v as column views, and
    save_kv_cache=False; where q_out is q itself (ASTRA_DRS_Q_OUT=0), or the dict has none (qknorm_rope_store's dense
    site, the same helper), q's column view of qkv."""
    seen = {}
    qkv = torch.randn(2, HQ * D + 2 * HK * D)
    q_out = torch.randn(2, HQ * D)

    def attention(q, k, v, forward_batch, save_kv_cache=True):
        seen.update(q=q, k=k, v=v, fb=forward_batch, save=save_kv_cache)
        return q

    layer = types.SimpleNamespace(attn=attention, o_proj=lambda x: (x * 2, None))
    returns = op_part(OP, "adapter").ADAPTER.returns
    c = {"layer": layer, "qkv": qkv, "sizes": [HQ * D, HK * D, HK * D], "forward_batch": "fb",
         "q": qkv[:, : HQ * D].view(2, HQ, D), "q_out": q_out.view(2, HQ, D)}
    out = returns(c)
    assert seen["fb"] == "fb" and seen["save"] is False
    assert seen["q"].data_ptr() == q_out.data_ptr() and seen["q"].shape == (2, HQ * D) and seen["q"].is_contiguous()
    assert seen["k"].data_ptr() == qkv[:, HQ * D:].data_ptr() and seen["v"].shape == (2, HK * D)
    assert torch.equal(out, q_out * 2)
    for cc in ({**c, "q_out": c["q"]}, {k: v for k, v in c.items() if k != "q_out"}):
        out = returns(cc)
        assert seen["q"].data_ptr() == qkv.data_ptr() and seen["q"].stride() == (qkv.shape[1], 1)
        assert torch.equal(out, qkv[:, : HQ * D] * 2)


@pytest.mark.parametrize("where", ["q_out", "in place", "no q_out (qknorm_rope_store)"])
def test_sequence_rotates_q_into_q_out_and_leaves_q(where, monkeypatch, stub_sglang):
    """SGLang's sequence (the self-check's expected result and the fallback): q's rows copied into q_out and rotated
    there, q as it was; k rotated in place and stored with v. q_out = q, or no q_out (qknorm_rope_store's dense site,
    which shares the helper): q rotated in place, as before q_out."""
    calls, pool = stub_sglang
    mod = _cpu_adapter(monkeypatch, where == "q_out")
    layer, qkv, args = _dense_layer()
    before = qkv.clone()
    c = mod.ADAPTER.expand(args)
    if where.startswith("no q_out"):
        del c["q_out"]
    cache, pos, loc = c["cos_sin_cache"], c["positions"], c["out_loc"]
    want_q = _rotate(before[:, : HQ * D].view(5, HQ, D), cache, pos, True)
    want_k = _rotate(before[:, HQ * D: (HQ + HK) * D].view(5, HK, D), cache, pos, True)
    mod.ADAPTER.sequence(c)
    assert [x[0] for x in calls] == ["rope", "store"]
    assert torch.equal(c["k"], want_k) and torch.equal(pool.k[loc], want_k.reshape(5, -1))
    assert torch.equal(pool.v[loc], before[:, (HQ + HK) * D:])
    if where == "q_out":
        assert calls[0][1] == c["q_out"].data_ptr()  # the rope ran on q_out
        assert torch.equal(qkv[:, : HQ * D], before[:, : HQ * D]) and torch.equal(c["q_out"], want_q)
    else:
        assert calls[0][1] == qkv.data_ptr()
        assert torch.equal(c["q"], want_q)


@pytest.mark.parametrize("kernel_ok", [True, False])
def test_the_self_check_never_writes_q_when_q_out_is_separate(kernel_ok, monkeypatch, stub_sglang, tmp_path):
    """The patch's first call of a shape class, on the CPU (a torch stand-in for the kernel, SGLang's sequence
    stubbed): q is an input, untouched whether the self-check passes or fails; on a failure k and the cache rows are
    restored and SGLang's sequence reruns on the real q, so q_out, k and the caches are SGLang's and the op
    disables."""
    from q_out_self_check import run_self_check

    calls, pool = stub_sglang
    mod = _cpu_adapter(monkeypatch, True)

    layer, qkv, args = _dense_layer()
    before = qkv.clone()
    want = mod.ADAPTER.expand(args)  # SGLang's sequence on copies of the same qkv and pool
    want_qkv, want_kc, want_vc = qkv.clone(), pool.k.clone(), pool.v.clone()
    want.update(qkv=want_qkv, q=want_qkv[:, : HQ * D].view(5, HQ, D),
                k=want_qkv[:, HQ * D:(HQ + HK) * D].view(5, HK, D), v=want_qkv[:, (HQ + HK) * D:], k_cache=want_kc,
                v_cache=want_vc)
    mod.ADAPTER.sequence(want)

    canon = mod.ADAPTER.expand(args)
    st = run_self_check(SPEC, mod.ADAPTER, canon, tmp_path, kernel_ok, written=("q_out", "k", "k_cache", "v_cache"))
    assert torch.equal(qkv[:, : HQ * D], before[:, : HQ * D])            # q: never written
    assert torch.equal(qkv[:, (HQ + HK) * D:], before[:, (HQ + HK) * D:])  # v: never written
    assert st.last_check is not None and st.last_check.ok == kernel_ok
    if kernel_ok:
        assert not st.disabled
        assert (canon["q_out"].double() - want["q_out"].double()).abs().max() < 0.05
    else:
        assert st.disabled and "self-check mismatch" in st.disabled
        assert torch.equal(canon["q_out"], want["q_out"]) and torch.equal(qkv[:, HQ * D:], want_qkv[:, HQ * D:])
        assert torch.equal(pool.k, want_kc) and torch.equal(pool.v, want_vc)


def test_validate_s_layer_driver_unpacks_the_eight_dims_and_reports_q_out(monkeypatch, stub_sglang):
    """layer.py (validate) on stand-ins for SGLang's LlamaAttention, rope and forward context: the op's eight dims
    unpack (gemma_qknorm_rope's layer had refused every case when its dims gained q_out_stride), and the q the
    attention received is reported as q_out, k and the caches as stored; the row buffer's q is the input, unchanged.
    SGLang's own layer runs only on a GPU validate."""
    from contextlib import nullcontext

    layer_mod = op_part(OP, "layer")

    class LlamaAttention:  # the body the replaced forwards share (asserted against SGLang above), on stand-ins
        def forward(self, positions, hidden_states, forward_batch):
            qkv, _ = self.qkv_proj(hidden_states)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, k = self.rotary_emb(positions, q, k)
            out, _ = self.o_proj(self.attn(q, k, v, forward_batch))
            return out

        def forward_prepare_native(self, *a):
            raise AssertionError("not called")

    def rotary_embedding(cache, head_size, rotary_dim, neox):
        def rope(positions, q, k):
            t = q.shape[0]
            q.view(t, -1, head_size).copy_(_rotate(q.view(t, -1, head_size), cache, positions, neox))
            k.view(t, -1, head_size).copy_(_rotate(k.view(t, -1, head_size), cache, positions, neox))
            return q, k
        return rope

    llama = types.ModuleType("sglang.srt.models.llama")
    llama.LlamaAttention = LlamaAttention
    fc = types.ModuleType("sglang.srt.model_executor.forward_context")
    fc.forward_context = lambda ctx: nullcontext()
    monkeypatch.setitem(sys.modules, "sglang.srt.models.llama", llama)
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor", types.ModuleType("sglang.srt.model_executor"))
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.forward_context", fc)
    monkeypatch.setattr(layer_mod, "rotary_embedding", rotary_embedding)
    monkeypatch.setattr(layer_mod, "kv_pool_context", lambda inp, hk, d: None)
    monkeypatch.setattr(layer_mod, "server_defaults", nullcontext)
    rs = op_part("rope_store", "spec")
    monkeypatch.setattr(rs, "MAX_POSITION", 64)
    monkeypatch.setattr(rs, "cache_slots", lambda t: max(32, 2 * t))

    dims = (3, HQ, HK, D, 512, 512, 512, HQ * D)
    inp = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(4), "normal", device="cpu")
    q_before, kc_before = inp["q"].clone(), inp["k_cache"].clone()
    pos, loc = inp["positions"], inp["out_loc"]
    out = layer_mod.run_layer(inp, dims, SPEC.scalars(dims))
    assert set(out) == {"q_out", "k", "k_cache", "v_cache"}
    want_q = _rotate(q_before[:, : HQ * D].view(3, HQ, D), inp["cos_sin_cache"], pos, True).reshape(3, -1)
    assert torch.equal(out["q_out"], want_q) and torch.equal(inp["q"], q_before)
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
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("needs nvcc")
    lib = tmp_path / "k.so"
    r = subprocess.run([nvcc, "-arch=sm_90", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                        str(shipped_kernel(OP)), "-o", str(lib)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert " T astra_dense_rope_store" in syms


@pytest.mark.gpu
@pytest.mark.nvcc
def test_kernel_writes_q_out_as_it_wrote_q_in_place(tmp_path, monkeypatch):
    """A GPU: q_out apart and q_out = q (ASTRA_DRS_Q_OUT=0) write the same q bit for bit, q untouched, k and the
    caches equal (tests/q_out_self_check.py); every edge shape, a decode and a prefill row."""
    from q_out_self_check import assert_q_out_is_q_in_place

    rows = [(2, 28, 4, 128, 4608, 4608, 4608, 3584), (300, 32, 8, 128, 6144, 6144, 6144, 4096)]
    assert_q_out_is_q_in_place(SPEC, tmp_path, monkeypatch, rows, same=("k", "k_cache", "v_cache"))
