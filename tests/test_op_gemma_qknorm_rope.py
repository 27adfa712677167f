"""gemma_qknorm_rope (kernels/gemma_qknorm_rope/): the FUSED op of Gemma-3 attention, the per-head q/k norm with
(1 + w) then the rotation by the step's cos/sin rows, in place in one launch. On CPU: the spec loads through the
registry with the ABI the kernel is written against; its fp64 reference is the formula SGLang's torch code computes;
the harness runs every edge shape on CPU; production's numerics (emulated: the norm rounded, then the rotation)
stay inside its own sanity bound; the facts the adapter relies on hold in the real sglang 0.5.17 and 0.5.23 sources;
the adapter's sequence runs SGLang's own norm and rotation on the views forward_native makes, and its tail runs the
attention and o_proj as the method does.

No kernel runs on the CPU; on a GPU with SGLang installed, the last test checks the kernel against SGLang's own torch
sequence, bit for bit."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from astra_sglang.registry import get_op, op_part  # noqa: E402
from cli_run import run_cli  # noqa: E402

OP = "gemma_qknorm_rope"
SPEC = get_op(OP)
TARGET = "sglang.srt.models.gemma3_causal:Gemma3Attention.forward_native"


# ------------------------------------------------------------------------------------------ the contract
def test_spec_loads_with_the_kernel_s_abi_and_names_what_it_replaces():
    assert SPEC.symbol == "astra_gemma_qknorm_rope"
    assert SPEC.c_signature() == (
        'extern "C" cudaError_t astra_gemma_qknorm_rope(void* q, void* k, const void* q_weight, '
        "const void* k_weight, const void* cos, const void* sin, int64_t num_tokens, int64_t num_q_heads, "
        "int64_t num_kv_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride, double eps, int dtype, "
        "cudaStream_t stream)")
    kernel = op_part(OP, "spec").__file__.replace("spec.py", "kernel.cu")
    assert SPEC.c_signature().replace("extern \"C\" ", "").split("(")[0] in Path(kernel).read_text()
    assert SPEC.dim_names == get_op("qknorm_rope").dim_names
    assert SPEC.replaces == (TARGET,) and SPEC.variant("installed").callable == TARGET
    assert SPEC.default_variant({}) == "installed"
    assert SPEC.tolerance == get_op("qknorm_rope").tolerance  # production rounds the normed q/k before rotating
    assert SPEC.kernel_symbols == (r"astra_gqkr::",)
    assert SPEC.scalars((1, 16, 8, 256, 8192, 8192)) == {"eps": 1e-6}


def test_corpus_is_gemma_3_s_heads_per_rank_and_sits_between_the_qkv_gemm_and_the_kv_store():
    decode = {s.dims for s in SPEC.corpus if "decode" in s.tags}
    assert (1, 16, 8, 256, 8192, 8192) in decode            # Gemma-3-12B
    assert (16, 8, 4, 256, 4096, 4096) in decode            # Gemma-3-12B TP 2 and Gemma-3-4B
    assert (64, 8, 4, 128, 2048, 2048) in decode            # Gemma-3-27B TP 4
    assert all(s.dims[3] in (128, 256) for s in SPEC.corpus)
    (site,) = SPEC.context_sites((1, 16, 8, 256, 8192, 8192))
    assert site.name == "gemma-3-12b qkv -> q/k norm + rope -> KV store -> attention"
    assert (site.producer_k, site.norm_after, site.norm_before) == (3840, True, False)


# ------------------------------------------------------------------------------------------ reference
def _inputs(dims, dtype="bf16", seed=0, dist="normal"):
    return SPEC.make_inputs(dims, dtype, torch.Generator().manual_seed(seed), dist, device="cpu")


def _formula(x, w, cos, sin, eps):
    """SGLang's torch math in fp64 on [tokens, heads, d]: x * rsqrt(mean(x^2) + eps) * (1 + w), then
    x * cos + rotate_half(x) * sin."""
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)
    half = n.shape[-1] // 2
    rot = torch.cat([-n[..., half:], n[..., :half]], dim=-1)
    return n * cos[:, None, :] + rot * sin[:, None, :]


@pytest.mark.parametrize("dims", [(3, 4, 2, 64, 512, 512), (2, 2, 1, 256, 1024, 512), (1, 8, 4, 128, 2048, 2048)])
def test_reference_is_the_torch_formula_and_leaves_other_columns(dims):
    t, hq, hk, d, qs, ks = dims
    inp = {n: x.double() for n, x in _inputs(dims).items()}
    ref = SPEC.reference(inp, dims, {"eps": 1e-6})
    for name, heads in (("q", hq), ("k", hk)):
        x = inp[name][:, : heads * d].reshape(t, heads, d)
        want = _formula(x, inp[f"{name}_weight"], inp["cos"], inp["sin"], 1e-6)
        assert torch.allclose(ref[name][:, : heads * d].reshape(t, heads, d), want, rtol=0, atol=1e-12)
        assert torch.equal(ref[name][:, heads * d:], inp[name][:, heads * d:])


def test_reference_takes_the_patch_s_head_views():
    dims = (3, 4, 2, 64, 512, 512)
    inp = {n: x.double() for n, x in _inputs(dims).items()}
    rows = SPEC.reference(inp, dims, {"eps": 1e-6})
    views = {**inp, "q": inp["q"][:, :256].reshape(3, 4, 64), "k": inp["k"][:, :128].reshape(3, 2, 64)}
    got = SPEC.reference(views, dims, {"eps": 1e-6})
    assert got["q"].shape == (3, 4, 64)
    assert torch.allclose(got["q"].reshape(3, -1), rows["q"][:, :256], atol=1e-12)
    assert torch.allclose(got["k"].reshape(3, -1), rows["k"][:, :128], atol=1e-12)


def test_cos_sin_rows_are_gemma_3_s_duplicated_halves_in_the_model_dtype():
    pos = torch.tensor([0, 5, 8191])
    cos, sin = op_part(OP, "spec").cos_sin_rows(pos, 256, torch.bfloat16)
    assert cos.dtype == torch.bfloat16 and cos.shape == (3, 256)
    assert torch.equal(cos[:, :128], cos[:, 128:]) and torch.equal(sin[:, :128], sin[:, 128:])
    assert torch.all(cos[0] == 1) and torch.all(sin[0] == 0)
    inp = _inputs((1, 1, 1, 256, 768, 768))  # a 1-token case never draws position 0 (an all-zero sin row)
    assert inp["sin"].abs().max() > 0


def test_harness_runs_every_edge_shape_and_distribution_on_cpu(monkeypatch):
    from reference_harness import run_edge_cases_on_cpu

    monkeypatch.setattr(op_part(OP, "spec"), "MAX_POSITION", 64)
    run_edge_cases_on_cpu(SPEC)


def test_production_numerics_pass_its_own_sanity_bound():
    """Production's torch code: fp32 norm rounded to the model dtype (type_as), fp32 rotation, one rounding. Its
    error against the fp64 chain stays inside the sanity bound of the spec's floors (families/qkv.py says why they
    are raised); this is the kernel's rounding too."""
    from astra_sglang.harness.numerics import BASELINE_SLACK, rel_err, tolerance

    shapes = list(SPEC.edge_shapes) + [s for s in SPEC.corpus if "decode" in s.tags and s.dims[0] <= 16]
    for shape in shapes:
        t, hq, hk, d = shape.dims[:4]
        for dt in SPEC.dtypes:
            for dist in SPEC.distributions:
                inp = _inputs(shape.dims, dt, seed=3, dist=dist)
                ref = SPEC.reference({n: x.double() for n, x in inp.items()}, shape.dims, {"eps": 1e-6})
                for name, heads in (("q", hq), ("k", hk)):
                    x = inp[name][:, : heads * d].float().reshape(t, heads, d)
                    w = inp[f"{name}_weight"].float()
                    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w)
                    n = n.to(inp[name].dtype).float()  # type_as(x): the norm's output in the model dtype
                    half = d // 2
                    o = n * inp["cos"].float()[:, None] + torch.cat([-n[..., half:], n[..., :half]], -1) * \
                        inp["sin"].float()[:, None]
                    out = inp[name].clone()
                    out[:, : heads * d] = o.reshape(t, heads * d).to(out.dtype)
                    err = rel_err(out, ref[name])["err"]
                    assert err <= BASELINE_SLACK * tolerance(SPEC, dt, None), (shape.dims, dt, dist, name, err)


