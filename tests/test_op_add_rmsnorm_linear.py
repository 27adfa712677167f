"""add_rmsnorm_linear (kernels/add_rmsnorm_linear/): a decoder layer's fused add + RMSNorm as the prologue of linear's
decode GEMV (input_layernorm -> qkv_proj), replacing SGLang 0.5.17's LlamaDecoderLayer.forward, off by default. On
CPU: the spec (ABI, corpus, off by default, listed by `astra-sglang ops`); the fp64 reference of the whole sequence
against a float32 emulation of production's two calls (FlashInfer's norm, its output rounded, then the GEMM) and
production's own error within the op's floors; the kernel's copy of the norms' row plan block, and its sum of squares in
FlashInfer's order on every corpus and edge width (the block compiled with the host compiler, the GEMV CTA's layout
emulated sweep by sweep: test_norm_reduction_order.py's primitives); the GEMV's sums pinned to linear's source; the
harness on every edge shape; the installed baseline running SGLang's two calls out of place; the adapter's routing
with stand-in SGLang modules running 0.5.17's own layer forward and norm CUDA path, compiled from the wheel (every
decline before any work, the hand-off into qkv_proj, what the forward returns); the real SGLang 0.5.17 sources (the
replaced body, the facts, the binder); the shipped kernel's sm_90a build (registers, no spills, the ABI symbol) and
static checks.

No kernel runs here (no GPU in CI)."""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part, shipped_kernel  # noqa: E402
from cli_run import run_cli  # noqa: E402
from sglang_source import _class, _method, _sglang_root, compile_method  # noqa: E402  (the real sources)
from test_norm_reduction_order import (_butterfly, _chain, _compile_plans, _plan_source, _to_dtype,  # noqa: E402
                                       flashinfer_sum_sq, outputs)

OP = "add_rmsnorm_linear"
SPEC, AD = get_op(OP), op_part(OP, "adapter")
A = AD.ADAPTER
TARGET = "sglang.srt.models.llama:LlamaDecoderLayer.forward"
KERNEL = shipped_kernel(OP).read_text()


# ------------------------------------------------------------------------------------------ the contract
def test_spec_abi_symbols_and_what_it_replaces():
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_add_rmsnorm_linear(const void* x, const void* residual, const void* norm_weight, '
        "const void* weight, void* out, void* residual_out, void* normed, int64_t num_tokens, int64_t in_features, "
        "int64_t out_features, double eps, int dtype, cudaStream_t stream)")
    assert SPEC.c_signature().split("{")[0] in KERNEL.replace("\n                                                ", " ")
    assert SPEC.replaces == (TARGET,) and SPEC.fuses == () and SPEC.kernel_symbols == (r"astra_arl::",)
    assert SPEC.dtypes == ("fp16", "bf16") and "FUSED" in SPEC.summary
    v = SPEC.variant("installed")
    assert v.callable == TARGET and v.flag_profile == "sglang_jit" and v.extra_flags == ("--use_fast_math",)
    assert SPEC.tolerance.floor == get_op("gemma_post_attention_norms").tolerance.floor
    t, h, n = 2, 4096, 6144
    assert SPEC.bytes_moved((t, h, n), "bf16") == (4 * t * h + h + n * h + t * n) * 2


def test_corpus_is_the_dense_models_qkv_and_gate_up_at_one_and_two_tokens():
    dims = {s.dims for s in SPEC.corpus}
    for h, n in ((4096, 6144), (4096, 28672), (4096, 24576), (2560, 6144), (5120, 7168), (5120, 10240),
                 (8192, 5120), (8192, 1280), (8192, 28672), (8192, 7168)):
        assert {(1, h, n), (2, h, n)} <= dims, (h, n)
    assert {s.dims[0] for s in SPEC.corpus} == {1, 2} and all("decode" in s.tags for s in SPEC.corpus)
    # every row is one the adapter takes (linear's rule: <= 12288 inputs; the kernel's: H <= 8192)
    assert all(AD.declined(*s.dims) is None for s in SPEC.corpus)
    assert all(s.dims[1] % 8 == 0 and s.dims[1] <= AD.MAX_HIDDEN for s in tuple(SPEC.corpus) + SPEC.edge_shapes)
    assert AD.declined(3, 4096, 6144) and AD.declined(1, 8200, 6144) and AD.declined(1, 4100, 6144)


