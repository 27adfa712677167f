"""The norm and activation family (issue 14): rmsnorm, gemma_rmsnorm, gemma_fused_add_rmsnorm, gelu_and_mul,
gelu_tanh_and_mul. Each is one folder under kernels/; these tests hold each to the op contract on CPU:
the registry sees every part, the corpora come from real configs, the fp64 references agree with
independent formulas (and with SGLang's own forward_native), extraction from the real wheels builds for
sm_90 with nvcc alone, the source facts hold in sglang 0.5.23 and 0.5.17, and the patch adapters bind
SGLang's real callables (RMSNorm / GemmaRMSNorm / GeluAndMul layers on CPU, sglang_cpu_env)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from astra_sglang.models import ALL_MODELS, MODELS, MORE_MODELS, model
from astra_sglang.registry import get_op, op_dir, op_names, op_part

FAMILY = ("rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "gelu_and_mul", "gelu_tanh_and_mul")
NORMS = FAMILY[:3]
ACTS = FAMILY[3:]
DEFAULT_VARIANT = {"rmsnorm": "flashinfer", "gemma_rmsnorm": "flashinfer", "gemma_fused_add_rmsnorm": "flashinfer",
                   "gelu_and_mul": "jit", "gelu_tanh_and_mul": "jit"}
ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- registry and specs


def test_every_family_op_is_one_complete_folder():
    from astra_sglang.ops_cli import op_rows

    rows = {r["op"]: r for r in op_rows()}
    for op in FAMILY:
        assert op in op_names()
        r = rows[op]
        assert r["missing"] == [], (op, r["missing"])
        assert r["extract"] == [DEFAULT_VARIANT[op]] and r["kernel"] and r["validate"] and r["patch"]
        d = op_dir(op)
        for part in ("__init__.py", "spec.py", "kernel.cu", "adapter.py", "layer.py"):
            assert (d / part).is_file(), (op, part)
        # the shipped kernel is self-contained: toolkit headers only, the ABI symbol, no torch
        src = (d / "kernel.cu").read_text()
        includes = set(re.findall(r'#include [<"]([^>"]+)[>"]', src))
        assert includes <= {"cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "stdint.h"}, includes
        assert get_op(op).c_signature().split("(")[0] in src


def test_models_added_without_changing_the_existing_corpora():
    names = [m.name for m in ALL_MODELS]
    assert len(names) == len(set(names))
    assert not {m.name for m in MORE_MODELS} & {m.name for m in MODELS}
    # the earlier ops' corpora come from MODELS alone: every existing entry keeps the defaults
    assert all(m.act == "silu" and m.norm == "rms" and m.moe_intermediate == 0 for m in MODELS)
    assert model("gemma-2-9b").act == "gelu_tanh" and model("gemma-2-9b").norm == "gemma"
    assert model("gemma-7b").act == "gelu"
    assert model("qwen3-30b-a3b").moe_intermediate == 768 and model("gpt-oss-120b").hidden == 2880
    with pytest.raises(KeyError, match="unknown model"):
        model("no-such-model")


@pytest.mark.parametrize("op", FAMILY)
def test_corpus_from_real_configs(op):
    spec = get_op(op)
    tags = {t for s in spec.corpus for t in s.tags}
    assert {"decode", "prefill"} <= tags
    toks = {s.dims[0] for s in spec.corpus}
    assert {1, 16, 64, 256} <= toks and max(toks) >= 1024
    assert all(s.source for s in spec.corpus)
    widths = {s.dims[1] for s in spec.corpus}
    if op == "rmsnorm":  # DeepSeek-V3's MLA lora ranks every layer, hidden sizes incl. gpt-oss 2880
        assert {512, 1536, 4096, 7168, 2880} <= widths
    elif op.startswith("gemma"):
        assert widths == {model(n).hidden for n in ("gemma-2-2b", "gemma-2-9b", "gemma-3-12b", "gemma-3-27b")}
    elif op == "gelu_tanh_and_mul":  # TP-sharded widths
        assert {21504, 21504 // 2, 21504 // 4, 14336, 15360} == widths
    else:
        assert {16384, 24576, 12288} == widths
    # edge shapes cover widths that are not a multiple of the 16-byte vector
    assert any(s.dims[1] % 8 for s in spec.edge_shapes)
    assert any(s.dims[1] % 2 for s in spec.edge_shapes)
    assert spec.dtypes[:2] == ("fp16", "bf16")


@pytest.mark.parametrize("op", FAMILY)
def test_make_inputs_and_bytes_moved(op):
    import torch

    spec = get_op(op)
    dims = (3, 40)
    for dt in spec.dtypes:
        for dist in spec.distributions:
            inp = spec.make_inputs(dims, dt, torch.Generator().manual_seed(0), dist=dist, device="cpu")
            ptrs = [a.name for a in spec.abi if a.ctype == "ptr"]
            assert sorted(inp) == sorted(ptrs), (op, sorted(inp))
            for t in inp.values():
                assert t.dtype == {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dt]
                assert t.is_contiguous() and t.shape[-1] in (40, 80)
    e = 2
    want = {"rmsnorm": (2 * 3 * 40 + 40) * e, "gemma_rmsnorm": (2 * 3 * 40 + 40) * e,
            "gemma_fused_add_rmsnorm": (4 * 3 * 40 + 40) * e, "gelu_and_mul": 3 * 3 * 40 * e,
            "gelu_tanh_and_mul": 3 * 3 * 40 * e}[op]
    assert spec.bytes_moved(dims, "fp16") == want


def _independent(op, inp, d, eps):
    """Each reference recomputed another way (float64, elementwise formulas)."""
    import torch

    if op in ACTS:
        g, u = inp["input"].double()[:, :d], inp["input"].double()[:, d:]
        if op == "gelu_and_mul":
            cdf = 0.5 * (1.0 + torch.special.erf(g / math.sqrt(2.0)))
        else:
            cdf = 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))
        return {"out": g * cdf * u}
    x = inp["input"].double()
    if op == "gemma_fused_add_rmsnorm":
        x = x + inp["residual"].double()
    w = inp["weight"].double() + (1.0 if op.startswith("gemma") else 0.0)
    y = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * w
    return {"out": y} if op != "gemma_fused_add_rmsnorm" else {"input": y, "residual": x}


@pytest.mark.parametrize("op", FAMILY)
def test_fp64_reference_matches_an_independent_formula(op):
    import torch

    spec = get_op(op)
    dims = (5, 96)
    for dist in spec.distributions:
        inp = spec.make_inputs(dims, "fp32", torch.Generator().manual_seed(1), dist=dist, device="cpu")
        sc = spec.scalars(dims)
        ref = spec.reference(inp, dims, sc)
        want = _independent(op, inp, dims[1], sc.get("eps", 0.0))
        assert sorted(ref) == sorted(want)
        for k in ref:
            assert ref[k].dtype == torch.float64 and ref[k].shape == want[k].shape
            torch.testing.assert_close(ref[k], want[k], rtol=1e-12, atol=1e-12)
    if op in NORMS:  # the gemma weight really is offset by one: a zero weight is the plain norm
        inp = spec.make_inputs(dims, "fp32", torch.Generator().manual_seed(2), device="cpu")
        inp["weight"].zero_()
        out = spec.reference(inp, dims, spec.scalars(dims))
        key = "input" if op == "gemma_fused_add_rmsnorm" else "out"
        assert bool((out[key] == 0).all()) != op.startswith("gemma")


# --------------------------------------------------------------------------- extraction (real wheels)


@pytest.fixture(scope="module")
def wheel_roots(wheel_sources):
    from astra_sglang.extract import discover

    return discover(wheel_sources["sglang"], wheel_sources["flashinfer"], wheel_sources["tvm"])


@pytest.mark.wheels
def test_default_variants_extractable_from_the_wheels(wheel_roots):
    from astra_sglang.extract import available_variants

    for op in FAMILY:
        spec = get_op(op)
        assert spec.default_variant({n: True for n in wheel_roots.roots}) == DEFAULT_VARIANT[op]
        avail = {v.name: ok for v, ok, _ in available_variants(spec, wheel_roots)}
        assert avail == {DEFAULT_VARIANT[op]: True}


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("op", FAMILY)
def test_extracted_workspace_builds_for_sm90(op, wheel_roots, tmp_path):
    from astra_sglang.build import Arch
    from astra_sglang.extract import extract
    from astra_sglang.build.workspace import Workspace

    spec = get_op(op)
    dest = tmp_path / op
    extract(spec, wheel_roots, dest, Arch(9, 0))
    ws = Workspace.open(op, path=dest)
    m = ws.manifest
    assert m["op"] == op and m["variant"] == DEFAULT_VARIANT[op] and m["abi"] == spec.c_signature()
    base = (dest / "baseline.cu").read_text()
    # the production entry points the launcher wraps
    want = {"rmsnorm": "norm::RMSNorm<T>(", "gemma_rmsnorm": "norm::GemmaRMSNorm<T>(",
            "gemma_fused_add_rmsnorm": "norm::GemmaFusedAddRMSNorm<T>(",
            "gelu_and_mul": "ActivationKind::kGELU, kUsePDL", "gelu_tanh_and_mul": "ActivationKind::kGELUTanh, kUsePDL"}
    assert want[op] in base and not re.search(r"@[A-Z_]+@", base)
    if op in ACTS:
        assert "--use_fast_math" in m["flags"] and "-std=c++20" in m["flags"]
    else:
        assert "-std=c++17" in m["flags"] and "-DFLASHINFER_ENABLE_BF16" in m["flags"]
    res = ws.build()
    assert res.ok, res.log[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(res.library)], capture_output=True, text=True).stdout
    assert spec.symbol in syms


@pytest.mark.wheels
@pytest.mark.nvcc
@pytest.mark.parametrize("op", ACTS)
def test_activation_launchers_build_from_sglang_0_5_17(op, wheel_sources, sglang_0_5_17_source, tmp_path):
    """0.5.17 (what the GPU machines serve) keeps activation.cuh in an anonymous namespace, 0.5.23 in
    namespace sglang: the launcher names the kernel unqualified and builds against both."""
    from astra_sglang.build import Arch
    from astra_sglang.extract import discover, extract
    from astra_sglang.build.workspace import Workspace

    roots = discover(sglang_0_5_17_source, wheel_sources["flashinfer"], wheel_sources["tvm"])
    dest = tmp_path / op
    extract(get_op(op), roots, dest, Arch(9, 0))
    ws = Workspace.open(op, path=dest)
    assert ws.manifest["sources"]["sglang_jit"]["version"].startswith("0.5.17")
    res = ws.build()
    assert res.ok, res.log[-3000:]


@pytest.mark.wheels
@pytest.mark.parametrize("op", FAMILY)
def test_source_facts_hold_in_0_5_23_and_0_5_17(op, wheel_sources, sglang_0_5_17_source):
    """The launcher's facts (signatures, block size, the activation formulas, the gemma weight bias) match
    both SGLang versions the project serves (flashinfer-python 0.7.2 for both)."""
    from astra_sglang.extract.extractor import _check_facts
    from astra_sglang.extract import discover

    spec = get_op(op)
    v = spec.variant(DEFAULT_VARIANT[op])
    for sg in (wheel_sources["sglang"], sglang_0_5_17_source):
        roots = discover(sg, wheel_sources["flashinfer"], wheel_sources["tvm"])
        caps = _check_facts(v, roots)
        if op in ACTS:
            assert caps["BLOCK_SIZE"].rstrip("u") == "256" and int(caps["ACT_LAUNCH_BOUNDS"]) >= 256


# --------------------------------------------------------------------------- patch: real SGLang on CPU


def _run_child(code: str, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRA_SGLANG_")}
    env["PYTHONPATH"] = str(TESTS)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(ROOT))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"child failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


_CHILD = """
import json, sys
import sglang_cpu_env as E
E.install({root!r})
import torch
from astra_sglang.patch import apply_astra_kernels, revert_astra_kernels, counters
from astra_sglang.patch.ops import TorchBackend
from astra_sglang.registry import get_op, op_part

