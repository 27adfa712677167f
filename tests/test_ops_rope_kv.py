"""qknorm, rope, kv_store, rope_store (kernels/<op>/): extraction from the real sglang 0.5.17 and 0.5.23 wheels builds
with nvcc for sm_90; the shipped kernels build; the fp64 / exact references agree with independent CPU
formulations and drive the check harness on CPU; the patch adapters bind SGLang's real call signatures
(read from the wheels' source, not imported) and map SGLang's strided views onto the ABI.

No kernel runs here (no GPU in CI): the GPU records are under results/2026-11-23-h200/kernels/<op>/."""
from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from astra_sglang.registry import get_op, op_part, shipped_kernel
from sglang_signatures import real_function  # noqa: E402

OPS = ("qknorm", "rope", "kv_store", "rope_store")
# (op, sglang version): the serving version for all three; 0.5.23 where its kernel source differs
# (qknorm gained a half-warp kernel, the KV store a new kernel generation). rope.cuh only changed namespace.
BUILDS = [("qknorm", "0.5.17"), ("rope", "0.5.17"), ("kv_store", "0.5.17"), ("rope_store", "0.5.17"),
          ("qknorm", "0.5.23"), ("kv_store", "0.5.23")]


def _has_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))


def _sglang_src(version: str, request) -> Path:
    if version == "0.5.23":
        return Path(request.getfixturevalue("wheel_sources")["sglang"])
    return Path(request.getfixturevalue("sglang_0_5_17_source"))


