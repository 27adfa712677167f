"""A fused op replaces a layer *method* ("module:Class.method") whose body is the kernel sequence it fuses
(qknorm_rope_store: Qwen3MoeAttention.apply_qk_norm_rope). CPU, in process: the real op spec and its ABI, CPU
stand-ins for the astra kernel (the spec's reference) and for SGLang's kernel sequence, a synthetic attention
class in a synthetic module (the real adapter's expand reads SGLang's runtime, which needs a GPU server; it is
validated there). As the real adapter does, the stand-in expand gives q its own buffer q_out, which the patched
method returns as its q; qkv's q columns stay the input."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest

torch = pytest.importorskip("torch")

HQ, HK, D, SLOTS = 4, 2, 64, 40
BF16 = torch.bfloat16  # the op's dtypes are fp16 and bf16


def _sequence(c):
    """SGLang's two kernels, on canonical tensors (fp32 math, rounded once per kernel as production does); q's result
    into q_out where there is one (the patched call), else into q (the method's own, in place)."""
    from astra_sglang.kernels.qknorm_rope_store import spec as S

    t = c["q"].shape[0]
    dims = (t, HQ, HK, D, HQ * D, HK * D, HK * D, HQ * D)
    inp = {n: (x.double() if x.is_floating_point() and n != "cos_sin_cache" else x) for n, x in c.items()
           if isinstance(x, torch.Tensor) and n != "q_out"}
    ref = S.reference(inp, dims, {"is_neox": c["is_neox"], "eps": c["eps"]})
    qo = c.get("q_out", c["q"])
    qo.copy_(ref["q_out"].to(qo.dtype))
    c["k"].copy_(ref["k"].to(c["k"].dtype))
    for n in ("k_cache", "v_cache"):
        c[n].copy_(ref[n].to(c[n].dtype))


class Attn:
    """The method's whole body is the fused sequence; `fused_store` False: SGLang would store in attention."""

    def __init__(self, fused_store=True):
        g = torch.Generator().manual_seed(1)
        self.q_w, self.k_w = [(torch.rand(D, generator=g) + 0.5).to(BF16) for _ in range(2)]
        from astra_sglang.families import qkv

        self.cache = qkv.cos_sin_cache(D, 64, "cpu")
        self.k_cache, self.v_cache = torch.zeros(SLOTS, HK * D, dtype=BF16), torch.zeros(SLOTS, HK * D, dtype=BF16)
        self.fused_store = fused_store
        self.flag = None

    def apply_qk_norm_rope(self, qkv, positions, forward_batch):
        t = qkv.shape[0]
        q, k, v = qkv.split([HQ * D, HK * D, HK * D], dim=-1)
        _sequence({"q": q.view(t, HQ, D), "k": k.view(t, HK, D), "v": v, "k_cache": self.k_cache,
                   "v_cache": self.v_cache, "q_weight": self.q_w, "k_weight": self.k_w, "cos_sin_cache": self.cache,
                   "positions": positions, "out_loc": forward_batch.out_cache_loc, "is_neox": 1, "eps": 1e-6})
        self.flag = "original"
        return q, k, v


def _expand(a):
    attn, qkv, pos, fb = a["self"], a["qkv"], a["positions"], a["forward_batch"]
    if not attn.fused_store:
        return "no fused KV store on this call"
    t = qkv.shape[0]
    q, k, v = qkv.split([HQ * D, HK * D, HK * D], dim=-1)
    return {"q": q.view(t, HQ, D), "q_out": torch.empty((t, HQ, D), dtype=qkv.dtype), "k": k.view(t, HK, D), "v": v,
            "k_cache": attn.k_cache, "v_cache": attn.v_cache, "q_weight": attn.q_w, "k_weight": attn.k_w,
            "cos_sin_cache": attn.cache, "positions": pos, "out_loc": fb.out_cache_loc, "is_neox": 1, "eps": 1e-6,
            "layer": attn, "qkv": qkv}


def _returns(c):
    c["layer"].flag = "astra"
    q, k, v = c["qkv"].split([HQ * D, HK * D, HK * D], dim=-1)
    return c["q_out"].view(q.shape), k, v


@pytest.fixture
def fused_env(monkeypatch, tmp_path):
    from astra_sglang.registry import op_part

    mod = types.ModuleType("fake_qwen3_moe")
    mod.Attn = Attn
    original = Attn.apply_qk_norm_rope
    sys.modules[mod.__name__] = mod
    ad = op_part("qknorm_rope_store", "adapter")
    monkeypatch.setattr(ad, "ADAPTER", dataclasses.replace(ad.ADAPTER, expand=_expand, sequence=_sequence,
                                                           returns=_returns))
    yield mod, original, tmp_path
    from astra_sglang.patch import revert_astra_kernels

    revert_astra_kernels()
    del sys.modules[mod.__name__]


def _inputs(t=6, seed=0):
    """(qkv, positions, slots) of a call."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (HQ + 2 * HK) * D, generator=g).to(BF16)
    pos = torch.randint(0, 64, (t,), generator=g)
    loc = torch.cat([torch.tensor([SLOTS - 1]), torch.randperm(SLOTS - 1, generator=g)[: t - 1]])  # last slot too
    return qkv, pos, loc


def _call(attn, t=6, seed=0):
    qkv, pos, loc = _inputs(t, seed)
    out = attn.apply_qk_norm_rope(qkv, pos, types.SimpleNamespace(out_cache_loc=loc))
    return qkv, out


def _patch(tmp, wrong=()):
    import sglang_cpu_env as E
    from astra_sglang.patch import apply_astra_kernels

    return apply_astra_kernels(["qknorm_rope_store"], backends=E.astra_standins(wrong=wrong),
                               targets={"qknorm_rope_store": ["fake_qwen3_moe:Attn.apply_qk_norm_rope"]},
                               counter_dir=str(tmp), propagate=False, plan=False, strict=True)


def test_a_layer_method_is_replaced_runs_the_fused_kernel_and_is_restored(fused_env):
    from astra_sglang.patch import counters, revert_astra_kernels

    mod, original, tmp = fused_env
    want_attn = Attn()
    want_qkv, (want_q, _, _) = _call(want_attn)
    p = _patch(tmp)
    st = p.summary()["qknorm_rope_store"]["targets"]["fake_qwen3_moe:Attn.apply_qk_norm_rope"]
    assert st["state"] == "patched" and Attn.apply_qk_norm_rope is not original
    got_attn = Attn()
    got_qkv, (q, k, v) = _call(got_attn)  # first call of its shape class: self-checked against _sequence
    _call(got_attn, seed=1)               # checked class: the kernel alone
    c = counters(str(tmp))["qknorm_rope_store"]
    assert c["calls"] == 2 and c["checks_passed"] == 1 and c["fallbacks"] == 0, c
    # q is q_out, its own contiguous buffer; k and v column views of qkv, whose q columns the kernel never wrote
    assert got_attn.flag == "astra" and q.untyped_storage().data_ptr() != got_qkv.untyped_storage().data_ptr()
    assert q.is_contiguous() and q.shape == want_q.shape and k.data_ptr() == got_qkv[:, HQ * D:].data_ptr()
    assert torch.equal(q, want_q) and torch.equal(got_qkv[:, : HQ * D], _inputs()[0][:, : HQ * D])
    # the first call's results match SGLang's sequence (the second call wrote other slots and rows of its own)
    ref_attn = Attn()
    _call(ref_attn)
    _call(ref_attn, seed=1)
    assert torch.allclose(got_attn.k_cache, ref_attn.k_cache, atol=0)
    assert torch.allclose(got_attn.v_cache, ref_attn.v_cache)
    assert torch.equal(got_qkv[:, HQ * D:], want_qkv[:, HQ * D:])  # k (normed, rotated in place) and v
    revert_astra_kernels()
    assert Attn.apply_qk_norm_rope is original


def test_a_call_the_adapter_declines_runs_the_method(fused_env):
    from astra_sglang.patch import counters

    _, _, tmp = fused_env
    _patch(tmp)
    attn = Attn(fused_store=False)
    _call(attn)
    c = counters(str(tmp))["qknorm_rope_store"]
    assert attn.flag == "original" and c["calls"] == 0 and c["fallbacks"] == 1, c


def test_a_call_the_kernel_declines_after_expand_goes_to_the_sequence_not_the_method(fused_env):
    """expand may have done the method's own work (a dense layer's qkv GEMM): a call the kernel then declines
    (here: int32 positions) is served by SGLang's kernel sequence, and the method body does not run again."""
    from astra_sglang.patch import counters

    _, _, tmp = fused_env
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(5, (HQ + 2 * HK) * D, generator=g).to(BF16)
    pos, loc = torch.randint(0, 64, (5,), generator=g), torch.arange(5)
    ref = Attn()
    want = qkv.clone()
    ref.apply_qk_norm_rope(want, pos, types.SimpleNamespace(out_cache_loc=loc))  # unpatched: the method
    _patch(tmp)
    attn = Attn()
    got = qkv.clone()
    q, _, _ = attn.apply_qk_norm_rope(got, pos.to(torch.int32), types.SimpleNamespace(out_cache_loc=loc))
    c = counters(str(tmp))["qknorm_rope_store"]
    assert c["calls"] == 0 and c["fallbacks"] == 1, c
    assert attn.flag == "astra"  # returns() ran; the method body (flag "original") did not
    # the sequence wrote q's result into q_out (returned as q), k in place; qkv's q columns are the input
    assert torch.equal(q, want[:, : HQ * D]) and torch.equal(got[:, : HQ * D], qkv[:, : HQ * D])
    assert torch.equal(got[:, HQ * D:], want[:, HQ * D:])
    assert torch.equal(attn.k_cache, ref.k_cache) and torch.equal(attn.v_cache, ref.v_cache)