FAMILY = {family!r}

def standin(op):
    spec = get_op(op)
    def fn(v, dims, sc):  # the op's fp64 reference behind the ABI: what the adapter hands the kernel
        ref = spec.reference(dict(v), dims, sc)
        for k, t in ref.items():
            v[k].copy_(t.to(v[k].dtype))
    return TorchBackend("cpu stand-in", fn)

import sglang.srt.layers.activation as A
import sglang.srt.layers.layernorm as L
A._jit_act_max_vec_bytes = 1 << 20   # route GeluAndMul to sgl_kernel (the JIT module cannot run on CPU)
L.is_batch_invariant_mode_enabled = lambda: False
p = apply_astra_kernels(list(FAMILY), backends={{op: standin(op) for op in FAMILY}}, counter_dir={cdir!r},
                        propagate=False, self_check="off", plan=False)
summary = p.summary()
rebound = {{op: sorted(summary[op]["targets"]) for op in FAMILY}}
err = {{}}
for op in FAMILY:
    spec = get_op(op)
    dims = (6, 64)
    # bf16: the dtype the family serves in (the norms' production paths are fp16/bf16 only)
    inp = spec.make_inputs(dims, "bf16", torch.Generator().manual_seed(0), device="cpu")
    sc = spec.scalars(dims)
    ref = spec.reference({{k: t.clone() for k, t in inp.items()}}, dims, sc)
    out = op_part(op, "layer").run_layer({{k: t.clone() for k, t in inp.items()}}, dims, sc)
    err[op] = max(float((out[k].double() - ref[k]).abs().max() / ref[k].abs().max()) for k in ref)