def test_off_by_default_patched_when_named_and_binds_the_layer_forward():
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.adapters import Binder, adapter_mismatch
    from astra_sglang.patch.config import default_ops, parse_ops

    assert AD.DEFAULT_OFF.startswith("slower than the norm + astra linear")
    known = patchable_ops()
    assert OP in known and OP not in parse_ops("all", known, default_ops(known))
    assert parse_ops(f"all,{OP}", known, default_ops(known))[-1] == OP and parse_ops(OP, known) == [OP]
    assert adapter_mismatch(SPEC, A) is None

    def forward(self, positions, hidden_states, forward_batch, residual):  # LlamaDecoderLayer.forward's (0.5.17)
        raise AssertionError("not called")

    assert Binder(forward, A, SPEC).ok


def test_astra_sglang_ops_lists_it(capsys):
    code, out, _ = run_cli(["ops", "--json"], capsys)
    assert code == 0
    row = {r["op"]: r for r in json.loads(out)}[OP]
    assert row["kernel"] and row["validate"] and row["missing"] == []
    assert row["extract"] == ["installed"] and row["patch"] == [TARGET] and row["default_off"] == AD.DEFAULT_OFF


def test_layer_imports_without_sglang():
    assert callable(op_part(OP, "layer").run_layer)


def test_profile_attributes_astra_s_kernel_to_this_op():
    from astra_sglang.e2e.attribution import classify

    m = classify("void astra_arl::(anonymous namespace)::add_rmsnorm_linear_kernel<__nv_bfloat16, 1, 2>(...)", "silu")
    assert (m.op, m.astra) == (OP, True), m


# ------------------------------------------------------------------------------------------ the reference
def _np(t):
    return t.float().numpy()


def _production_f32(x, r, w, weight, dtype, eps=np.float32(1e-5)):
    """Production's two calls in float32: FlashInfer's fused add + RMSNorm operation for operation
    (test_norm_reduction_order's emulation, 16-byte vectors), its output rounded to the dtype in place of x, then the
    GEMM on it (fp32 accumulation; its order moves the sum far below the dtype's ulp: fp64 here) rounded."""
    import test_norm_reduction_order as nro

    s = (x + r).astype(np.float32)
    ss = flashinfer_sum_sq(s, 8)
    old, nro.EPS = nro.EPS, np.float32(eps)
    try:
        y = outputs(s, w, ss, 0.0, dtype)
    finally:
        nro.EPS = old
    out = _to_dtype((y.astype(np.float64) @ weight.astype(np.float64).T).astype(np.float32), dtype)
    return out, _to_dtype(s, dtype), y


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dist", ["normal", "large", "uniform"])
def test_reference_is_production_s_sequence_with_the_normed_row_rounded(dtype, dist):
    dims = (2, 2560, 96)
    inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(3), dist, device="cpu")
    assert set(inp) == {"x", "residual", "norm_weight", "weight", "out", "residual_out", "normed"}
    out, res, y = _production_f32(_np(inp["x"]), _np(inp["residual"]), _np(inp["norm_weight"]), _np(inp["weight"]),
                                  dtype)
    ref = SPEC.reference({k: v.double() for k, v in inp.items()}, dims, SPEC.scalars(dims),
                         model_dtype=inp["x"].dtype)
    td = inp["x"].dtype
    assert np.array_equal(ref["residual_out"].to(td).float().numpy(), res)  # one rounding of an exact sum
    assert np.mean(ref["normed"].to(td).float().numpy() == y) > 0.99
    ulp = 2.0 ** (-8 if dtype == "bf16" else -11)
    assert np.abs(ref["out"].numpy() - out).max() <= 4 * ulp * np.abs(out).max()
    # the intermediate rounding is there: the GEMV of the unrounded normed row is another value
    unrounded = ref["normed"] @ inp["weight"].double().t()
    assert not torch.equal(unrounded, ref["out"])
    assert torch.equal(ref["normed"].to(td).double() @ inp["weight"].double().t(), ref["out"])
    # the same reference called with the model tensors infers the dtype (gate_up_silu's rule)
    assert torch.equal(SPEC.reference(inp, dims, SPEC.scalars(dims))["out"], ref["out"])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_production_s_own_error_stays_within_its_sanity_bound(dtype):
    """The oracle judges production first, against BASELINE_SLACK x the floor: the emulated production's error on
    every output, over 8 x 64 rows of Llama-3-8B's width, fits the op's floors (families/qkv.py's)."""
    from astra_sglang.harness.numerics import BASELINE_SLACK, rel_err, tolerance

    worst = {}
    dims = (64, 4096, 64)
    for seed in range(8):
        for dist in SPEC.distributions:
            inp = SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(seed), dist, device="cpu")
            got = _production_f32(_np(inp["x"]), _np(inp["residual"]), _np(inp["norm_weight"]), _np(inp["weight"]),
                                  dtype)
            ref = SPEC.reference({k: v.double() for k, v in inp.items()}, dims, SPEC.scalars(dims),
                                 model_dtype=inp["x"].dtype)
            for g, name in zip(got, ("out", "residual_out", "normed")):
                e = rel_err(torch.from_numpy(g).to(inp["x"].dtype), ref[name])["err"]
                worst[name] = max(worst.get(name, 0.0), e)
    assert max(worst.values()) <= BASELINE_SLACK * tolerance(SPEC, dtype, None), worst
    assert 0 < worst["out"] and 0 < worst["normed"], worst