# ------------------------------------------------------------------------------------------ extraction
@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    """Each (op, version) extracted for sm_90 and built once, in parallel: {(op, version): (ws, BuildResult)}."""
    if not _has_nvcc():
        pytest.skip("needs nvcc")
    from astra_sglang.build import Arch
    from astra_sglang.extract import discover, extract
    from astra_sglang.build.workspace import Workspace

    ws_src = request.getfixturevalue("wheel_sources")
    root = tmp_path_factory.mktemp("ropekv")
    jobs = []
    for op, ver in BUILDS:
        roots = discover(_sglang_src(ver, request), ws_src["flashinfer"], ws_src["tvm"])
        dest = root / ver / op
        extract(get_op(op), roots, dest, Arch(9, 0))
        jobs.append((op, ver, Workspace.open(op, path=dest)))
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda j: j[2].build(), jobs))
    return {(op, ver): (ws, res) for (op, ver, ws), res in zip(jobs, results)}


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("op,version", BUILDS, ids=[f"{o}-{v}" for o, v in BUILDS])
def test_extracted_production_kernel_builds_for_sm90(built, op, version):
    ws, res = built[(op, version)]
    assert res.ok, res.log[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    assert get_op(op).symbol in syms
    assert ws.manifest["sources"]["sglang_jit"]["version"] == version


@pytest.mark.wheels
def test_launchers_pick_the_kernel_generation_of_each_version(built):
    """The source facts select what the launcher launches: 0.5.23's half-warp q/k norm and new KV-store
    kernel, 0.5.17's warp kernel and split-warp store."""
    def text(op, ver):
        return (built[(op, ver)][0].path / "baseline.cu").read_text()

    assert "#define ASTRA_QK_FIRST_fused_qknorm_half_warp 1" in text("qknorm", "0.5.23")
    assert "#define ASTRA_QK_FIRST_QKNormKernelWarp 1" in text("qknorm", "0.5.17")
    assert "#define ASTRA_KV_store_kvcache_kernel 1" in text("kv_store", "0.5.23")
    assert "#define ASTRA_KV_store_kvcache 1" in text("kv_store", "0.5.17")


@pytest.mark.parametrize("op", OPS)
def test_shipped_kernel_passes_the_static_checks_and_declares_the_abi(op):
    """(Its build and exported symbols: tests/test_kernels_linkage.py, which covers every op folder.)"""
    from astra_sglang.static_checks import scan_file

    src = shipped_kernel(op)
    assert scan_file(src) == []
    text = src.read_text()
    assert "namespace {" in text and "torch" not in text.lower().replace("pytorch", "")
    sig = get_op(op).c_signature()
    assert sig.split("(")[0] in text  # extern "C" cudaError_t astra_<op>


# ------------------------------------------------------------------------------------------ references
def test_qknorm_reference_is_per_head_rmsnorm_and_leaves_the_rest_of_the_row():
    spec = get_op("qknorm")
    dims = (3, 4, 2, 64, 512, 512)
    inp = spec.make_inputs(dims, "fp16", torch.Generator().manual_seed(0), device="cpu")
    ref = spec.reference({n: v.double() for n, v in inp.items()}, dims, {"eps": 1e-6})
    q = inp["q"].double()[:, : 4 * 64].reshape(3, 4, 64)
    want = torch.nn.functional.rms_norm(q, (64,), inp["q_weight"].double(), eps=1e-6)
    assert torch.allclose(ref["q"][:, :256].reshape(3, 4, 64), want, atol=1e-12)
    assert torch.equal(ref["q"][:, 256:], inp["q"].double()[:, 256:])
    assert torch.equal(ref["k"][:, 128:], inp["k"].double()[:, 128:])
    # the patch's [T, H, D] views give the same answer as the harness's row buffers
    view = spec.reference({"q": q, "k": inp["k"].double()[:, :128].reshape(3, 2, 64),
                           "q_weight": inp["q_weight"].double(), "k_weight": inp["k_weight"].double()},
                          dims, {"eps": 1e-6})
    assert torch.allclose(view["q"], want, atol=1e-12)


@pytest.mark.parametrize("neox", [1, 0])
def test_rope_reference_is_a_complex_rotation(neox):
    spec = get_op("rope")
    dims = (5, 2, 1, 128, 64, 512, 256)  # partial rotary: 64 of 128 columns
    inp = spec.make_inputs(dims, "bf16", torch.Generator().manual_seed(1), device="cpu")
    ref = spec.reference({n: v.double() for n, v in inp.items()}, dims, {"is_neox": neox})
    x = inp["q"].double()[:, :256].reshape(5, 2, 128)
    cs = inp["cos_sin_cache"].double()[inp["positions"]]
    rot = torch.polar(torch.ones_like(cs[:, :32]), torch.atan2(cs[:, 32:], cs[:, :32]))[:, None, :]
    if neox:
        z = torch.complex(x[..., :32], x[..., 32:64]) * rot
        got = torch.cat([z.real, z.imag], -1)
    else:
        z = torch.complex(x[..., 0:64:2], x[..., 1:64:2]) * rot
        got = torch.stack([z.real, z.imag], -1).flatten(-2)
    out = ref["q"][:, :256].reshape(5, 2, 128)
    assert torch.allclose(out[..., :64], got, atol=1e-9)
    assert torch.equal(out[..., 64:], x[..., 64:])  # past rope_dim: untouched
    assert torch.equal(ref["q"][:, 256:], inp["q"].double()[:, 256:])


def test_kv_store_reference_skips_the_padding_slot_and_keeps_other_rows():
    spec = get_op("kv_store")
    dims = (6, 128, 128, 384, 384)
    inp = spec.make_inputs(dims, "bf16", torch.Generator().manual_seed(2), device="cpu")
    idx = inp["indices"]
    assert idx[0] == 0 and len(set(idx.tolist())) == 6
    ref = spec.reference({n: v.double() for n, v in inp.items()}, dims, spec.scalars(dims))
    kc, k = ref["k_cache"], inp["k"].double()
    for t in range(1, 6):
        assert torch.equal(kc[idx[t]], k[t, :128])
    assert torch.equal(kc[0], inp["k_cache"][0].double())  # slot 0 never written
    touched = set(idx.tolist())
    others = [i for i in range(kc.shape[0]) if i not in touched][:50]
    assert torch.equal(kc[others], inp["k_cache"].double()[others])


def test_rope_store_reference_is_rope_plus_the_store():
    """rope_store = rope of q and k, then k (rotated) and v written at each token's slot."""
    rs, rope = get_op("rope_store"), get_op("rope")
    dims = (4, 4, 2, 64, 512, 512, 512)
    inp = rs.make_inputs(dims, "fp16", torch.Generator().manual_seed(3), device="cpu")
    d64 = {n: v.double() for n, v in inp.items()}
    ref = rs.reference(d64, dims, {"is_neox": 1})
    alone = rope.reference({"q": d64["q"], "k": d64["k"], "cos_sin_cache": d64["cos_sin_cache"],
                            "positions": d64["positions"]}, (4, 4, 2, 64, 64, 512, 512), {"is_neox": 1})
    assert torch.allclose(ref["q"], alone["q"]) and torch.allclose(ref["k"], alone["k"])
    loc = inp["out_loc"]
    assert torch.equal(ref["k_cache"][loc], alone["k"][:, :128])
    assert torch.equal(ref["v_cache"][loc], d64["v"][:, :128])
    others = [i for i in range(ref["v_cache"].shape[0]) if i not in set(loc.tolist())][:20]
    assert torch.equal(ref["v_cache"][others], d64["v_cache"][others])


@pytest.mark.parametrize("op", OPS)
def test_harness_runs_every_edge_shape_and_distribution_on_cpu(op, monkeypatch):
    """make_inputs, the guard regions, in-place roles, scalars and the tolerance rule fit together."""
    from reference_harness import run_edge_cases_on_cpu

    # CPU-sized tables: a short cos/sin cache and KV pool (the GPU runs use the spec's)
    mod = op_part(op, "spec")
    if hasattr(mod, "MAX_POSITION"):
        monkeypatch.setattr(mod, "MAX_POSITION", 64)
    if hasattr(mod, "cache_slots"):
        monkeypatch.setattr(mod, "cache_slots", lambda t: max(32, 2 * t))
    run_edge_cases_on_cpu(get_op(op))


@pytest.mark.parametrize("op", OPS)
def test_corpus_comes_from_real_configs_and_every_shape_is_supported(op):
    spec = get_op(op)
    tags = {t for s in spec.corpus for t in s.tags}
    assert {"decode", "prefill"} <= tags
    assert {s.dims[0] for s in spec.corpus} >= {1, 256, 1024, 16384}
    v = spec.variant("jit")
    for s in list(spec.corpus) + list(spec.edge_shapes):
        for dt in spec.dtypes:
            assert v.supports(s.dims, dt) is None, (s.dims, dt)
        assert spec.bytes_moved(s.dims, "bf16") > 0


# ------------------------------------------------------------------------------------------ adapters
ANNOTATIONS = {"FusedSetKVBufferArg": object}  # a type the rope signatures name
@pytest.fixture(params=["0.5.17", "0.5.23"])
def sglang_src(request):
    return _sglang_src(request.param, request) / "sglang"


def _binder(op, fn):
    from astra_sglang.patch.adapters import Binder, adapter_mismatch

    spec, ad = get_op(op), op_part(op, "adapter").ADAPTER
    assert adapter_mismatch(spec, ad) is None
    b = Binder(fn, ad, spec)
    assert b.ok, b.problem
    return b, ad


def test_qknorm_binds_apply_qk_norm_s_call(sglang_src):
    fn = real_function(sglang_src.parent, "sglang.kernels.ops.layernorm.norm",
                       "fused_inplace_qknorm", names=ANNOTATIONS)
    b, ad = _binder("qknorm", fn)
    qkv = torch.randn(3, (8 + 2 * 2) * 128, dtype=torch.bfloat16)
    q, k = qkv[:, :1024].view(3, -1, 128), qkv[:, 1024:1280].view(3, -1, 128)
    w = torch.ones(128, dtype=torch.bfloat16)
    # sglang/srt/models/utils.py apply_qk_norm: all keywords, head_dim and eps given
    canon, _ = b.bind((), dict(q=q, k=k, q_weight=w, k_weight=w, head_dim=128, eps=1e-6))
    assert canon is not None, _
    views, dims = ad.normalize(canon)
    assert dims == (3, 8, 2, 128, 1536, 1536)
    assert views["q"].data_ptr() == q.data_ptr() and views["k"].data_ptr() == k.data_ptr()  # in place, no copy
    bad = ad.normalize({**canon, "q": q.transpose(0, 1)})
    assert isinstance(bad, str)


def test_rope_binds_forward_cuda_s_call_and_leaves_the_fused_store_to_sglang(sglang_src):
    fn = real_function(sglang_src.parent, "sglang.kernels.ops.attention.rope",
                       "apply_rope_with_cos_sin_cache_inplace", names=ANNOTATIONS)
    b, ad = _binder("rope", fn)
    qkv = torch.randn(2, (4 + 2 * 1) * 128, dtype=torch.float16)
    q = qkv[:, :512].view(2, -1, 128)[..., :64]  # partial rotary: forward_cuda slices [..., :rotary_dim]
    k = qkv[:, 512:640].view(2, -1, 128)[..., :64]
    cache, pos = torch.randn(100, 64), torch.tensor([3, 99])
    canon, _ = b.bind((), dict(positions=pos, q=q, k=k, cos_sin_cache=cache, is_neox=True))
    assert canon is not None and canon["is_neox"] is True, _
    views, dims = ad.normalize(canon)
    assert dims == (2, 4, 1, 128, 64, 768, 768)
    canon, why = b.bind((), dict(positions=pos, q=q, k=k, cos_sin_cache=cache, is_neox=True, fused_args=object()))
    assert canon is None and "fused_args" in why
    assert isinstance(ad.normalize({**dict(q=q, k=k, cos_sin_cache=cache, is_neox=True),
                                    "positions": pos.int()}), str)  # int32 positions: SGLang's kernel serves


def test_kv_store_binds_set_kv_buffer_s_call(sglang_src):
    fn = real_function(sglang_src.parent, "sglang.kernels.ops.kvcache.kvcache",
                       "store_cache", names=ANNOTATIONS)
    b, ad = _binder("kv_store", fn)
    qkv = torch.randn(4, (8 + 2 * 2) * 128, dtype=torch.bfloat16)
    k, v = qkv[:, 1024:1280], qkv[:, 1280:1536]
    kc, vc = torch.zeros(64, 256, dtype=torch.bfloat16), torch.zeros(64, 256, dtype=torch.bfloat16)
    idx = torch.tensor([0, 5, 9, 63])
    # sglang/srt/mem_cache/memory_pool.py _set_kv_buffer_impl
    canon, _ = b.bind((k, v, kc, vc, idx), dict(row_bytes=512, v_row_bytes=512, size_limit=64))
    assert canon is not None, _
    views, dims = ad.normalize(canon)
    assert dims == (4, 256, 256, 1536, 1536) and canon["size_limit"] == 64 and canon["reserved_skip_index"] == 0
    canon, _ = b.bind((k, v, kc, vc, idx), {})
    ad.normalize(canon)
    assert canon["size_limit"] == 64  # store_cache's default: the cache's rows
    assert isinstance(ad.normalize({**canon, "indices": idx.int()}), str)


def test_rope_store_binds_the_fused_call(sglang_src):
    fn = real_function(sglang_src.parent, "sglang.kernels.ops.attention.rope",
                       "apply_rope_inplace_with_kvcache", names=ANNOTATIONS)
    b, ad = _binder("rope_store", fn)
    qkv = torch.randn(3, (8 + 2 * 2) * 128, dtype=torch.bfloat16)
    q, k, v = qkv[:, :1024].view(3, -1, 128), qkv[:, 1024:1280].view(3, -1, 128), qkv[:, 1280:]
    kc, vc = torch.zeros(40, 256, dtype=torch.bfloat16), torch.zeros(40, 256, dtype=torch.bfloat16)
    cache, pos, loc = torch.randn(16, 128), torch.tensor([1, 2, 3]), torch.tensor([7, 8, 39])
    # apply_rope_with_cos_sin_cache_inplace's call with fused_args unpacked
    canon, _ = b.bind((q, k, v, kc, vc, cache, pos, loc), dict(is_neox=True, rope_dim=0))
    assert canon is not None, _
    views, dims = ad.normalize(canon)
    assert dims == (3, 8, 2, 128, 1536, 1536, 1536)
    assert isinstance(ad.normalize({**canon, "out_loc": loc.int()}), str)


@pytest.mark.parametrize("op", OPS)
def test_layer_and_adapter_modules_import_without_sglang(op):
    assert callable(op_part(op, "layer").run_layer)
    assert op_part(op, "adapter").ADAPTER.op == op
