"""moe_align (kernels/moe_align/): the exact reference against SGLang's documented example and a brute-force
formulation; the canonical comparison (order inside a bucket is free, a pair in the wrong bucket is not);
the harness on CPU with an atomics-like stand-in; the corpus; the shipped kernel and the extracted production
kernels build with nvcc for sm_90a (the JIT port from the real 0.5.17 wheel; the sgl_kernel excerpts from a
checkout synthesized at test time from that wheel's kernel text); the adapter binds the wheels' real
signatures. No kernel runs here (no GPU)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from astra_sglang.registry import get_op, op_part
from sglang_signatures import real_function  # noqa: E402

SPEC_MOD = op_part("moe_align", "spec")


def _has_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))


# ------------------------------------------------------------------------------------------ reference
def test_reference_matches_sglangs_documented_example():
    # moe_align_block_size.py's docstring: experts 1..4 there are buckets 1..4 here (ids 0..3, +1 convention)
    ids = np.array([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]]) - 1
    out, eids, total = SPEC_MOD.align_np(ids, 5, 4, 32, np.full(8, 99))
    assert total == 16
    assert out[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert (out[16:] == 12).all()  # pad_sorted_token_ids: the whole buffer holds numel
    assert eids.tolist() == [0, 1, 2, 3, 99, 99, 99, 99]  # blocks past the total keep their values


def _brute(ids, nb, bs, n_sorted, eids_in):
    flat = [int(x) for x in np.asarray(ids).reshape(-1)]
    out, eids, pos = [len(flat)] * n_sorted, list(eids_in), 0
    for b in range(nb):
        mine = [i for i, x in enumerate(flat) if x + 1 == b]
        for j, i in enumerate(mine):
            out[pos + j] = i
        n = -(-len(mine) // bs) * bs
        for blk in range(pos // bs, (pos + n) // bs):
            eids[blk] = b - 1
        pos += n
    return out, eids, pos


@pytest.mark.parametrize("dims", [(1, 8, 129, 16, 128), (16, 8, 129, 16, 2048), (5, 2, 9, 32, 256),
                                  (64, 8, 257, 64, 16960), (7, 8, 33, 1, 56)])
@pytest.mark.parametrize("dist", ["uniform", "skewed", "ep"])
def test_reference_equals_brute_force(dims, dist):
    spec = get_op("moe_align")
    inp = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(3), dist, device="cpu")
    ids = inp["topk_ids"]
    assert ids.dtype == torch.int32 and tuple(ids.shape) == dims[:2]
    if dist != "ep":
        assert all(len(set(r)) == len(r) for r in ids.tolist())  # distinct experts per token
    ref = spec.reference({k: v.double() for k, v in inp.items()}, dims, spec.scalars(dims))
    out, eids, total = _brute(ids.numpy(), dims[2], dims[3], dims[4], inp["expert_ids"].tolist())
    assert ref["sorted_token_ids"].long().tolist() == out
    assert ref["expert_ids"].long().tolist() == eids
    assert int(ref["num_tokens_post_pad"][0]) == total
    if dist == "ep":
        assert (ids == -1).any() and (ref["expert_ids"][: total // dims[3]] == -1).any()


def test_sizes_follow_sglang_0_5_17():
    # numel < E + 1: numel * block; else numel + (E + 1) * (block - 1); the corpus rounds that up to 4
    assert SPEC_MOD.max_num_tokens_padded(8, 128, 16) == 128
    assert SPEC_MOD.max_num_tokens_padded(256, 128, 16) == 256 + 129 * 15
    assert SPEC_MOD.max_num_tokens_padded(512, 128, 16) == 2447  # the H200 check's guard failure
    assert SPEC_MOD.sorted_len(512, 128, 16) == 2448
    assert SPEC_MOD.dims_for(1, 8, 128, 16) == (1, 8, 129, 16, 128)
    assert SPEC_MOD.dims_for(64, 8, 128, 16) == (64, 8, 129, 16, 2448)


def _sglang_alloc(numel, num_experts, block_size, round4):
    """sorted_ids / expert_ids / cumsum_buffer lengths as triton_utils/moe_align_block_size.py computes them."""
    if numel < num_experts + 1:
        n = numel * block_size
    else:
        n = numel + (num_experts + 1) * (block_size - 1)
    if round4:  # 0.5.23: "The align kernel pads sorted_ids with int4 stores."
        n = (n + 3) // 4 * 4
    return n, -(-n // block_size), num_experts + 2


def test_corpus_buffers_are_sglangs_allocation_rounded_to_the_int4_padding():
    """Every corpus/edge shape: sorted_token_ids has SGLang's length rounded up to 4 (0.5.23's allocation; in
    0.5.17 the extent production's int4 padding writes into the caching allocator's slack), expert_ids and
    cumsum_buffer exactly SGLang's; production writes nothing past any of them."""
    spec = get_op("moe_align")
    for s in list(spec.corpus) + list(spec.edge_shapes):
        t, k, nb, bs, n_sorted = s.dims
        n23, blocks, csum = _sglang_alloc(t * k, nb - 1, bs, True)
        n17, blocks17, _ = _sglang_alloc(t * k, nb - 1, bs, False)
        assert n_sorted == n23 and n17 <= n_sorted < n17 + 4, s.dims
        assert blocks == blocks17  # block sizes of the corpus are 1 or multiples of 4
        assert SPEC_MOD.production_int4_overrun(s.dims) == 0, s.dims
        inp = spec.make_inputs(s.dims, "int32", torch.Generator().manual_seed(0), "uniform", device="cpu")
        assert inp["sorted_token_ids"].numel() == n_sorted
        assert inp["expert_ids"].numel() == blocks
        assert inp["cumsum_buffer"].numel() == csum
        ref = spec.reference(inp, s.dims, spec.scalars(s.dims))
        assert int(ref["num_tokens_post_pad"][0]) <= n17  # SGLang's bound holds for the total