# ------------------------------------------------------------------------------------------ SGLang's sources
@pytest.mark.wheels
@pytest.mark.parametrize("which", ["0.5.17", "0.5.23"])
def test_extract_installed_checks_the_facts_in_both_versions(which, tmp_path, capsys, request):
    src = (Path(request.getfixturevalue("sglang_0_5_17_source")) if which == "0.5.17"
           else Path(request.getfixturevalue("wheel_sources")["sglang"]))
    code, _, err = run_cli(["extract", OP, "--arch", "sm_90", "--out", str(tmp_path / "ws"), "--sglang-src",
                            str(src)], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "ws" / OP / "manifest.json").read_text())
    assert m["kind"] == "installed" and m["callable"] == TARGET
    assert len(m["source_facts"]) == len(SPEC.variant("installed").source_facts)
    assert m["sources"]["sglang_py"]["version"] == which


# ------------------------------------------------------------------------------------------ the adapter
def _stub_sglang(monkeypatch):
    """Stand-ins for the two SGLang modules the sequence imports: Gemma3RMSNorm with SGLang's formula (recording the
    shapes it is called on) and apply_rotary_pos_emb (recording its cos shape)."""
    calls = []
    ln = types.ModuleType("sglang.srt.layers.layernorm")
    re_ = types.ModuleType("sglang.srt.layers.rotary_embedding")

    class Gemma3RMSNorm(torch.nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps, self.weight = eps, torch.nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            calls.append(("norm", tuple(x.shape)))
            out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
            return (out * (1.0 + self.weight.float())).type_as(x)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(("rope", tuple(cos.shape)))
        c, s = cos.unsqueeze(unsqueeze_dim).float(), sin.unsqueeze(unsqueeze_dim).float()

        def rot(x):
            h = x.shape[-1] // 2
            return torch.cat([-x[..., h:], x[..., :h]], -1)

        return ((q.float() * c + rot(q.float()) * s).to(q.dtype), (k.float() * c + rot(k.float()) * s).to(k.dtype))

    ln.Gemma3RMSNorm, re_.apply_rotary_pos_emb = Gemma3RMSNorm, apply_rotary_pos_emb
    for m in (ln, re_):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    return calls


def test_sequence_norms_the_views_forward_native_makes_then_rotates_in_place(monkeypatch):
    """On the harness's tensors (no layer): SGLang's Gemma3RMSNorm built around the op's weights, on
    [1, heads, tokens, d] views; apply_rotary_pos_emb with [1, tokens, d] rows; q and k written back in place, within
    production's rounding of the fp64 chain."""
    calls = _stub_sglang(monkeypatch)
    adapter = op_part(OP, "adapter").ADAPTER
    dims = (3, 4, 2, 64, 512, 512)
    inp = _inputs(dims)
    q, k = inp["q"][:, :256].view(3, 4, 64), inp["k"][:, :128].view(3, 2, 64)
    canon = {**inp, "q": q, "k": k, "eps": 1e-6}
    views, got_dims = adapter.normalize(canon)
    assert got_dims == dims and views["cos"] is inp["cos"]
    ref = SPEC.reference({n: x.double() for n, x in inp.items()}, dims, {"eps": 1e-6})
    adapter.sequence(canon)
    assert calls == [("norm", (1, 4, 3, 64)), ("norm", (1, 2, 3, 64)), ("rope", (1, 3, 64))]
    assert (inp["q"][:, :256].double() - ref["q"][:, :256]).abs().max() < 0.1
    assert (inp["k"][:, :128].double() - ref["k"][:, :128]).abs().max() < 0.1
    # the harness's installed baseline hands the [tokens, stride] row buffers and the shape (harness/installed.py)
    rows = _inputs(dims)
    before = rows["q"].clone()
    adapter.sequence({**rows, "eps": 1e-6, "abi_dims": dims})
    assert torch.equal(rows["q"][:, 256:], before[:, 256:])  # other heads' columns untouched
    assert (rows["q"][:, :256].double() - ref["q"][:, :256]).abs().max() < 0.1


def test_expand_declines_before_the_gemm():
    """Every reason to leave the call to SGLang is found before the layer's qkv GEMM runs."""
    expand = op_part(OP, "adapter").ADAPTER.expand

    class Layer(types.SimpleNamespace):
        def qkv_proj(self, h):
            raise AssertionError("the GEMM ran before a decline")

    layer = Layer(head_dim=256, num_heads=16, num_kv_heads=8, q_size=4096, kv_size=2048, q_norm=None, k_norm=None)
    hs = torch.zeros(2, 3840)
    cos = torch.zeros(1, 2, 256)
    args = {"self": layer, "positions": None, "hidden_states": hs, "position_embeddings": (cos, cos),
            "forward_batch": None}
    assert "CUDA" in expand(args)  # a CPU tensor
    adapter = op_part(OP, "adapter")
    assert adapter._rows_problem("cos", torch.zeros(2, 256), 2, 256, torch.float32)  # not [1, t, d]
    assert adapter._rows_problem("cos", cos, 2, 256, torch.bfloat16)                 # not the model's dtype
    assert adapter._rows_problem("cos", cos, 2, 256, torch.float32) == ""
    assert adapter._norm_problem(torch.nn.LayerNorm(256), 256, torch.float32)        # not a Gemma3RMSNorm


def test_returns_runs_the_attention_on_the_column_views_then_o_proj():
    seen = {}
    qkv = torch.randn(2, 4 * 8 + 2 * 2 * 8)

    def attention(q, k, v, forward_batch=None):
        seen.update(q=q, k=k, v=v, fb=forward_batch)
        return q.reshape(1, 2, 4, 8)  # 0.5.17's triton backend shape

    layer = types.SimpleNamespace(q_size=32, attn=attention, o_proj=lambda x: (x * 2, None))
    out = op_part(OP, "adapter")._returns({"layer": layer, "qkv": qkv, "sizes": [32, 16, 16], "forward_batch": "fb"})
    assert seen["fb"] == "fb" and seen["q"].data_ptr() == qkv.data_ptr() and seen["k"].shape == (2, 16)
    assert torch.equal(out, qkv[:, :32] * 2)


def test_astra_sglang_ops_lists_it(capsys):
    code, out, _ = run_cli(["ops"], capsys)
    assert code == 0 and OP in out and TARGET in out


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_discovery_finds_the_method_and_the_binder_takes_its_signature(version, request):
    """Gemma3Attention.forward_native(self, positions, hidden_states, position_embeddings, forward_batch, **kwargs):
    found where SGLang defines it, and bound by name (expand reads the four)."""
    import ast

    from astra_sglang.patch.adapters import Binder
    from astra_sglang.patch.discover import discover_for_specs
    from sglang_source import _class, _sglang_root

    root = _sglang_root(version, request)
    disc = discover_for_specs([SPEC], roots={"sglang": root})
    found = {(s.kind, s.module, s.local_name) for s in disc.for_op(OP)}
    assert ("definition", "sglang.srt.models.gemma3_causal", "Gemma3Attention.forward_native") in found
    cls = _class(root, "srt/models/gemma3_causal.py", "Gemma3Attention")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward_native")
    stub = ast.FunctionDef(name="forward_native", args=fn.args, body=[ast.Pass()], decorator_list=[], returns=None,
                           type_params=[])
    ns = {"torch": torch, "Tuple": object, "ForwardBatch": object}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[])), "gemma3", "exec"), ns)
    binder = Binder(ns["forward_native"], op_part(OP, "adapter").ADAPTER, SPEC)
    assert binder.ok, binder.problem