def test_self_check_compares_only_the_cache_rows_written_and_restores_them(fused_env):
    """A wrong kernel (the stand-in's last v_cache element one off, a slot the call writes): the self-check
    sees it in the cache rows it copied, disables the op, and the caller gets SGLang's result everywhere."""
    from astra_sglang.patch import counters

    _, _, tmp = fused_env
    ref = Attn()
    ref_qkv, (ref_q, _, _) = _call(ref)
    _patch(tmp, wrong={"qknorm_rope_store"})
    attn = Attn()
    got_qkv, (q, _, _) = _call(attn)
    c = counters(str(tmp))["qknorm_rope_store"]
    assert c["checks_failed"] == 1 and c["disabled"] == 1, c
    assert torch.allclose(attn.v_cache, ref.v_cache) and torch.allclose(attn.k_cache, ref.k_cache, atol=0)
    assert torch.equal(q, ref_q) and torch.equal(got_qkv[:, HQ * D:], ref_qkv[:, HQ * D:])
    assert torch.equal(got_qkv[:, : HQ * D], _inputs()[0][:, : HQ * D])  # q: never written


def test_the_fault_drill_touches_only_the_cache_rows_the_call_writes(fused_env, monkeypatch):
    """ASTRA_SGLANG_FAULT_DRILL corrupts the kernel's outputs in the self-check; on a pool cache only the rows the
    call writes (the rest of a real pool holds other requests' KV), and the restore puts SGLang's result back."""
    from astra_sglang.patch import counters

    _, _, tmp = fused_env
    monkeypatch.setenv("ASTRA_SGLANG_FAULT_DRILL", "qknorm_rope_store")
    ref = Attn()
    ref_qkv, (ref_q, _, _) = _call(ref)
    _patch(tmp)
    attn = Attn()
    got_qkv, (q, _, _) = _call(attn)
    c = counters(str(tmp))["qknorm_rope_store"]
    assert c["checks_failed"] == 1 and c["disabled"] == 1, c
    assert torch.equal(attn.k_cache, ref.k_cache) and torch.equal(attn.v_cache, ref.v_cache)
    assert torch.equal(q, ref_q) and torch.equal(got_qkv[:, HQ * D:], ref_qkv[:, HQ * D:])
    assert torch.equal(got_qkv[:, : HQ * D], _inputs()[0][:, : HQ * D])


