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
                                                                "gemma-2-27b", "qwen2.5-7b"}
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
    arch = {"Gemma2Attention": "Gemma2ForCausalLM", "Qwen2Attention": "Qwen2ForCausalLM",
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