# ------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.nvcc
def test_kernel_is_bit_identical_to_sglang_s_torch_sequence(tmp_path, capsys):
    """A GPU with SGLang installed: the kernel adds its squares in the order torch's reduce kernel adds the norm's
    mean (kernel.cu, Layout), so every output of check (edge shapes either side of torch's 16-row switch, decode
    and prefill rows, bf16 and fp16) equals production's in every bit (112 of 112 on the H200, 2026-11-29)."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("needs SGLang installed: production is its torch sequence")
    code, _, err = run_cli(["extract", OP, "--variant", "installed", "--out", str(tmp_path), "--no-build"], capsys)
    assert code == 0, err
    kernel = Path(op_part(OP, "spec").__file__).with_name("kernel.cu")
    out = tmp_path / "check.json"
    code, _, err = run_cli(["check", OP, "--workspace", str(tmp_path / OP), "--candidate", str(kernel),
                            "--dtype", "bf16,fp16", "--json", str(out)], capsys)
    assert code == 0, err
    same = [d for d in json.loads(out.read_text())["details"] if d.get("identical") is not None]
    assert same and all(d["identical"] == 1.0 for d in same), [
        (d["shape"], d["dtype"], d["tensor"], d["identical"]) for d in same if d["identical"] != 1.0]
