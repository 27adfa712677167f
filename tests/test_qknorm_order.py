"""qknorm's sum of squares in SGLang's order (ASTRA_QKN_ORDER=1), emulated in float32 on the CPU, operation for
operation (the helpers of test_norm_reduction_order: one rounding per fma, per add).

SGLang's JIT qknorm (qknorm.cuh, impl/norm.cuh): head_dim <= 256 takes a warp per row, lane p sums the squares of
elements [E p, E p + E) (E = head_dim / 32) in one fma chain, then a shfl_xor butterfly 16, 8, 4, 2, 1; 512 and 1024
take a CTA of head_dim / 8 threads, thread t the 8 elements from 8 t, each warp's butterfly, then warp 0's butterfly
over the warp sums zero padded to 32. Our kernel holds 16-byte vectors (8 elements) in LANES = head_dim / 8 lanes
(at most 32, more vectors a lane beyond): one chain per production unit it holds, each chain's butterfly across the
lanes, the rest of SGLang's butterfly inside the lane. The old order (one chain per lane) is shown to differ.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from test_norm_reduction_order import _chain, _to_dtype  # one fma chain from 0; rounding to the storage dtype

from astra_sglang.registry import op_dir


def _butterfly(v, lanes):
    """shfl_xor butterfly over the last axis (`lanes` wide), offsets lanes/2 .. 1: every lane's result."""
    idx = np.arange(lanes)
    o = lanes // 2
    while o:
        v = v + v[..., idx ^ o]
        o //= 2
    return v


def production_sum_sq(x):
    rows, d = x.shape
    if d <= 256:
        units = _chain(x.reshape(rows, 32, d // 32))
        out = _butterfly(units, 32)
        return out[:, 0]
    warps = d // 8 // 32
    units = _chain(x.reshape(rows, warps, 32, 8))
    sums = _butterfly(units, 32)[..., 0]                              # each warp's sum
    padded = np.concatenate([sums, np.zeros((rows, 32 - warps), np.float32)], axis=1)
    return _butterfly(padded, 32)[:, 0]


def ours_sum_sq(x, vec=8, order=True):
    rows, d = x.shape
    lanes = min(d // vec, 32)
    nv = d // (lanes * vec)
    unit = d // 32 if d <= 256 else 8
    # vectors[row, lane, i, e]: vector i * lanes + lane of the row, as the kernel loads it
    vectors = x.reshape(rows, nv, lanes, vec).transpose(0, 2, 1, 3)
    if not order:
        s = _chain(vectors.reshape(rows, lanes, nv * vec))
        return _butterfly(s, lanes)[:, 0]
    m = vec // unit
    c = _chain(vectors.reshape(rows, lanes, nv * m, unit))              # c[row, lane, i * m + u]
    c = np.moveaxis(_butterfly(np.moveaxis(c, 1, 2), lanes), 2, 1)      # each chain across the lanes
    assert (c == c[:, :1]).all()                                        # every lane holds the same sums
    c = c[:, 0]
    o = c.shape[1] // 2
    while o:
        c = c[:, :o] + c[:, o:2 * o]
        o //= 2
    return c[:, 0]


def _rows(d, dtype, n=64, seed=0):
    rng = np.random.default_rng(seed + d)
    x = rng.standard_normal((n, d), np.float32) * np.exp2(rng.integers(-3, 4, (n, 1))).astype(np.float32)
    return _to_dtype(x, dtype)


@pytest.mark.parametrize("d", [64, 128, 256, 512, 1024])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_ordered_sum_is_sglangs_bit_for_bit(d, dtype):
    x = _rows(d, dtype)
    ref = production_sum_sq(x)
    assert np.array_equal(ours_sum_sq(x).view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("d", [64, 128])
def test_the_one_chain_order_was_not(d):
    """head_dim 64 and 128 (Qwen3's) hold two or four of SGLang's units per lane: one chain over them rounds otherwise,
    as the GPU check saw (92 of 104 comparisons identical)."""
    x = _rows(d, "bf16", n=512)
    assert (ours_sum_sq(x, order=False) != production_sum_sq(x)).any()


def test_the_kernel_takes_the_order_only_where_its_vectors_hold_whole_units():
    """The source's unit is SGLang's, and the order is used only where a vector holds whole units (the aligned,
    16-byte case; a narrower fallback keeps one chain). It ships on (H200 check: 104 of 104 comparisons identical)."""
    src = (op_dir("qknorm") / "kernel.cu").read_text()
    assert "template <int D> constexpr int kUnit = D <= 256 ? D / 32 : 8;" in src
    assert "if constexpr (ASTRA_QKN_ORDER && VEC % kUnit<D> == 0)" in src
    assert re.search(r"#define ASTRA_QKN_ORDER 1\b", src)
