"""The four RMSNorm kernels sum the squares in FlashInfer's order (norm.cuh, what SGLang runs on Hopper),
so their outputs are bit-identical to production and greedy tokens match SGLang's.

A CPU emulation in float32, operation for operation as the GPU runs them (production and our kernels are
built with -use_fast_math: the sum of squares is an FFMA chain, checked in the PTX; every add rounds
to float32):
  FlashInfer: n = min(1024, nv) threads rounded up to a warp; thread t: s = fma(v, v, s) over the
    elements of vectors t, t + n, ... in order; each warp: shfl_xor butterfly 16, 8, 4, 2, 1; warp 0:
    the same butterfly over the warp sums, zero padded to 32 lanes; then rsqrt(ss / d + eps) and
    T((x * rcp) * (weight_bias + w)), x the float input (fused: input + residual, kept in float).
  ours: the row plan of kernels/<op>/kernel.cu (compiled here from the kernel source with the host
    compiler) and its device layout, emulated slot by slot.
The division and rsqrt (div.approx / rsqrt.approx on the GPU) are the same instructions on the same
value on both sides, so the emulation uses IEEE ones: equal sums give equal outputs either way.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from fractions import Fraction

import numpy as np
import pytest

from astra_sglang.registry import get_op, op_dir

OPS = ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm")
BIAS = {"rmsnorm": 0.0, "fused_add_rmsnorm": 0.0, "gemma_rmsnorm": 1.0, "gemma_fused_add_rmsnorm": 1.0}
SIZE = {"fp16": 2, "bf16": 2, "fp32": 4}
EPS = np.float32(1e-6)


# --------------------------------------------------------------------------- float32 primitives


def _fma(a, b, c):
    """float32 fma with one rounding (FFMA): a*b is exact in float64; the sum is rounded to odd in
    float64 (53 >= 24 + 2 bits), so rounding it to float32 rounds the exact value."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # TwoSum: s + err is exact
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _butterfly(v):
    """shfl_xor butterfly over the last axis (32 lanes): every lane adds its partner's value."""
    lanes = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        v = v + v[..., lanes ^ o]
    return v[..., 0]


def _to_dtype(x, dtype):
    """Round float32 to the storage dtype (round to nearest even) and back to float32."""
    x = np.asarray(x, np.float32)
    if dtype == "fp32":
        return x
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _chain(vals):
    """vals (..., L): one thread's s = fma(v, v, s) over L values in order, from s = 0."""
    s = np.zeros(vals.shape[:-1], np.float32)
    for j in range(vals.shape[-1]):
        s = _fma(vals[..., j], vals[..., j], s)
    return s