def test_the_shipped_adapter_fits_the_spec_and_binds_the_method_signature():
    from astra_sglang.patch.adapters import Binder, adapter_mismatch, get_adapter
    from astra_sglang.registry import get_op

    spec, ad = get_op("qknorm_rope_store"), get_adapter("qknorm_rope_store")
    assert adapter_mismatch(spec, ad) is None
    assert Binder(Attn.apply_qk_norm_rope, ad, spec).ok

    def forward(self, positions, hidden_states, forward_batch):  # SGLang's dense Qwen3Attention.forward
        raise AssertionError("not called")

    assert Binder(forward, ad, spec).ok
    assert spec.replaces == ("sglang.srt.models.qwen3_moe:Qwen3MoeAttention.apply_qk_norm_rope",
                             "sglang.srt.models.qwen3:Qwen3Attention.forward")


def test_the_call_site_picks_its_expand_and_the_dense_site_attends_without_storing(monkeypatch):
    """qknorm_rope_store's adapter serves two methods: expand goes by the parameters (hidden_states: dense forward);
    the dense site's result is the rest of Qwen3Attention.forward, the attention told not to store the KV the kernel
    stored (save_kv_cache=False), then o_proj; the site travels with the views into the self-check's sequence."""
    ad = __import__("astra_sglang.kernels.qknorm_rope_store.adapter", fromlist=["_"])
    monkeypatch.setattr(ad, "_expand_dense", lambda a: "dense")
    monkeypatch.setattr(ad, "_expand_moe", lambda a: "moe")
    assert ad._expand_either({"self": 0, "positions": 0, "hidden_states": 0, "forward_batch": 0}) == "dense"
    assert ad._expand_either({"self": 0, "qkv": 0, "positions": 0, "forward_batch": 0}) == "moe"

    seen = {}

    def attention(q, k, v, fb, save_kv_cache=True):
        seen.update(shapes=(q.shape, k.shape, v.shape), fb=fb, save=save_kv_cache)
        return q * 2

    layer = types.SimpleNamespace(attn=attention, o_proj=lambda x: (x + 1, None))
    qkv = torch.arange(2 * 8, dtype=torch.float32).view(2, 8)
    out = ad._returns({"site": "dense", "layer": layer, "forward_batch": "fb", "qkv": qkv, "sizes": [4, 2, 2]})
    assert seen == {"shapes": ((2, 4), (2, 2), (2, 2)), "fb": "fb", "save": False}
    assert torch.equal(out, qkv[:, :4] * 2 + 1)