def test_harness_runs_every_edge_shape_on_cpu():
    from reference_harness import run_edge_cases_on_cpu

    run_edge_cases_on_cpu(SPEC)


# ------------------------------------------------------------------------------------------ FlashInfer's order
def test_the_row_plan_block_is_the_norms_one():
    assert _plan_source(OP) == _plan_source("fused_add_rmsnorm")
    # the kernel reads only n_fi of the plan, and takes only rows whose FlashInfer threads own one vector each
    assert "row_plan(static_cast<uint32_t>(h / 8), false, p);" in KERNEL
    assert "if (p.n_fi < static_cast<uint32_t>(h / 8)) return cudaErrorInvalidValue;" in KERNEL
    assert "constexpr int kMaxIters = 4;" in KERNEL and "constexpr int kThreads = 256;" in KERNEL


def _gemv_sum_sq(x, n_fi, threads=256, warps=8, swap=False):
    """kernel.cu's sum of squares of each row of x (rows, d), 16-byte vectors: GEMV thread i at sweep j holds vector
    j * threads + i alone (one fma chain), each (warp, sweep) butterfly goes to red[j * warps + warp], and every warp
    butterflies red[:n_fi / 32] zero padded to 32. swap: red[warp * sweeps + j] instead (a wrong layout the test
    must catch)."""
    rows, d = x.shape
    nv = d // 8
    sweeps = -(-nv // threads)
    xv = np.concatenate([x.reshape(rows, nv, 8), np.zeros((rows, 1, 8), np.float32)], axis=1)
    red = np.zeros((rows, 32), np.float32)
    for j in range(sweeps):
        for w in range(warps):
            v = j * threads + w * 32 + np.arange(32)
            s = _chain(xv[:, np.where(v < nv, v, nv), :].reshape(rows, 32, 8))
            red[:, w * sweeps + j if swap else j * warps + w] = _butterfly(s)
    return _butterfly(np.where(np.arange(32) < n_fi // 32, red, np.float32(0)))


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("needs a host C++ compiler")
    return _compile_plans(cxx, tmp_path_factory.mktemp("arl_plan"), "arl", _plan_source(OP))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_norm_sums_in_flashinfer_s_order_on_every_width(dtype, plans):
    """The kernel's layout (kernel.cu's red index and cross-warp butterfly, pinned below) gives FlashInfer's sum of
    squares bit for bit on every corpus and edge width, so residual_out and normed equal production's; a layout
    with the sweeps and warps swapped does not, on some width."""
    assert "if (lane == 0) red[t][j * kWarps + warp] = ss;" in KERNEL
    assert "const float ss = warp_sum(lane < nred ? red[t][lane] : 0.f);" in KERNEL
    assert "const float v = to_f(a[e]) + to_f(b[e]);\n        s += v * v;" in KERNEL
    assert "rcp[t] = rsqrtf(ss / fd + eps);" in KERNEL
    assert "from_f<T>(s * rcp[t] * (kWeightBias + to_f(gw[e])))" in KERNEL
    widths = sorted({s.dims[1] for s in tuple(SPEC.corpus) + tuple(SPEC.edge_shapes)})
    rng = np.random.default_rng(5)
    swapped_differs = False
    for d in widths:
        nv = d // 8
        n_fi = plans[nv][1]
        assert n_fi == 32 * -(-min(1024, nv) // 32) and n_fi >= nv, (d, plans[nv])
        x = _to_dtype(rng.standard_normal((3, d), np.float32) * 4, dtype)
        r = _to_dtype(rng.standard_normal((3, d), np.float32) * 8, dtype)
        s = (x + r).astype(np.float32)
        ss = _gemv_sum_sq(s, n_fi)
        assert np.array_equal(ss, flashinfer_sum_sq(s, 8)), d
        swapped_differs |= not np.array_equal(_gemv_sum_sq(s, n_fi, swap=True), ss)
    assert swapped_differs


def test_the_gemv_sums_in_linear_s_order():
    """out is astra linear's on the normed row: the same per-thread FMA chain over a vector's 8 elements (vectors in
    sweep order), the same warp butterfly and the same sum of the 8 warps' partials in warp order."""
    lin = shipped_kernel("linear").read_text()
    fma = r"for \(int (\w) = 0; \1 < 8; \+\+\1\) acc\[r\]\[t\] = fmaf\(a\[\1\], b\[r\]\[\1\], acc\[r\]\[t\]\);"
    assert re.search(fma, lin) and re.search(fma, KERNEL)
    for text in ("for (int v0 = 0; v0 < nvec; v0 += kThreads) {",
                 "for (int p = 0; p < kWarps; ++p) s += part[p][threadIdx.x];",
                 "const float s = warp_sum(acc[r][t]);\n      if (lane == 0) part[warp][r * NT + t] = s;",
                 "for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);", "constexpr int kRows = 4;"):
        assert text in lin and text in KERNEL, text


# ------------------------------------------------------------------------------------------ the adapter's routing
@pytest.fixture
def sg(monkeypatch, sglang_unquant_standin, sglang_0_5_17_source):
    """Stand-in sglang.srt.layers.layernorm (RMSNorm running SGLang 0.5.17's forward_cuda, which calls the module's
    fused_add_rmsnorm), sglang.srt.layers.linear (QKVParallelLinear counting its own calls) and sglang.srt.models.llama
    (LlamaDecoderLayer running 0.5.17's forward); both methods compiled from the wheel; CPU tensors allowed."""
    monkeypatch.setattr(AD, "DEVICES", ("cuda", "cpu"))
    monkeypatch.delitem(sys.modules, "sglang.kernels.fused_op", raising=False)
    root = Path(sglang_0_5_17_source) / "sglang"
    calls = {"norm": 0, "qkv": 0, "attn": 0, "post": 0, "mlp": 0}

    def fused_add_rmsnorm(x, r, w, eps):
        calls["norm"] += 1
        s = x.float() + r.float()
        r.copy_(s.to(r.dtype))
        x.copy_((s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype))

    ln = types.ModuleType("sglang.srt.layers.layernorm")
    ln.fused_add_rmsnorm, ln.is_batch_invariant_mode_enabled = fused_add_rmsnorm, lambda: False
    monkeypatch.setitem(sys.modules, ln.__name__, ln)

    class RMSNorm(torch.nn.Module):
        def __init__(self, h, eps=1e-5, dtype=torch.bfloat16):
            super().__init__()
            self.weight = torch.nn.Parameter((1 + 0.25 * torch.randn(h)).to(dtype), requires_grad=False)
            self.variance_epsilon, self.is_torch_compile = eps, False
            self.cast_x_before_out_mul, self.variance_size_override = False, None
            self._forward_method = self.forward_cuda

        def forward(self, *a, **k):
            return self._forward_method(*a, **k)

        def forward_native(self, x, residual=None):
            raise AssertionError("native")

    ln.RMSNorm = RMSNorm
    RMSNorm.forward_cuda = compile_method(root, "srt/layers/layernorm.py", "RMSNorm", "forward_cuda", vars(ln))
    lin = types.ModuleType("sglang.srt.layers.linear")

    class QKVParallelLinear(torch.nn.Module):
        def __init__(self, h, n, dtype):
            super().__init__()
            self.weight = (torch.randn(n, h) / h ** 0.5).to(dtype)
            self.bias, self.gather_output = None, False
            self.quant_method = sglang_unquant_standin.UnquantizedLinearMethod()

        def forward(self, input_):
            calls["qkv"] += 1
            return torch.nn.functional.linear(input_, self.weight), None

    lin.QKVParallelLinear = QKVParallelLinear
    monkeypatch.setitem(sys.modules, lin.__name__, lin)

    class Attention:
        def __init__(self, qkv):
            self.qkv_proj, self.seen = qkv, []

        def __call__(self, positions, hidden_states, forward_batch):
            calls["attn"] += 1
            self.seen.append(hidden_states)
            qkv, _ = self.qkv_proj(hidden_states)  # forward_prepare_native's first step
            return qkv[:, : hidden_states.shape[1]] * 0.5

    llama = types.ModuleType("sglang.srt.models.llama")

    class LlamaDecoderLayer(torch.nn.Module):
        pass

    llama.LlamaDecoderLayer = LlamaDecoderLayer
    LlamaDecoderLayer.forward = compile_method(root, "srt/models/llama.py", "LlamaDecoderLayer", "forward", vars(llama))
    monkeypatch.setitem(sys.modules, llama.__name__, llama)

    def post(h, r):
        calls["post"] += 1
        return h + r, r

    def mlp(h):
        calls["mlp"] += 1
        return h * 2

    def make(h=64, n=192, dtype=torch.bfloat16):
        layer = LlamaDecoderLayer()
        layer.input_layernorm = RMSNorm(h, dtype=dtype)
        layer.self_attn = Attention(QKVParallelLinear(h, n, dtype))
        layer.post_attention_layernorm, layer.mlp = post, mlp
        return layer

    return types.SimpleNamespace(make=make, calls=calls, ln=ln, lin=lin, llama=llama, unquant=sglang_unquant_standin)


def _kernel_cpu(c):
    """What the kernel writes, from the spec's reference (CPU stand-in)."""
    ins = {k: c[k] for k in ("x", "residual", "norm_weight", "weight")}
    ref = SPEC.reference({k: v.double() for k, v in ins.items()}, None, {"eps": c["eps"]}, model_dtype=c["x"].dtype)
    for k in ("out", "residual_out", "normed"):
        c[k].copy_(ref[k].to(c[k].dtype))


def _args(layer, x, r):
    return {"self": layer, "positions": None, "hidden_states": x, "forward_batch": types.SimpleNamespace(),
            "residual": r}


@pytest.mark.parametrize("tokens", [1, 2])
def test_expand_takes_a_decode_layer_without_work_and_returns_what_sglang_s_forward_returns(sg, tokens):
    layer = sg.make()
    x, r = torch.randn(tokens, 64).to(torch.bfloat16), torch.randn(tokens, 64).to(torch.bfloat16)
    x0, r0 = x.clone(), r.clone()
    c = A.expand(_args(layer, x, r))
    assert isinstance(c, dict) and sum(sg.calls.values()) == 0  # no work of the method's own
    assert c["weight"] is layer.self_attn.qkv_proj.weight
    assert c["norm_weight"].data_ptr() == layer.input_layernorm.weight.data_ptr()
    assert c["eps"] == 1e-5 and c["out"].shape == (tokens, 192)
    views, dims = A.normalize(c)
    assert dims == (tokens, 64, 192) and set(views) == {a.name for a in SPEC.abi if a.ctype == "ptr"}
    _kernel_cpu(c)
    got_h, got_r = A.returns(c)
    # the attention ran once on the normed row, and qkv_proj's own forward never ran: the kernel's projection did
    assert sg.calls == {"norm": 0, "qkv": 0, "attn": 1, "post": 1, "mlp": 1}
    assert layer.self_attn.seen[-1] is c["normed"] and "forward" not in vars(layer.self_attn.qkv_proj)
    assert torch.equal(x, x0) and torch.equal(r, r0)  # out of place
    want_h, want_r = sg.llama.LlamaDecoderLayer.forward(layer, None, x.clone(), None, r.clone())
    assert torch.equal(got_r, want_r)
    assert (got_h.float() - want_h.float()).abs().max() <= 0.05 * want_h.float().abs().max()
    # `sequence` (production, and the fallback) writes the same outputs
    for k in ("out", "residual_out", "normed"):
        c[k].zero_()
    A.sequence(c)
    assert torch.equal(c["residual_out"], want_r) and torch.equal(c["normed"], layer.self_attn.seen[-1])


def test_the_hand_off_runs_qkv_proj_s_own_forward_on_any_other_input(sg):
    layer = sg.make()
    x, r = torch.randn(1, 64).to(torch.bfloat16), torch.randn(1, 64).to(torch.bfloat16)
    c = A.expand(_args(layer, x, r))
    _kernel_cpu(c)
    qkv = layer.self_attn.qkv_proj

    class Other:
        def __call__(self, positions, hidden_states, forward_batch):
            out, _ = qkv(hidden_states.clone())  # not the normed tensor itself: its own GEMM
            return out[:, :64]

    other = Other()
    other.qkv_proj = qkv
    layer.self_attn = other
    A.returns(c)
    assert sg.calls["qkv"] == 1 and "forward" not in vars(qkv)


def test_installed_impl_runs_sglang_s_two_calls_out_of_place(sg):
    """check / bench's production: the installed LlamaDecoderLayer.forward's binder runs `sequence`: SGLang's
    fused_add_rmsnorm on copies (the ABI's x and residual stay as they were), then F.linear into out."""
    from astra_sglang.harness.installed import InstalledImpl

    impl = InstalledImpl(TARGET, SPEC)
    assert impl.fn is sg.llama.LlamaDecoderLayer.forward
    dims = (2, 64, 48)
    t = SPEC.make_inputs(dims, "bf16", torch.Generator().manual_seed(1), device="cpu")
    x0, r0 = t["x"].clone(), t["residual"].clone()
    impl(t, dims, "bf16", SPEC.scalars(dims))
    assert sg.calls["norm"] == 1 and torch.equal(t["x"], x0) and torch.equal(t["residual"], r0)
    ref = SPEC.reference({k: v.double() for k, v in t.items()}, dims, SPEC.scalars(dims), model_dtype=torch.bfloat16)
    assert torch.equal(t["residual_out"], ref["residual_out"].to(torch.bfloat16))
    assert (t["normed"].double() - ref["normed"]).abs().max() <= 2 ** -7 * ref["normed"].abs().max()
    assert torch.equal(t["out"], torch.nn.functional.linear(t["normed"], t["weight"]))


_DECLINES = [
    ("3 tokens", lambda L, x, r: (x.repeat(3, 1), r.repeat(3, 1)), "3 tokens > 2"),
    ("no residual", lambda L, x, r: (x, None), "no residual"),
    ("fp32", lambda L, x, r: (x.float(), r.float()), "not fp16 / bf16"),
    ("1-D", lambda L, x, r: (x[0], r[0]), "not a 2-D"),
    ("residual dtype", lambda L, x, r: (x, r.half()), "residual is not"),
]


def test_expand_says_0_5_23_s_layer_takes_no_residual(sg):
    """0.5.23's LlamaDecoderLayer.forward(positions, hidden_states, forward_batch, capture_output) has no residual (its
    input norm runs in attn_boundary.prepare): the op is never this layer's, and says why, not "the first layer"."""
    a = _args(sg.make(), torch.randn(1, 64).to(torch.bfloat16), None)
    del a["residual"]
    got = A.expand({**a, "capture_output": None})
    assert isinstance(got, str) and "takes no residual" in got, got
    assert sum(sg.calls.values()) == 0


@pytest.mark.parametrize("what,edit,why", _DECLINES)
def test_expand_declines_bad_arguments_before_any_work(sg, what, edit, why):
    layer = sg.make()
    x, r = edit(layer, torch.randn(1, 64).to(torch.bfloat16), torch.randn(1, 64).to(torch.bfloat16))
    got = A.expand(_args(layer, x, r))
    assert isinstance(got, str) and why in got, got
    assert sum(sg.calls.values()) == 0


def _edit_layer(sg, what):
    layer = sg.make()
    if what == "layer":
        layer = torch.nn.Module()
    elif what == "norm class":
        layer.input_layernorm = torch.nn.LayerNorm(64)
    elif what == "native":
        layer.input_layernorm._forward_method = layer.input_layernorm.forward_native
    elif what == "compile":
        layer.input_layernorm.is_torch_compile = True
    elif what == "hf cast":
        layer.input_layernorm.cast_x_before_out_mul = True
    elif what == "variance":
        layer.input_layernorm.variance_size_override = 32
    elif what == "hooked":
        layer.input_layernorm.register_forward_hook(lambda m, a, out: None)
    elif what == "invariant":
        sg.ln.is_batch_invariant_mode_enabled = lambda: True
    elif what == "qkv class":
        layer.self_attn.qkv_proj = torch.nn.Linear(64, 192)
    elif what == "bias":
        layer.self_attn.qkv_proj.bias = torch.zeros(192)
    elif what == "quantized":
        layer.self_attn.qkv_proj.quant_method = object()
    elif what == "hand-off":
        layer.self_attn.qkv_proj.forward = lambda x: (x, None)
    elif what == "weight dtype":
        layer.self_attn.qkv_proj.weight = layer.self_attn.qkv_proj.weight.half()
    elif what == "wide":
        layer = sg.make(h=8200, n=64)
    return layer


@pytest.mark.parametrize("what,why", [
    ("layer", "not SGLang's LlamaDecoderLayer"), ("norm class", "not SGLang's RMSNorm"),
    ("native", "not forward_cuda"), ("compile", "torch.compile"), ("hf cast", "HF parity"),
    ("variance", "variance size override"), ("hooked", "module hooks"), ("invariant", "batch-invariant"),
    ("qkv class", "QKVParallelLinear"),
    ("bias", "has a bias"), ("quantized", "not the unquantized linear"), ("hand-off", "instance attribute"),
    ("weight dtype", "qkv_proj's weight is torch.float16"), ("wide", "8200 > 8192"),
])
def test_expand_declines_layers_it_does_not_fuse_before_any_work(sg, what, why):
    layer = _edit_layer(sg, what)
    h = 8200 if what == "wide" else 64
    x, r = torch.randn(1, h).to(torch.bfloat16), torch.randn(1, h).to(torch.bfloat16)
    got = A.expand(_args(layer, x, r))
    assert isinstance(got, str) and why in got, got
    assert sum(sg.calls.values()) == 0


def test_the_shape_rule_is_validate_s_n_a_and_the_precheck_s_token_limit():
    assert A.max_tokens == 2 and A.keeps((1, 4096, 6144)) is None and "8192" in A.keeps((1, 8192 * 2, 64))
    assert A.precheck((None, None, torch.empty(3, 8)), {}) and A.precheck((None, None, torch.empty(2, 8)), {}) is None


# ------------------------------------------------------------------------------------------ the real sources
_LLAMA_BODY = [
    "if residual is None:\n    residual = hidden_states\n    hidden_states = self.input_layernorm(hidden_states)\n"
    "else:\n    hidden_states, residual = self.input_layernorm(hidden_states, residual)",
    "hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states, forward_batch=forward_batch)",
    "hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)",
    "hidden_states = self.mlp(hidden_states)", "return (hidden_states, residual)",
]


@pytest.mark.wheels
def test_the_replaced_forward_is_the_sequence_the_adapter_reproduces(request):
    """0.5.17's LlamaDecoderLayer.forward: the norm with a residual, the attention on its output (qkv_proj first in
    forward_prepare_native), then what `returns` runs. 0.5.23 rewrote it (attn_boundary): not this op's."""
    root = _sglang_root("0.5.17", request)
    fn = _method(_class(root, "srt/models/llama.py", "LlamaDecoderLayer"), "forward")
    assert [ast.unparse(n) for n in fn.body] == _LLAMA_BODY
    prep = _method(_class(root, "srt/models/llama.py", "LlamaAttention"), "forward_prepare_native")
    assert ast.unparse(prep.body[0]) == "qkv, _ = self.qkv_proj(hidden_states)"
    new = _method(_class(_sglang_root("0.5.23", request), "srt/models/llama.py", "LlamaDecoderLayer"), "forward")
    assert "attn_boundary" in ast.unparse(new)


@pytest.mark.wheels
def test_extract_installed_checks_the_facts_in_0_5_17_and_refuses_0_5_23(tmp_path, capsys, request):
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"),
                            "--sglang-src", str(_sglang_root("0.5.17", request).parent)], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / OP / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == TARGET
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert "--use_fast_math" in m["flags"]
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws23"),
                            "--sglang-src", str(_sglang_root("0.5.23", request).parent)], capsys)
    assert code != 0 and "LlamaDecoderLayer" in err, err


@pytest.mark.wheels
def test_discovery_finds_the_layer_forward_and_the_binder_takes_its_real_signature(request):
    from astra_sglang.patch.adapters import Binder
    from astra_sglang.patch.discover import discover_for_specs

    root = _sglang_root("0.5.17", request)
    disc = discover_for_specs([SPEC], roots={"sglang": root})
    found = {(s.kind, s.module, s.local_name) for s in disc.for_op(OP)}
    assert ("definition", "sglang.srt.models.llama", "LlamaDecoderLayer.forward") in found
    b = Binder(compile_method(root, "srt/models/llama.py", "LlamaDecoderLayer", "forward", {}), A, SPEC)
    assert b.ok and b.params == ("self", "positions", "hidden_states", "forward_batch", "residual")


# ------------------------------------------------------------------------------------------ the shipped kernel
@pytest.mark.nvcc
def test_shipped_kernel_builds_with_the_op_s_flags_and_passes_the_static_checks(tmp_path, monkeypatch):
    if not shutil.which("nm"):
        pytest.skip("needs binutils nm")
    from astra_sglang.build import Arch, kernel_flags
    from astra_sglang.patch.apply import build_kernel
    from astra_sglang.static_checks import errors, scan_file

    assert not errors(scan_file(shipped_kernel(OP), []))
    assert "namespace astra_arl {" in KERNEL and '#include "' not in KERNEL
    # linear's memory pattern: the first weights issued before the PDL wait, streamed past L1, the trigger after it
    assert "ld.global.nc.L1::no_allocate" in KERNEL
    first = KERNEL.index("wv[r] = live ? load_stream(wrow[r] + threadIdx.x)")
    wait = KERNEL.index("pdl_wait();  // x and residual")
    assert first < wait < KERNEL.index("__ldg(reinterpret_cast<const uint4*>(x)")
    assert first < KERNEL.index("prefetch_l1(reinterpret_cast<const uint4*>(nw)") < wait  # the norm weight into L1
    # residual_out and normed by CTA 0 alone, out of place
    assert "const bool writer = blockIdx.x == 0;" in KERNEL and "reinterpret_cast<uint4*>(res_out)[o] = rs;" in KERNEL
    assert "--use_fast_math" in kernel_flags(SPEC, Arch(9, 0))  # the norm's math as sgl-kernel builds it on sm_90
    monkeypatch.setenv("ASTRA_CACHE_DIR", str(tmp_path))
    lib = build_kernel(OP, arch="sm_90")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert [ln.split()[-1] for ln in syms.splitlines() if " T " in ln] == [SPEC.symbol]


@pytest.mark.nvcc
def test_no_register_spills_at_sm_90a_and_the_registers_of_linear_s_occupancy(tmp_path):
    """Every instantiation (2 dtypes x 1-2 tokens x 1-4 sweeps) without spills and at most 72 registers: 3 CTAs of 256
    threads per SM at worst (64 at H 4096: 4, linear's FMA path 38-48: 5); the norm's fast-math instructions in
    the PTX."""
    from astra_sglang.build import Arch, kernel_flags

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    flags = kernel_flags(SPEC, Arch(9, 0))
    r = subprocess.run([nvcc, *flags, "-Xptxas", "-v", "-c", str(shipped_kernel(OP)), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", r.stderr)]
    assert len(spills) == len(regs) == 16 and all(s == ("0", "0") for s in spills), r.stderr
    assert max(regs) <= 72, regs
    ptx = subprocess.run([nvcc, *flags, "-ptx", str(shipped_kernel(OP)), "-o", str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, timeout=600)
    assert ptx.returncode == 0, ptx.stderr[-2000:]
    text = (tmp_path / "k.ptx").read_text()
    assert "rsqrt.approx.ftz.f32" in text and "div.approx.ftz.f32" in text and "griddepcontrol.wait" in text


def test_results_md_names_the_gpu_commands():
    text = (Path(AD.__file__).parent / "RESULTS.md").read_text()
    assert "slower in the step, off by default" in text and "+2.69%" in text  # the H200 session's verdict
    for cmd in ("astra-sglang extract add_rmsnorm_linear", "astra-sglang check add_rmsnorm_linear",
                "astra-sglang bench add_rmsnorm_linear", "e2e --step"):
        assert cmd in text, cmd