def _vec(d, dtype):
    return math.gcd(16 // SIZE[dtype], d)


# --------------------------------------------------------------------------- the orders


def flashinfer_sum_sq(x, vec):
    """FlashInfer's RMSNormKernel / FusedAddRMSNormKernel sum of squares of each row of x (rows, d)."""
    rows, d = x.shape
    nv = d // vec
    n = 32 * -(-min(1024, nv) // 32)
    rounds = -(-nv // n)
    pad = np.zeros((rows, rounds * n * vec), np.float32)
    pad[:, :d] = x
    per_thread = pad.reshape(rows, rounds, n, vec).transpose(0, 2, 1, 3).reshape(rows, n, rounds * vec)
    warps = _butterfly(_chain(per_thread).reshape(rows, n // 32, 32))
    lanes = np.zeros((rows, 32), np.float32)
    lanes[:, : n // 32] = warps
    return _butterfly(lanes)


def _slot(layout, k, warp, wpr, nv, rank, cl):
    """kernel.cu slot<L>(): slot k of a thread of warp `warp` -> (FlashInfer warp vw, round i, continues
    slot k-1's chain). Arrays over the threads' warps."""
    zero = np.zeros_like(warp)
    if layout == 0:  # kOne
        return warp, zero, np.zeros(warp.shape, bool)
    if layout == 1:  # kTwo: FlashInfer's warps w and w + R/32
        return k * wpr + warp, zero, np.zeros(warp.shape, bool)
    if layout == 2:  # kPacked: its 2-round warps first (one slot pair each), then its 1-round warps
        nd = (nv - 1024 + 31) >> 5
        p = 4 * warp + k
        dbl = p < 2 * nd
        return np.where(dbl, p >> 1, p - nd), np.where(dbl, p & 1, 0), dbl & ((p & 1) == 1)
    return rank + cl * warp, zero + k, np.full(warp.shape, k > 0)  # kCluster


SLOTS = {0: 1, 1: 2, 2: 4, 3: 4}


def astra_sum_sq(x, vec, plan):
    """Our kernel's sum of squares under `plan` = (R, n_fi, cl, slice, layout), as the device code lays
    it out: slot k of thread x (CTA rank r) is round i of FlashInfer's thread 32*vw + lane; a run of slots
    of one such thread is one fma chain, whose warp sum goes to red[vw] (red[warp] in a cluster)."""
    R, n_fi, cl, slc, layout = plan
    K = SLOTS[layout]
    rows, d = x.shape
    nv = d // vec
    xv = np.concatenate([x.reshape(rows, nv, vec), np.zeros((rows, 1, vec), np.float32)], axis=1)
    wpr = R // 32
    thread = np.arange(R)
    lane, warp = thread % 32, thread // 32
    nred = wpr if cl > 1 else n_fi // 32
    per_cta = []
    for rank in range(cl):
        red = np.zeros((rows, 32), np.float32)
        s = np.zeros((rows, R), np.float32)
        for k in range(K):
            vw, i, cont = _slot(layout, k, warp, wpr, nv, rank, cl)
            s = np.where(cont[None, :], s, np.float32(0))  # (warp-uniform in the kernel)
            if n_fi:
                t = 32 * vw + lane
                vi, ok = t + i * n_fi, (t < n_fi) & (t + i * n_fi < nv)
            else:
                vi = rank * slc + thread + k * R
                ok = vi < min(nv, rank * slc + slc)
            vals = xv[:, np.where(ok, vi, nv), :]  # masked slots: zeros (fma(0, 0, s) == s)
            for e in range(vec):
                s = _fma(vals[..., e], vals[..., e], s)
            ends = np.ones(R, bool) if k + 1 == K else ~_slot(layout, k + 1, warp, wpr, nv, rank, cl)[2]
            ws = _butterfly(s.reshape(rows, wpr, 32))  # (rows, wpr)
            q = warp[::32] if cl > 1 else vw[::32]
            for w_ in range(wpr):
                if ends[32 * w_] and q[w_] < nred:
                    red[:, q[w_]] = ws[:, w_]
        if cl > 1 or nred > 1:
            lanes = np.where(np.arange(32) < nred, red, np.float32(0))
            per_cta.append(_butterfly(lanes))
        else:
            per_cta.append(_butterfly(s.reshape(rows, wpr, 32))[:, 0])
    if cl == 1:
        return per_cta[0]
    lanes = np.zeros((rows, 32), np.float32)
    lanes[:, :cl] = np.stack(per_cta, axis=1)
    return _butterfly(lanes)


def old_sum_sq(x, vec):
    """The kernels before this change (one CTA per row, up to 2048 vectors): R threads from pick_rk,
    thread x one partial sum over vectors x + k*R, the warp sums added in sequence."""
    rows, d = x.shape
    nv = d // vec
    assert nv <= 2048
    up = lambda v: (v + 31) & ~31  # noqa: E731
    if nv > 1024:
        R, K = up(-(-nv // 4)), 4
    else:
        kt = 1 if nv <= 256 else 2
        R = min(1024, max(32, up(-(-nv // kt))))
        k = -(-nv // R)
        K = 1 if k <= 1 else 2 if k <= 2 else 4
        R = up(-(-nv // K))
    xv = np.concatenate([x.reshape(rows, nv, vec), np.zeros((rows, 1, vec), np.float32)], axis=1)
    vi = np.arange(R)[:, None] + R * np.arange(K)[None, :]
    vals = xv[:, np.where(vi < nv, vi, nv), :].reshape(rows, R, K * vec)
    warps = _butterfly(_chain(vals).reshape(rows, R // 32, 32))
    ss = np.zeros(rows, np.float32)
    for w in range(R // 32):
        ss = ss + warps[:, w]
    return ss


def outputs(x, w, ss, bias, dtype):
    """T((x * rcp) * (bias + w)) with rcp = rsqrt(ss / d + eps)."""
    d = np.float32(x.shape[1])
    rcp = (1.0 / np.sqrt((ss / d + EPS).astype(np.float64))).astype(np.float32)
    return _to_dtype((x * rcp[:, None]) * (np.float32(bias) + w)[None, :], dtype)


def _inputs(op, rows, d, dtype, seed):
    """The float row the kernel squares (fused: input + residual in float32) and the weight."""
    rng = np.random.default_rng(seed)
    x = _to_dtype(rng.standard_normal((rows, d), np.float32), dtype)
    if "fused" in op:
        x = x + _to_dtype(rng.standard_normal((rows, d), np.float32), dtype)
    w = _to_dtype(rng.standard_normal(d, np.float32) * 0.1 + (0.0 if BIAS[op] else 1.0), dtype)
    return x, w


# --------------------------------------------------------------------------- our row plan, from kernel.cu


def _plan_source(op):
    src = (op_dir(op) / "kernel.cu").read_text()
    m = re.search(r"// ---- row plan.*?\n(.*?)// ---- end of row plan", src, re.S)
    assert m, f"{op}: kernel.cu has no row plan block"
    return m.group(1)


def _one_max(op):
    """The ASTRA_ONE_MAX a kernel defines before its row plan block (the fused norms: 1024), else None: the
    block's own default. The shared block is compiled with it, so the plans tested are the ones shipped."""
    src = (op_dir(op) / "kernel.cu").read_text()
    head = src[:src.index("// ---- row plan")]
    m = re.search(r"#define ASTRA_ONE_MAX (\d+)u?\b", head)
    return int(m.group(1)) if m else None


def _compile_plans(cxx, tmp, name, block, one_max=None):
    prog = tmp / f"{name}.cpp"
    prog.write_text(
        "#include <cstdint>\n#include <cstdio>\n"
        + (f"#define ASTRA_ONE_MAX {one_max}u\n" if one_max else "")
        + "namespace {\n" + block + "}\n"
        "int main() {\n  for (uint32_t nv = 1; nv <= 16384; ++nv) {\n    RowPlan p;\n"
        "    if (!row_plan(nv, true, p)) { std::printf(\"%u none\\n\", nv); continue; }\n"
        "    std::printf(\"%u %u %u %u %u %d\\n\", nv, p.R, p.n_fi, p.cl, p.slice, p.layout);\n  }\n}\n"
    )
    exe = tmp / name
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(exe), str(prog)], check=True, capture_output=True)
    plans = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        f = line.split()
        plans[int(f[0])] = None if f[1] == "none" else tuple(int(v) for v in f[1:])
    return plans


@pytest.fixture(scope="module")
def kernel_plans(tmp_path_factory):
    """{op: {nv: (R, n_fi, cl, slice, layout)}} for nv in 1..16384 (sm_90, clusters), from row_plan() as each
    kernel builds it; and under "one_max=1024" the shared block with every row of <= 1024 vectors at kOne."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("needs a host C++ compiler")
    tmp = tmp_path_factory.mktemp("plan")
    out = {op: _compile_plans(cxx, tmp, op, _plan_source(op), _one_max(op)) for op in OPS}
    out["one_max=1024"] = _compile_plans(cxx, tmp, "one1024", _plan_source(OPS[0]), 1024)
    return out


def test_the_four_kernels_share_one_row_plan():
    texts = {op: _plan_source(op) for op in OPS}
    assert len(set(texts.values())) == 1


def _widths(op):
    spec = get_op(op)
    return sorted({s.dims[1] for s in tuple(spec.corpus) + tuple(spec.edge_shapes)}), spec.dtypes


def _cases():
    for op in OPS:
        widths, dtypes = _widths(op)
        for dtype in dtypes:
            for d in widths:
                yield op, dtype, d


# --------------------------------------------------------------------------- tests


def test_fma_emulation_rounds_once():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4000).astype(np.float32)
    b = (rng.standard_normal(4000) * np.exp2(rng.integers(-30, 30, 4000))).astype(np.float32)
    c = (rng.standard_normal(4000) * np.exp2(rng.integers(-40, 40, 4000))).astype(np.float32)
    # 1 + 2^-24 + 2^-60 (2^36 + 1 = 4097 * 16773121): float64 rounds it to the float32 tie 1 + 2^-24,
    # which would then round to 1 instead of up to 1 + 2^-23 (double rounding); and a few exact ties
    a[0], b[0], c[0] = 4097 * 2.0**-12, 16773121 * 2.0**-48, 1.0
    a[1], b[1], c[1] = -a[0], b[0], -1.0
    a[2:6], b[2:6], c[2:6] = 2.0**-12, 2.0**-12, 1.0 + 2.0**-23 * np.arange(4)
    got = _fma(a, b, c)

    def exact(ai, bi, ci):
        v = Fraction(float(ai)) * Fraction(float(bi)) + Fraction(float(ci))
        lo = np.float32(float(v))  # within an ulp; settle by exact comparison, ties to even
        cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]
        return min(cands, key=lambda f: (abs(Fraction(float(f)) - v), int(np.float32(f).view(np.uint32)) & 1))

    for i in range(len(a)):
        assert got[i] == exact(a[i], b[i], c[i]), i


@pytest.mark.parametrize("d", [3584, 4096])
def test_the_old_order_was_not_flashinfers(d):
    """Reproduces the GPU check on CPU: the earlier kernels summed each thread's two vectors into one
    partial sum and added the warp sums in sequence. Their sums differed from production in most rows
    and flipped a few bf16 outputs, at Gemma-2's 3584 and at 4096 alike (on the H100: 99.9x% of the
    elements identical, fp16 1x4096 at 99.98%)."""
    x, w = _inputs("gemma_rmsnorm", 512, d, "bf16", seed=d)
    vec = _vec(d, "bf16")
    ref, old = flashinfer_sum_sq(x, vec), old_sum_sq(x, vec)
    assert (ref != old).mean() > 0.25  # most sums differ by an ulp; a few outputs round the other way
    flipped = outputs(x, w, ref, 1.0, "bf16") != outputs(x, w, old, 1.0, "bf16")
    assert 0 < flipped.mean() < 1e-3


def test_new_order_is_flashinfers_where_the_old_was_not(kernel_plans):
    d, vec = 3584, 8
    x, _ = _inputs("gemma_rmsnorm", 64, d, "bf16", seed=1)
    ref = flashinfer_sum_sq(x, vec)
    new = astra_sum_sq(x, vec, kernel_plans["gemma_rmsnorm"][d // vec])
    assert (ref != old_sum_sq(x, vec)).any() and np.array_equal(ref.view(np.uint32), new.view(np.uint32))


@pytest.mark.parametrize("op,dtype,d", list(_cases()))
def test_sum_order_is_flashinfers_on_every_corpus_width(op, dtype, d, kernel_plans):
    """Every corpus and edge width of every op and dtype: the plan kernel.cu picks (sm_90) sums each row
    exactly as FlashInfer does, so every output element is bit-identical. Rows of more than 4096
    vectors (none in the corpora) would take contiguous cluster slices: not FlashInfer's order."""
    vec = _vec(d, dtype)
    nv = d // vec
    plan = kernel_plans[op][nv]
    assert plan is not None and nv <= 4096 and plan[1] != 0, (nv, plan)
    R, n_fi, cl, _, layout = plan
    assert R % 32 == 0 and R <= (512 if SLOTS[layout] == 4 else 1024) and cl * R * SLOTS[layout] >= nv
    assert n_fi == 32 * -(-min(nv, 1024) // 32)
    x, w = _inputs(op, 8, d, dtype, seed=d)
    ref = flashinfer_sum_sq(x, vec)
    ours = astra_sum_sq(x, vec, plan)
    assert np.array_equal(ref.view(np.uint32), ours.view(np.uint32))
    assert np.array_equal(outputs(x, w, ref, BIAS[op], dtype).view(np.uint32),
                          outputs(x, w, ours, BIAS[op], dtype).view(np.uint32))


def test_every_row_of_up_to_4096_vectors_follows_flashinfer(kernel_plans):
    """All row widths the order is kept for, beyond the corpora (one row each, 1..4096 vectors of 8):
    rows over 4096 vectors are the documented exception (cluster slices)."""
    for which in ("rmsnorm", "one_max=1024"):  # the block's default plan, and the fused norms' (kOne to 1024)
        plans = kernel_plans[which]
        for nv in list(range(1, 300)) + list(range(300, 4097, 7)) + [512, 513, 1023, 1024, 1025, 2048, 2049, 4096]:
            x, _ = _inputs("rmsnorm", 1, nv * 8, "bf16", seed=nv)
            ref = flashinfer_sum_sq(x, 8)
            ours = astra_sum_sq(x, 8, plans[nv])
            assert np.array_equal(ref.view(np.uint32), ours.view(np.uint32)), (which, nv, plans[nv])
        assert all(plans[nv][1] == 0 for nv in range(4097, 16385, 1021))
        assert plans[16384] is not None


def test_the_fused_norms_take_one_vector_per_thread_up_to_1024_vectors(kernel_plans):
    """Measured in context on the H200 (2026-11-27): kOne up to 1024 vectors made the fused norms faster (fused_add
    1.203x -> 1.246x, gemma_fused_add 1.119x -> 1.220x) and the plain ones slower (rmsnorm 1.308x -> 1.245x,
    gemma_rmsnorm 1.162x -> 1.125x), so only the fused kernels define it (their run_w keeps kTwo above 256 tokens,
    where kOne was not timed: that plan is the block default's, checked above)."""
    for op in OPS:
        layouts = {kernel_plans[op][nv][4] for nv in range(257, 1025)}
        assert layouts == ({0} if "fused" in op else {1}), (op, layouts)
        assert kernel_plans[op][1025][4] == 2  # kPacked past 1024 vectors, as before