def test_the_dense_adapter_fits_the_spec_and_binds_the_method_signature():
    from astra_sglang.patch.adapters import Binder, adapter_mismatch, get_adapter
    from astra_sglang.registry import get_op

    def forward_prepare_native(self, positions, hidden_states):  # SGLang's dense Qwen3 signature
        raise AssertionError("not called")

    spec, ad = get_op("qknorm_rope"), get_adapter("qknorm_rope")
    assert adapter_mismatch(spec, ad) is None and Binder(forward_prepare_native, ad, spec).ok
    assert spec.replaces == ("sglang.srt.models.qwen3:Qwen3Attention.forward_prepare_native",)


def test_an_expanding_adapter_needs_the_kernel_sequence():
    from astra_sglang.patch.adapters import Binder, get_adapter
    from astra_sglang.registry import get_op

    ad = dataclasses.replace(get_adapter("qknorm_rope_store"), sequence=None)
    b = Binder(Attn.apply_qk_norm_rope, ad, get_op("qknorm_rope_store"))
    assert not b.ok and "sequence" in b.problem


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("op,module,method", [
    ("qknorm_rope_store", "sglang.srt.models.qwen3_moe", "Qwen3MoeAttention.apply_qk_norm_rope"),
    ("qknorm_rope_store", "sglang.srt.models.qwen3", "Qwen3Attention.forward"),
    ("qknorm_rope", "sglang.srt.models.qwen3", "Qwen3Attention.forward_prepare_native"),
    ("moe_topk_experts", "sglang.srt.models.qwen3_moe", "Qwen3MoeSparseMoeBlock.forward_normal"),
])
def test_discovery_finds_the_layer_method_in_real_sglang(version, op, module, method, request):
    """The dry run and the server plan must see the method a fused op replaces (a class-level definition)."""
    from pathlib import Path

    from astra_sglang.patch.discover import discover_for_specs, format_report
    from astra_sglang.registry import get_op

    root = Path(request.getfixturevalue("sglang_0_5_17_source") if version == "0.5.17"
                else request.getfixturevalue("wheel_sources")["sglang"])
    disc = discover_for_specs([get_op(op)], roots={"sglang": root / "sglang"})
    assert ("definition", module, method) in [(s.kind, s.module, s.local_name) for s in disc.for_op(op)]
    assert "replaced on its class" in format_report(disc, [op])