def test_production_int4_overrun_and_the_variants_refuse_unrounded_lengths():
    # the H200 check's guard failures: 4 bytes past sorted_token_ids on every one of these
    for dims in ((64, 8, 129, 16, 2447), (1024, 4, 129, 16, 6031), (512, 8, 129, 64, 12223),
                 (513, 8, 129, 64, 12231), (4096, 4, 33, 64, 18463)):
        assert SPEC_MOD.production_int4_overrun(dims) == 1, dims
        for v in ("jit", "sgl_kernel"):
            why = get_op("moe_align").variant(v).supports(dims, "int32")
            assert why and f"use {dims[4] + 1}" in why, (v, why)
        assert get_op("moe_align").variant("jit").supports(dims[:4] + (dims[4] + 1,), "int32") is None
    assert SPEC_MOD.production_int4_overrun((64, 8, 129, 16, 2446)) == 2
    # the small-batch kernel (< 1024 ids, <= 64 buckets) pads with scalar stores: no overrun
    assert SPEC_MOD.production_int4_overrun((3, 6, 64, 16, 287)) == 0
    assert SPEC_MOD.production_int4_overrun((200, 8, 64, 16, 2545)) == 3  # 1600 ids: the align kernel


@pytest.mark.wheels
def test_sglang_0_5_17_allocates_the_unrounded_length_and_its_kernel_pads_int4(sglang_0_5_17_source, wheel_sources):
    """What the corpus rounding stands on, read from the wheels: 0.5.17's wrapper allocates
    max_num_tokens_padded unrounded, its align kernels pad ceil(len / 4) int4 vectors with len =
    sorted_token_ids.size(0); 0.5.23 rounds the allocation up to 4."""
    rel = Path("sglang/srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py")
    py17 = (Path(sglang_0_5_17_source) / rel).read_text()
    assert "max_num_tokens_padded = topk_ids.numel() + (num_experts + 1) * (block_size - 1)" in py17
    assert "(max_num_tokens_padded + 3) // 4 * 4" not in py17
    assert re.search(r"sorted_ids = torch\.empty\(\s*\(max_num_tokens_padded,\)", py17)
    assert re.search(r"cumsum_buffer = torch\.empty\(\s*\(num_experts \+ 2,\)", py17)
    py23 = (Path(wheel_sources["sglang"]) / rel).read_text()
    assert "max_num_tokens_padded = (max_num_tokens_padded + 3) // 4 * 4" in py23
    cu = (Path(sglang_0_5_17_source) / "sglang/kernels/jit/csrc/moe/moe_align_kernel.cu").read_text()
    assert "int64_t max_num_tokens_padded = sorted_token_ids.size(0);" in cu
    assert cu.count("int32_t total_vecs = (max_num_tokens_padded + VEC_SIZE - 1) / VEC_SIZE;") == 2  # v1 and v2
    assert "#define VEC_SIZE 4" in cu and SPEC_MOD.PAD_VEC == 4
    # every source fact the launcher relies on (these two included) holds in the wheel
    for _rel, regex, meaning in get_op("moe_align").variant("jit").source_facts:
        assert re.search(regex, cu, re.MULTILINE), meaning
    # production launches without PDL (LaunchKernel's default), so nothing of its own waits across calls
    assert "enable_pdl" not in cu and "use_pdl" not in cu