c = counters({cdir!r})
revert_astra_kernels()
print(json.dumps(dict(err=err, calls={{op: c.get(op, {{}}).get("calls", 0) for op in FAMILY}}, rebound=rebound)))
"""


@pytest.fixture(params=["0.5.23", "0.5.17"])
def sglang_root(request):
    if request.param == "0.5.23":
        return Path(request.getfixturevalue("wheel_sources")["sglang"])
    return Path(request.getfixturevalue("sglang_0_5_17_source"))


@pytest.mark.wheels
def test_sglang_layers_run_the_patched_ops(sglang_root, tmp_path):
    """SGLang's own RMSNorm / GemmaRMSNorm / GeluAndMul layers (validate's layer.py), patched with CPU
    stand-ins behind each op's adapter (sglang_cpu_env's sgl_kernel stand-ins for the originals): every
    call reaches the op and computes its reference."""
    res = _run_child(_CHILD.format(root=str(sglang_root), family=list(FAMILY), cdir=str(tmp_path)))
    for op in FAMILY:
        assert res["calls"][op] == 1, (op, res["calls"])
        assert res["err"][op] < 8e-3, (op, res["err"])  # bf16 rounding of the outputs
    # the import-time binding SGLang's layers call through, besides the sgl_kernel attributes
    assert "sglang.srt.layers.layernorm:rmsnorm" in res["rebound"]["rmsnorm"]
    assert "sglang.srt.layers.layernorm:gemma_fused_add_rmsnorm" in res["rebound"]["gemma_fused_add_rmsnorm"]
    assert "sglang.srt.layers.activation:gelu_tanh_and_mul" in res["rebound"]["gelu_tanh_and_mul"]


@pytest.mark.parametrize("op", FAMILY)
def test_adapter_binds_the_real_signatures(op):
    """sgl_kernel's Python signatures (sgl-kernel python/sgl_kernel/elementwise.py, flashinfer.norm, the
    JIT activation module): arguments map onto the ABI, out is allocated as the original does, enable_pdl is
    ignorable, anything else (expert_ids) falls back."""
    import torch

    from astra_sglang.patch.adapters import Binder, get_adapter

    spec = get_op(op)
    ad = get_adapter(op)

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None): ...
    def fused(input, residual, weight, eps=1e-6, enable_pdl=None): ...
    def act(input, out=None, expert_ids=None, expert_step=1): ...

    fn = {"rmsnorm": rmsnorm, "gemma_rmsnorm": rmsnorm, "gemma_fused_add_rmsnorm": fused}.get(op, act)
    b = Binder(fn, ad, spec)
    assert b.ok, b.problem
    x = torch.randn(2, 3, 64)
    if op in ACTS:
        canon, vals = b.bind((x,), {})
        canon = dict(canon)
        for k, f in ad.alloc.items():
            canon[k] = f(canon) if canon.get(k) is None else canon[k]
        views, dims = ad.normalize(canon)
        assert dims == (6, 32) and views["out"].shape == (6, 32)
        assert b.bind((x,), {"expert_ids": torch.zeros(6, dtype=torch.int32)})[0] is None  # not this contract
        assert "not even" in ad.normalize({"input": torch.randn(2, 63), "out": torch.empty(2, 31)})
    else:
        w = torch.randn(64)
        args = (x, torch.randn(2, 3, 64), w) if op == "gemma_fused_add_rmsnorm" else (x, w)
        canon, vals = b.bind(args, {"eps": 1e-5, "enable_pdl": True})
        canon = dict(canon)
        assert canon["eps"] == 1e-5
        for k, f in ad.alloc.items():
            canon[k] = f(canon) if canon.get(k) is None else canon[k]
        views, dims = ad.normalize(canon)
        assert dims == (6, 64)
        nc = dict(canon, input=torch.randn(2, 64, 3).transpose(1, 2))  # same shape, strided
        assert "not contiguous" in ad.normalize(nc)
        assert "weight shape" in ad.normalize(dict(canon, weight=torch.randn(63)))


@pytest.mark.wheels
def test_the_shared_jit_activation_factory_stays_silus(wheel_sources):
    """gelu_and_mul and gelu_tanh_and_mul extract from the JIT activation.cuh silu_and_mul routes, but declare no
    JIT route (patch wraps a factory for one op): discovery must give activation_module to silu_and_mul in
    any op order (before patch/discover.py asked the adapters, the last op listed took it and silu's route
    was lost)."""
    from astra_sglang.patch.discover import discover_for_specs, query_for_spec

    for op in ACTS:
        assert query_for_spec(get_op(op)).jit_files == ()
    assert query_for_spec(get_op("silu_and_mul")).jit_files == ("elementwise/activation.cuh",)
    root = Path(wheel_sources["sglang"]) / "sglang"
    for order in (["silu_and_mul", *ACTS], [*ACTS, "silu_and_mul"]):
        disc = discover_for_specs([get_op(o) for o in order], roots={"sglang": root})
        owners = {s.op for s in disc.sites if s.kind == "jit_factory" and s.target == "elementwise/activation.cuh"}
        assert owners == {"silu_and_mul"}, (order, owners)


def test_gelu_tanh_leaves_the_decode_rows_it_lost_to_sglang():
    """gelu_tanh_and_mul (on by default) lost or tied at 16-256 tokens in context with 48 replays (H200, 2026-12-01):
    those calls are SGLang's; 1-token calls (1.23-1.39x) and prefill (>= 1.00x) stay astra's; gelu_and_mul and
    silu_and_mul are off by default and keep every call they are given."""
    A = op_part("gelu_tanh_and_mul", "adapter").ADAPTER
    for t in (16, 64, 256):
        assert "in context" in A.kept_by_sglang((t, 14336)), t
    for t in (1, 15, 257, 4096):
        assert A.kept_by_sglang((t, 14336)) is None, t
    for op in ("gelu_and_mul", "silu_and_mul"):
        assert op_part(op, "adapter").DEFAULT_OFF and op_part(op, "adapter").ADAPTER.kept_by_sglang((64, 14336)) is None


def test_the_single_norms_leave_their_measured_256_token_losses_to_sglang():
    """rmsnorm lost in context at 256 x 2880 / 4096 in every corpus (0.855x / 0.892x resolved at 48 replays, H200,
    2026-12-02) and gemma_rmsnorm at 256 x 5376: calls of 129-256 tokens in those width bands are SGLang's; the rows
    that win (up to 128 tokens, 256 x 512 and 256 x 7168, gemma's 256 x 2304) and prefill stay astra's."""
    rms = op_part("rmsnorm", "adapter").ADAPTER
    gemma = op_part("gemma_rmsnorm", "adapter").ADAPTER
    for dims in ((256, 4096), (256, 2880), (256, 1536), (129, 5120)):
        assert "in context" in rms.kept_by_sglang(dims), dims
    for dims in ((128, 4096), (64, 4096), (1, 4096), (256, 512), (256, 7168), (257, 4096), (4096, 4096), (256, 5376)):
        assert rms.kept_by_sglang(dims) is None, dims
    for dims in ((256, 5376), (256, 3840), (256, 3584)):
        assert "in context" in gemma.kept_by_sglang(dims), dims
    for dims in ((256, 2304), (128, 5376), (16, 3840), (1024, 5376)):
        assert gemma.kept_by_sglang(dims) is None, dims


def test_validate_shapes_reach_each_norm_keep_band():
    """validate shows a kept band as n/a only if one of its shapes lies in it: rmsnorm's paper shapes had none
    (72 passed, 0 n/a on the H200, 2026-12-02), so an edge row now does."""
    from astra_sglang.patch.validate import build_cases

    for op in ("rmsnorm", "gemma_rmsnorm"):
        ad = op_part(op, "adapter").ADAPTER
        assert any(ad.kept_by_sglang(c.dims) for c in build_cases([op], ["bf16"], "validate")), op


def test_rows_band_keeps_only_its_closed_ranges():
    from astra_sglang.patch.adapters import rows_band

    keeps = rows_band((16, 256), "why", width=(100, 200))
    assert keeps((16, 100)) == "16 x 100: why" and keeps((256, 200)) == "256 x 200: why"
    assert all(keeps(d) is None for d in ((15, 150), (257, 150), (64, 99), (64, 201)))
    assert rows_band((16, 256), "why")((64, 10**6)) == "64 x 1000000: why"


def test_row_normalizers_name_the_first_problem_and_keep_2d_calls_unviewed():
    """weighted_rows / gated_rows run on every patched eager call (compared without shape copies since
    2026-11-27): each bad call names its first problem, a 2-D call passes its own tensors through, and
    rmsnorm's alloc gives a contiguous out even for a strided input."""
    import torch

    from astra_sglang.patch.adapters import contiguous_like, gated_rows, weighted_rows

    norm = weighted_rows(("input", "residual"))
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    views, dims = norm({"input": x, "residual": r, "weight": w})
    assert dims == (4, 64) and views["input"] is x and views["residual"] is r and views["weight"] is w
    assert norm({"input": x, "residual": torch.randn(4, 63), "weight": w}) == \
        "residual shape (4, 63) != input shape (4, 64)"
    assert norm({"input": x, "residual": r, "weight": torch.randn(2, 32)}) == "weight shape (2, 32) != (64,)"
    assert norm({"input": x, "residual": torch.randn(64, 4).t(), "weight": w}) == \
        "residual is not contiguous (strides (1, 4))"
    assert norm({"input": x, "residual": r, "weight": torch.randn(64, 2)[:, 0]}) == \
        "weight is not contiguous (strides (2,))"
    assert norm({"input": torch.tensor(1.0), "residual": r, "weight": w}) == "input is 0-d"
    views, dims = norm({"input": torch.randn(2, 3, 64), "residual": torch.randn(2, 3, 64), "weight": w})
    assert dims == (6, 64) and views["residual"].shape == (6, 64)

    g, o = torch.randn(3, 128), torch.empty(3, 64)
    views, dims = gated_rows({"input": g, "out": o})
    assert dims == (3, 64) and views["out"] is o
    assert gated_rows({"input": g, "out": torch.empty(3, 63)}) == "out shape (3, 63) != (3, 64)"
    assert gated_rows({"input": g, "out": torch.empty(64, 3).t()}) == "out is not contiguous (strides (1, 3))"
    strided = torch.randn(64, 4).t()
    out = contiguous_like("input")({"input": strided})
    assert out.shape == strided.shape and out.is_contiguous() and out.dtype == strided.dtype


def test_self_check_class_of_zero_one_and_many_class_dims(tmp_path):
    """shape_class: the dtype, the token count's power-of-two bucket and the dims after it (an itemgetter)."""
    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState, TorchBackend
    from astra_sglang.registry import get_op, op_part

    for op, dims, want in (("rmsnorm", (5, 4096), ("bf16", 8, 4096)),
                           ("fused_add_rmsnorm", (1, 2048), ("bf16", 1, 2048))):
        st = OpState(get_op(op), op_part(op, "adapter").ADAPTER, TorchBackend("t", lambda v, d, s: None),
                     CounterFile(tmp_path / op, [op]))
        assert st.shape_class(dims, "bf16") == want
    st._class_of = lambda d: ()   # no class dims: the bucket alone
    assert st.shape_class((9, 1), "fp16") == ("fp16", 16)