@pytest.fixture
def fake_sglang_utils(monkeypatch):
    """Stand-ins for the SGLang names the dense sites' expand reads (sglang.srt.models.utils, the KV pool class):
    a bf16 MHA pool of [slots, kv heads, head_dim] layers, and SGLang's own fused-store decision as a switch."""
    pool_cls = type("MHATokenToKVPool", (), {})
    pool = pool_cls()
    pool.dtype = BF16
    pool.k, pool.v = torch.zeros(SLOTS, HK, D, dtype=BF16), torch.zeros(SLOTS, HK, D, dtype=BF16)
    state = {"fused": True}

    def create_arg(value, layer, forward_batch):
        return types.SimpleNamespace(k_buffer=pool.k.view(SLOTS, -1), v_buffer=pool.v.view(SLOTS, -1),
                                     cache_loc=forward_batch.out_cache_loc)

    utils = types.ModuleType("sglang.srt.models.utils")
    utils.enable_fused_set_kv_buffer = lambda fb: state["fused"]
    utils.get_token_to_kv_pool = lambda: pool
    utils.create_fused_set_kv_buffer_arg = create_arg
    mem = types.ModuleType("sglang.srt.mem_cache.memory_pool")
    mem.MHATokenToKVPool = pool_cls
    for name in ("sglang", "sglang.srt", "sglang.srt.models", "sglang.srt.mem_cache"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.models.utils", utils)
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.memory_pool", mem)
    sys.modules["sglang.srt.models"].utils = utils
    return pool, state


def _dense_attn():
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(3, (HQ + 2 * HK) * D, generator=g).to(BF16)
    rope = types.SimpleNamespace(cos_sin_cache=torch.zeros(64, D), is_neox_style=True)
    return types.SimpleNamespace(
        head_dim=D, num_heads=HQ, num_kv_heads=HK, q_size=HQ * D, kv_size=HK * D, rotary_emb=rope,
        qkv_proj=lambda h: (qkv, None), attn=types.SimpleNamespace(k_scale=None, v_scale=None, layer_id=0)), qkv


def test_the_dense_sites_store_only_where_sglang_would_fuse_a_plain_row_store(fake_sglang_utils):
    """_dense_store_path: SGLang's own fused-store decision first, then the pool (a subclass of the MHA pool, a
    non-NHD layout, another stored dtype) and the layer (scales, cross attention) decline; _dense_canonical runs
    the GEMM once and hands the pool layer's rows and the batch's slots to the kernel."""
    from astra_sglang.kernels.qknorm_rope_store.adapter import _dense_canonical, _dense_store_path

    pool, state = fake_sglang_utils
    attn, qkv = _dense_attn()
    fb = types.SimpleNamespace(out_cache_loc=torch.tensor([5, 0, 7]))
    assert _dense_store_path(attn, fb) is None
    state["fused"] = False
    assert "no fused KV store" in _dense_store_path(attn, fb)
    state["fused"] = True
    pool.kv_cache_layout = "hnd"
    assert "NHD" in _dense_store_path(attn, fb)
    del pool.kv_cache_layout
    attn.attn.k_scale = 0.5
    assert "scaled" in _dense_store_path(attn, fb)
    attn.attn.k_scale = None
    c = _dense_canonical(attn, torch.arange(3), torch.empty(3, 8), fb)
    assert c["site"] == "dense" and c["qkv"] is qkv and c["sizes"] == [HQ * D, HK * D, HK * D]
    assert c["q"].shape == (3, HQ, D) and c["k"].shape == (3, HK, D) and c["q"].data_ptr() == qkv.data_ptr()
    assert c["k_cache"].shape == (SLOTS, HK * D) and c["k_cache"].data_ptr() == pool.k.data_ptr()
    assert c["out_loc"] is fb.out_cache_loc and c["is_neox"] is True