def test_batch_1_bench_plans_a_bounded_number_of_input_sets():
    """The H200 bench 'hang' at 1x8x129x16x128: a 1.1 KB input set asked for 228k rotating sets (4x a 60 MiB
    L2), each made, restored (two inout buffers) and re-checked in Python, and 228k calls per timed graph:
    minutes inside one stage, which the watchdog reported as no progress. plan_sets caps the sets."""
    from astra_sglang.harness.timer import MAX_CALLS, plan_calls, plan_sets

    spec = get_op("moe_align")
    dims = (1, 8, 129, 16, 128)
    inp = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(0), "uniform", device="cpu")
    sb = sum(inp[a.name].numel() * 4 for a in spec.abi if a.ctype == "ptr")
    assert sb == 1100
    n, note = plan_sets(sb, 60 << 20)
    assert n == MAX_CALLS <= 4096 and "capped" in note and "not L2-cold" in note   # all in L2 either way
    assert plan_calls(0.5, n) == n
    # shapes whose sets are >= 16 KB plan as before (e.g. merge_state 1x32x128: 10083 sets on the H200)
    assert plan_sets(24_960, 60 << 20) == (10083, "")


# ------------------------------------------------------------------------------------------ canonical form
def _shuffled_within_buckets(ref, dims, seed=0):
    """What production may write: each bucket's ids in any order (atomics)."""
    rng = np.random.default_rng(seed)
    s = ref["sorted_token_ids"].long().numpy().copy()
    e = ref["expert_ids"].long().numpy()
    total, bs, numel = int(ref["num_tokens_post_pad"][0]), dims[3], dims[0] * dims[1]
    for b in np.unique(e[: total // bs]):
        pos = np.nonzero(np.repeat(e[: total // bs], bs) == b)[0]
        tok = pos[s[pos] < numel]
        s[tok] = rng.permutation(s[tok])
    return {"sorted_token_ids": torch.from_numpy(s).int(), "expert_ids": ref["expert_ids"].int(),
            "num_tokens_post_pad": ref["num_tokens_post_pad"].int()}


def test_canonical_forgives_order_inside_a_bucket_and_nothing_else():
    spec = get_op("moe_align")
    dims = (64, 8, 129, 16, 64 * 8 + 129 * 15)
    inp = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(5), "skewed", device="cpu")
    ref = spec.reference({k: v.double() for k, v in inp.items()}, dims, spec.scalars(dims))
    got = _shuffled_within_buckets(ref, dims)
    assert not torch.equal(got["sorted_token_ids"].double(), ref["sorted_token_ids"])  # order did change
    canon = spec.canonical(got, dims)
    assert torch.equal(canon["sorted_token_ids"].double(), ref["sorted_token_ids"])
    # one pair moved to the neighbouring bucket's region: still wrong after canonicalization
    s = got["sorted_token_ids"].clone()
    total, bs = int(ref["num_tokens_post_pad"][0]), dims[3]
    e = ref["expert_ids"][: total // bs].long()
    first = int(torch.nonzero(e != e[0])[0]) * bs  # first slot of the second bucket's region
    s[0], s[first] = s[first].clone(), s[0].clone()
    bad = spec.canonical({**got, "sorted_token_ids": s}, dims)
    assert not torch.equal(bad["sorted_token_ids"].double(), ref["sorted_token_ids"])


def test_harness_judges_atomic_order_as_correct_and_a_wrong_bucket_as_wrong_on_cpu():
    from astra_sglang.harness.guards import GuardedSet
    from astra_sglang.harness.oracle import run_case

    spec = get_op("moe_align")

    class Impl:
        def __init__(self, wrong=False):
            self.wrong, self.calls = wrong, 0

        def __call__(self, tensors, dims, dtype, scalars, stream=None):
            self.calls += 1
            ins = {a.name: tensors[a.name] for a in spec.abi if a.ctype == "ptr"}
            ref = spec.reference({n: v.double() for n, v in ins.items()}, dims, scalars)
            got = _shuffled_within_buckets(ref, dims, seed=self.calls)
            if self.wrong:
                got["sorted_token_ids"][[0, -1]] = got["sorted_token_ids"][[-1, 0]].clone()
            for n in ("sorted_token_ids", "expert_ids", "num_tokens_post_pad"):
                tensors[n].copy_(got[n].to(tensors[n].dtype).reshape(tensors[n].shape))
            return 0

    for shape in list(spec.edge_shapes)[:5] + [spec.corpus[0]]:
        dims = shape.dims
        protos = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(1), "uniform", device="cpu")
        bc, bp = GuardedSet(spec, protos, "cpu", 1024), GuardedSet(spec, protos, "cpu", 1024)
        for run, dist in enumerate(spec.distributions):
            details, failures, _ = run_case(spec, Impl(), Impl(), bc, bp, dims, "int32", dist, 7, "cpu",
                                            run_index=run)
            assert not failures, failures
            assert details and all(d["ok"] for d in details)
    dims = spec.corpus[0].dims
    protos = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(1), "uniform", device="cpu")
    bc, bp = GuardedSet(spec, protos, "cpu", 1024), GuardedSet(spec, protos, "cpu", 1024)
    _, failures, _ = run_case(spec, Impl(wrong=True), Impl(), bc, bp, dims, "int32", "uniform", 7, "cpu")
    assert any("sorted_token_ids" in f for f in failures), failures


# ------------------------------------------------------------------------------------------ corpus
def test_corpus_comes_from_real_configs():
    spec = get_op("moe_align")
    assert {"decode", "prefill"} <= {t for s in spec.corpus for t in s.tags}
    qwen = {s.dims[0]: s.dims for s in spec.corpus if "qwen3-30b-a3b" in s.source}
    assert qwen[1] == (1, 8, 129, 16, 128)  # batch 1: BLOCK_SIZE_M 16 from the H200 config
    assert qwen[256][3] == 32 and qwen[1024][3] == 128 and qwen[16384][3] == 128
    assert {s.dims[2] for s in spec.corpus} == {129, 257, 9, 33}  # E + 1 for 128, 256, 8, 32 experts
    for s in list(spec.corpus) + list(spec.edge_shapes):
        assert spec.variant("jit").supports(s.dims, "int32") is None, s.dims
        assert spec.bytes_moved(s.dims, "int32") > 0


# ------------------------------------------------------------------------------------------ builds
@pytest.mark.nvcc
def test_shipped_kernel_compiles_for_sm90a(tmp_path):
    if not _has_nvcc():
        pytest.skip("needs nvcc")
    from astra_sglang.registry import shipped_kernel

    so = tmp_path / "k.so"
    r = subprocess.run(["nvcc", "-arch=sm_90a", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                        str(shipped_kernel("moe_align")), "-o", str(so)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    assert "astra_moe_align" in syms


def _extract(src, dest, tvm, variant=None):
    from astra_sglang.build import Arch
    from astra_sglang.build.workspace import Workspace
    from astra_sglang.extract import discover, extract

    roots = discover(Path(src), None, Path(tvm) if tvm else None)
    extract(get_op("moe_align"), roots, dest, Arch(9, 0), variant=variant)
    return Workspace.open("moe_align", path=dest)


@pytest.mark.wheels
@pytest.mark.nvcc
def test_jit_variant_from_the_0_5_17_wheel_builds(sglang_0_5_17_source, wheel_sources, tmp_path):
    if not _has_nvcc():
        pytest.skip("needs nvcc")
    ws = _extract(sglang_0_5_17_source, tmp_path / "ws", wheel_sources["tvm"], "jit")
    assert ws.manifest["launch_facts"] == {"SMALL_NUMEL": "1024", "SMALL_BUCKETS": "64", "FILL_THREADS": "256",
                                           "ALIGN_THREADS": "1024", "SORT_THREADS": "256",
                                           "SORT_MAX_BLOCKS": "65535"}
    res = ws.build()
    assert res.ok, res.log[-3000:]


@pytest.mark.wheels
def test_jit_variant_of_0_5_23_fails_loudly(wheel_sources, tmp_path):
    from astra_sglang.errors import AstraError

    if not _has_nvcc():
        pytest.skip("extract looks for nvcc first")
    with pytest.raises(AstraError, match="launcher update"):
        _extract(wheel_sources["sglang"], tmp_path / "ws", wheel_sources["tvm"], "jit")


def _synthetic_checkout(root: Path, wheel_jit_cu: Path) -> Path:
    """An sgl-kernel checkout whose csrc/moe/moe_align_kernel.cu has the AOT file's layout (ATen headers, kernels
    at file scope, a torch host function) around the kernel text of the wheel's JIT port (the same kernels)."""
    text = wheel_jit_cu.read_text()
    body = text[text.index("#define VEC_SIZE 4"): text.index("}  // namespace moe")]
    body = body.replace("namespace moe {\n", "")
    host = """
void moe_align_block_size(
    torch::Tensor topk_ids, int64_t num_experts, int64_t block_size, torch::Tensor sorted_token_ids,
    torch::Tensor experts_ids, torch::Tensor num_tokens_post_pad, torch::Tensor cumsum_buffer,
    bool pad_sorted_token_ids) {
  int threads = 1024;
  DISPATCH_INTEGRAL_TYPES(topk_ids.scalar_type(), "moe_align_block_size_kernel", [&] {
    bool small_batch_expert_mode = (topk_ids.numel() < 1024) && (num_experts <= 64);
    constexpr int32_t fill_threads = 256;
    const int block_threads = std::min(256, (int)threads);
    const int max_blocks = 65535;
  });
}
"""
    cu = root / "sgl-kernel" / "csrc" / "moe" / "moe_align_kernel.cu"
    cu.parent.mkdir(parents=True)
    (root / "sgl-kernel" / "include").mkdir(parents=True)
    cu.write_text("#include <ATen/ATen.h>\n#include <THC/THCAtomics.cuh>\n\n#include \"utils.h\"\n\n" + body + host)
    (root / "sgl-kernel" / "pyproject.toml").write_text('[project]\nname = "sglang-kernel"\nversion = "0.4.5"\n')
    return root


@pytest.mark.wheels
@pytest.mark.nvcc
def test_sgl_kernel_variant_from_a_checkout_builds(sglang_0_5_17_source, tmp_path):
    if not _has_nvcc():
        pytest.skip("needs nvcc")
    jit = Path(sglang_0_5_17_source) / "sglang" / "kernels" / "jit" / "csrc" / "moe" / "moe_align_kernel.cu"
    co = _synthetic_checkout(tmp_path / "sglang", jit)
    ws = _extract(co, tmp_path / "ws", None)
    assert ws.manifest["variant"] == "sgl_kernel"  # the default when a checkout is given
    assert ws.manifest["launch_facts"]["SGL_IGNORE"] == ""
    ex = (ws.path / "src" / "excerpts" / "moe_align_kernels.cuh").read_text()
    assert "count_and_sort_expert_tokens_kernel" in ex and "torch::Tensor" not in ex
    res = ws.build()
    assert res.ok, res.log[-3000:]


def test_sgl_kernel_ignore_invalid_expert_fact_reads_both_signatures():
    regex = next(r for _, r, m in get_op("moe_align").variant("sgl_kernel").source_facts if "ignore" in m)
    old = "int32_t* __restrict__ cumsum,\n    bool pad_sorted_token_ids,\n    const int32_t scan_size,"
    new = "int32_t* __restrict__ cumsum,\n    bool pad_sorted_token_ids,\n    bool ignore_invalid_expert,\n" \
          "    const int32_t scan_size,"
    assert re.search(regex, old, re.M).group("SGL_IGNORE") == ""
    assert re.search(regex, new, re.M).group("SGL_IGNORE") == "ignore_invalid_expert"


# ------------------------------------------------------------------------------------------ adapter
@pytest.mark.parametrize("module", ["sglang.kernels.ops.moe", "sglang.kernels.ops.moe.moe_align"])
def test_adapter_binds_sglangs_calls(sglang_pkg, module):
    from astra_sglang.patch.adapters import Binder, adapter_mismatch

    spec, ad = get_op("moe_align"), op_part("moe_align", "adapter").ADAPTER
    assert adapter_mismatch(spec, ad) is None
    b = Binder(real_function(sglang_pkg, module, "moe_align_block_size"), ad, spec)
    assert b.ok, b.problem
    ids = torch.randint(0, 128, (4, 8), dtype=torch.int32)
    bufs = (torch.empty(2000, dtype=torch.int32), torch.empty(125, dtype=torch.int32),
            torch.empty(1, dtype=torch.int32), torch.empty(130, dtype=torch.int32))
    # triton_utils/moe_align_block_size.py: positional, num_experts + 1, pad True
    canon, why = b.bind((ids, 129, 16, *bufs, True), {})
    assert canon is not None, why
    views, dims = ad.normalize(canon)
    assert dims == (4, 8, 129, 16, 2000) and views["sorted_token_ids"].data_ptr() == bufs[0].data_ptr()
    assert isinstance(ad.normalize({**canon, "cumsum_buffer": torch.empty(10, dtype=torch.int32)}), str)
    if "ignore_invalid_expert" in b.params:
        assert b.bind((ids, 129, 16, *bufs, True, True), {})[0] is None  # EP ignore: SGLang's original


def test_layer_and_adapter_modules_import_without_sglang():
    assert callable(op_part("moe_align", "layer").run_layer)
    ad = op_part("moe_align", "adapter")
    assert ad.ADAPTER.op == "moe_align" and not ad.DEFAULT_OFF  # on: measured in the step A/B (RESULTS.md)


def test_adapter_takes_the_decode_rows_and_leaves_prefill_to_sglang():
    """With the padding as one coalesced fill (H200 2026-11-29, session 19) the one-block kernel wins the rows it
    lost before (2048 ids on 129 buckets 0.88x -> 1.27x, 1024 ids on 257 buckets 0.93x -> 1.11x); calls above
    the decode corpus's 2048 ids (prefill) stay SGLang's."""
    ad = op_part("moe_align", "adapter").ADAPTER
    assert ad.kept_by_sglang((128, 8, 129, 16, 2960)) is None
    assert ad.kept_by_sglang((256, 8, 129, 32, 6048)) is None         # 2048 ids, 256 tokens at top-8
    assert ad.kept_by_sglang((128, 8, 257, 64, 17216)) is None        # 1024 ids on DeepSeek-V3's 257 buckets
    assert ad.kept_by_sglang((256, 8, 257, 64, 18240)) is None
    assert "2056 ids > 2048" in ad.kept_by_sglang((257, 8, 129, 32, 6056))
    assert ad.kept_by_sglang((8192, 8, 129, 128, 82048)) is not None  # prefill


def test_self_check_class_ignores_the_buffer_length_the_token_count_sets(tmp_path):
    """max_num_tokens_padded follows from the token count: with it in the shape class every prefill length was a
    class of its own, and each new one a ~10 ms self-check on the request's path (H200 server, 2026-11-27)."""
    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState, TorchBackend

    for op in ("moe_align", "moe_route_align"):
        ad = op_part(op, "adapter").ADAPTER
        assert "max_num_tokens_padded" in ad.token_derived
        st = OpState(get_op(op), ad, TorchBackend("cpu", lambda v, d, s: None, dtypes=("int32", "fp32", "bf16")),
                     CounterFile(tmp_path / op, [op]))
        a, b = (300, 8, 129, 64, 300 * 8 + 129 * 63), (500, 8, 129, 64, 500 * 8 + 129 * 63)
        if op == "moe_route_align":
            a, b = (300, 128, 8, 64, a[4]), (500, 128, 8, 64, b[4])
        assert st.shape_class(a, "int32") == st.shape_class(b, "int32")          # one 512-token bucket
        assert st.shape_class(a, "int32") != st.shape_class(a[:3] + (16,) + a[4:], "int32")  # block_m counts


def test_patch_self_check_skips_scratch_the_reference_does_not_define():
    """The patched moe_align died in its first self-check inside a Qwen3-30B-A3B step on the H200 (KeyError
    'cumsum_buffer', 2026-11-24): the self-check compares the reference's outputs only, scratch aside; a wrong
    output still fails."""
    import torch

    from astra_sglang.patch.ops import compare
    from astra_sglang.registry import get_op

    spec = get_op("moe_align")
    dims = next(s.dims for s in spec.shapes("decode"))
    inputs = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(0), "normal", device="cpu")
    scalars = {n: v for n, v in inputs.items() if not hasattr(v, "clone")}
    ref = spec.reference(inputs, tuple(dims), scalars)
    out = {n: v.to(torch.int32) for n, v in ref.items()}
    out["cumsum_buffer"] = inputs["cumsum_buffer"].clone()
    names = [a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("out", "inout")]
    assert "cumsum_buffer" in names
    assert compare(spec, inputs, out, out, dims, names).ok
    wrong = {**out, "num_tokens_post_pad": out["num_tokens_post_pad"] + 16}
    assert not compare(spec, inputs, out, wrong, dims, names).ok


def test_patch_self_check_of_a_correct_kernel_passes_above_the_sampled_row_count(tmp_path):
    """moe_align has no row-wise tensors, so the self-check cannot sample rows: it must check the whole call
    with the call's own dims. It used to pass the sampled row count as dims[0], and the canonical form then
    clamped every id above it, so production and astra alike "failed" (the batch-32 prefill of a Qwen3-30B-A3B
    step on the H200, 2026-11-24, 8192 tokens: PATCH DISABLED, err 25 > tol 24.3, production 24.3)."""
    import torch

    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState
    from astra_sglang.registry import get_op, op_part

    spec = get_op("moe_align")
    ad = op_part("moe_align", "adapter").ADAPTER
    assert not ad.rowwise

    def correct(views, dims, flip=False):
        """A correct kernel: the reference's outputs; flip: each block's slots in reverse order (atomics order
        pairs within an expert freely, so two correct kernels disagree there; the canonical form undoes it)."""
        scal = {n: v for n, v in views.items() if not hasattr(v, "clone")}
        for n, v in spec.reference(views, tuple(dims), scal).items():
            views[n].copy_(v.to(views[n].dtype).reshape(views[n].shape))
        if flip:
            bs, total = int(dims[3]), int(views["num_tokens_post_pad"][0])
            s = views["sorted_token_ids"]
            s[:total].copy_(s[:total].view(-1, bs).flip(1).reshape(-1))

    class CpuBackend:
        devices, dtypes = ("cpu",), ("int32",)

        def launch(self, views, dims, dt, scalars):
            correct(views, dims, flip=True)

    dims = (64, 8, 129, 16, 64 * 8 + 129 * 15)      # 64 tokens, above check_rows = 8
    views = spec.make_inputs(dims, "int32", torch.Generator().manual_seed(0), "normal", device="cpu")
    views.update(spec.scalars(dims))   # what the adapter's normalize passes along
    st = OpState(spec, ad, CpuBackend(), CounterFile(tmp_path, ["moe_align"]), check_rows=8)
    st.execute(views, dims, "int32", lambda v: correct(v, dims))
    assert st.disabled is None, st.disabled
    assert st.last_check is not None and st.last_check.ok


def test_layer_maps_a_shorter_sglang_buffer_onto_the_case_length(monkeypatch):
    """sglang 0.5.17 sizes sorted_token_ids without rounding to 4, the corpus rounds (validate crashed on
    167 vs 168 on the H200, 2026-11-26): the layer's output has the case's length, the tail is the pad value."""
    import sys
    import types

    import torch

    t, k, nb, bs = 3, 2, 5, 4
    n_sorted = 8

    def fake_align(topk_ids, block, num_experts):
        s = torch.arange(7, dtype=torch.int32)           # one slot short of the case's 8
        return s, torch.zeros(2, dtype=torch.int32), torch.tensor([8], dtype=torch.int32)

    name = "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size"
    mod = types.ModuleType(name)
    mod.moe_align_block_size = fake_align
    for parent in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe",
                   "sglang.srt.layers.moe.moe_runner", "sglang.srt.layers.moe.moe_runner.triton_utils"):
        monkeypatch.setitem(sys.modules, parent, sys.modules.get(parent) or types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, name, mod)
    inp = {"topk_ids": torch.zeros(t, k, dtype=torch.int32), "expert_ids": torch.full((4,), -7, dtype=torch.int32)}
    out = op_part("moe_align", "layer").run_layer(inp, (t, k, nb, bs, n_sorted), {})
    assert out["sorted_token_ids"].tolist() == [0, 1, 2, 3, 4, 5, 6, t * k]
    assert out["expert_ids"].tolist() == [0, 0, -7, -7]
