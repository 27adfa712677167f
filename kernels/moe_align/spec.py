"""moe_align: SGLang's moe_align_block_size, the sort of (token, slot) pairs by expert that the Triton
fused_moe GEMMs read, as sgl_kernel runs it: `moe_align_block_size_kernel<int>` (counts, block-padded
scan, expert_ids, cumsum; a second block pads sorted_token_ids) then `count_and_sort_expert_tokens_kernel<int>`
(one atomicAdd per id on the cumsum scratch). Two launches on every MoE layer of a decode step.

Contract (SGLang 0.5.17 sglang/srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py calling
sglang.kernels.ops.moe.moe_align_block_size -> sgl_kernel.moe_align_block_size, sgl-kernel 0.4.5):
  ids are flattened topk_ids [num_tokens * topk] (int32); the kernel takes num_buckets = E + 1: id -1
  (EP-filtered) is bucket 0, expert e is bucket e + 1 ("+1 convention");
  sorted_token_ids has SGLang's max_num_tokens_padded rounded up to 4 (sorted_len: production pads it with int4
  stores over ceil(len / 4) vectors; 0.5.23 allocates the rounded length, 0.5.17's allocator slack absorbs it);
  bucket b's pairs occupy sorted_token_ids[prefix[b], prefix[b] + count[b]), prefix the exclusive scan of
  ceil(count / block_size) * block_size; every other slot of the buffer holds numel (pad_sorted_token_ids);
  expert_ids[j] = b - 1 for the blocks j < total / block_size of bucket b (-1: filtered); blocks past that
  are not written; num_tokens_post_pad[0] = total; cumsum_buffer [E + 2] is scratch nobody reads after.
Order: within a bucket production places pairs in atomicAdd order (count_and_sort_expert_tokens_kernel),
which the scheduler decides: it is NOT deterministic (one token at batch 1: top-k ids are distinct, so
every bucket holds <= 1 pair and the result is). The oracle therefore compares a canonical form
(spec.canonical): inside each bucket's region the ids sorted ascending, which is what the reference
writes; counts, offsets, padding, expert_ids and the total are compared exactly as written.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.spec import AbiArg, Excerpt, OpSpec, Shape, SourceFile, Tolerance, Variant, dedupe_shapes

# decode batches of this op's corpus (more small ones than the shared sweep: the op is latency-bound)
DECODE = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL = (1024, 4096, 16384)

# BLOCK_SIZE_M the Triton fused_moe config gives for M tokens (nearest key, as SGLang's
# try_get_optimal_moe_config picks), from the H200 files in the 0.5.17 wheel
# (sglang/srt/layers/moe/moe_runner/triton_utils/configs/):
_QWEN3_H200 = {1: 16, 2: 16, 4: 16, 8: 16, 16: 16, 24: 16, 32: 16, 48: 16, 64: 16, 96: 16, 128: 16, 256: 32,
               512: 64, 1024: 128, 1536: 128, 2048: 128, 3072: 128, 4096: 128}  # triton_3_6_0 E=128,N=768
_DSV3_H200 = {1: 16, 2: 16, 4: 64, 8: 64, 16: 16, 24: 64, 32: 64, 48: 64, 64: 64, 96: 64, 128: 64, 256: 64,
              512: 64, 1024: 64, 1536: 64, 2048: 64, 3072: 128, 4096: 64}  # E=256,N=256 fp8 block [128,128]
_MIXTRAL_H200 = {1: 16, 2: 32, 4: 16, 8: 16, 16: 16, 24: 16, 32: 16, 48: 32, 64: 32, 96: 32, 128: 64,
                 256: 128, 512: 128, 1024: 128, 1536: 128, 2048: 128, 3072: 128, 4096: 128}  # E=8,N=14336

# (name, experts, top-k, block table or the block sizes to cover when the wheel has no H200 file)
MOE_MODELS: Tuple[Tuple[str, int, int, Any], ...] = (
    ("qwen3-30b-a3b", 128, 8, _QWEN3_H200),
    ("deepseek-v3", 256, 8, _DSV3_H200),
    ("mixtral-8x7b", 8, 2, _MIXTRAL_H200),
    ("gpt-oss-20b", 32, 4, (16, 64)),  # no tuned H200 file in 0.5.17: SGLang's default config
    ("gpt-oss-120b", 128, 4, (16, 64)),
)


def block_for(table: Mapping[int, int], tokens: int) -> int:
    """The config entry SGLang uses for `tokens`: the key nearest to it (ties: the smaller key)."""
    return table[min(table, key=lambda k: (abs(k - tokens), k))]


def max_num_tokens_padded(numel: int, num_experts: int, block_size: int) -> int:
    """The length SGLang 0.5.17's moe_align_block_size computes for sorted_token_ids (num_experts = E, not
    E + 1), before any rounding. Not always what the kernel writes: see sorted_len."""
    if numel < num_experts + 1:
        return numel * block_size
    return numel + (num_experts + 1) * (block_size - 1)


# The align kernels (moe_align_block_size_kernel and _v2, block 1) pad sorted_token_ids with int4 stores over
# ceil(len / PAD_VEC) vectors: ceil(len / 4) * 4 ints, up to 3 past a length that is not a multiple of 4.
# SGLang 0.5.17 allocates the unrounded length with torch.empty, where the caching allocator's 512-byte
# rounding swallows the overrun; 0.5.23 allocates `(len + 3) // 4 * 4` ("The align kernel pads sorted_ids with
# int4 stores"). The harness puts guard bytes right after each buffer, so the corpus allocates the rounded
# length: the memory production writes in SGLang, and its kernel then pads exactly that (it reads the length from
# the buffer, i.e. this dim). The small-batch kernel (< 1024 ids, <= 64 buckets) pads with scalar stores.
PAD_VEC = 4


def sorted_len(numel: int, num_experts: int, block_size: int) -> int:
    """sorted_token_ids' length in this op's corpus: SGLang's max_num_tokens_padded rounded up to a multiple of
    PAD_VEC (what 0.5.23 allocates; in 0.5.17, the extent production's int4 padding writes)."""
    n = max_num_tokens_padded(numel, num_experts, block_size)
    return -(-n // PAD_VEC) * PAD_VEC


def dims_for(tokens: int, topk: int, experts: int, block: int) -> Tuple[int, int, int, int, int]:
    return (tokens, topk, experts + 1, block, sorted_len(tokens * topk, experts, block))


def _corpus() -> Tuple[Shape, ...]:
    shapes = []
    for name, e, k, blocks in MOE_MODELS:
        for tag, tokens in (("decode", DECODE), ("prefill", PREFILL)):
            for t in tokens:
                for b in ((block_for(blocks, t),) if isinstance(blocks, dict) else blocks):
                    shapes.append(Shape(dims_for(t, k, e, b), (tag,), name))
    return dedupe_shapes(shapes)


EDGE = (
    Shape(dims_for(1, 1, 8, 16), ("edge",), "one id"),
    Shape(dims_for(3, 6, 64, 16), ("edge",), "65 buckets: just past production's small-batch kernel"),
    Shape(dims_for(5, 8, 63, 64), ("edge",), "64 buckets: production's small-batch kernel"),
    Shape(dims_for(512, 8, 128, 64), ("edge",), "4096 ids: the largest the shipped one-launch path takes"),
    Shape(dims_for(513, 8, 128, 64), ("edge",), "4104 ids: the shipped two-launch path"),
    Shape(dims_for(7, 8, 1500, 16), ("edge",), "1501 buckets: production's v2 align kernel"),
    Shape(dims_for(64, 8, 256, 1), ("edge",), "block_size 1 (no padding)"),
)


def scalars(dims) -> Dict[str, Any]:
    return {"num_experts": int(dims[2]), "block_size": int(dims[3]), "pad_sorted_token_ids": 1}


def make_inputs(dims, dtype: str, gen, dist: str = "uniform", device: str = "cuda") -> Dict[str, Any]:
    """topk_ids: per token `topk` distinct experts (Gumbel top-k over expert weights, as a router picks).
    uniform: equal weights; skewed: Zipf-like weights (hot experts, long padded tails); ep: uniform with
    about a quarter of the ids -1 (expert-parallel filtered). expert_ids and cumsum_buffer start as random
    ints: blocks past the total must keep theirs, the scratch is never compared."""
    import torch

    t, k, nb, bs, n_sorted = dims
    e = nb - 1
    w = torch.ones(e, device=device)
    if dist == "skewed":
        w = 1.0 / torch.arange(1, e + 1, device=device, dtype=torch.float32) ** 1.2
        w = w[torch.randperm(e, generator=gen, device=device)]
    u = torch.rand((t, e), generator=gen, device=device).clamp_(1e-12, 1.0)
    ids = (w.log() - (-u.log()).log()).topk(k, dim=1).indices.to(torch.int32)
    if dist == "ep":
        drop = torch.rand((t, k), generator=gen, device=device) < 0.25
        ids = torch.where(drop, torch.full_like(ids, -1), ids)
    n_blocks = -(-n_sorted // bs)
    rnd = lambda n: torch.randint(-1, max(e, 1), (n,), generator=gen, device=device, dtype=torch.int32)  # noqa: E731
    return {
        "topk_ids": ids.contiguous(),
        "sorted_token_ids": torch.empty((n_sorted,), device=device, dtype=torch.int32),
        "expert_ids": rnd(n_blocks),
        "num_tokens_post_pad": torch.empty((1,), device=device, dtype=torch.int32),
        "cumsum_buffer": rnd(nb + 1),
    }


def align_np(ids, num_buckets: int, block_size: int, n_sorted: int, expert_ids_in, pad: bool = True):
    """The exact integer result (numpy), ids of a bucket in ascending order: (sorted, expert_ids, total).
    Ids outside [-1, num_buckets - 1) are dropped (production's behaviour there is undefined)."""
    import numpy as np

    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    numel = ids.size
    b = ids + 1
    keep = (b >= 0) & (b < num_buckets)
    counts = np.bincount(b[keep], minlength=num_buckets)
    padded = -(-counts // block_size) * block_size
    prefix = np.concatenate([[0], np.cumsum(padded)])
    total = int(prefix[-1])
    if total > n_sorted:
        raise ValueError(f"{total} aligned slots do not fit sorted_token_ids [{n_sorted}]")
    out = np.full(n_sorted, numel if pad else -1, dtype=np.int64)
    order = np.argsort(np.where(keep, b, num_buckets), kind="stable")[: int(keep.sum())]
    bb = b[order]
    rank = np.arange(order.size) - np.concatenate([[0], np.cumsum(counts)])[bb]
    out[prefix[bb] + rank] = order
    eids = np.array(expert_ids_in, dtype=np.int64).reshape(-1).copy()
    nblk = total // block_size
    blk_bucket = np.searchsorted(prefix, np.arange(nblk) * block_size, side="right") - 1
    eids[:nblk] = blk_bucket - 1
    return out, eids, total


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    ids = inp["topk_ids"].detach().cpu().to(torch.int64).numpy()
    nb = int(scalars.get("num_experts", dims[2]))
    bs = int(scalars.get("block_size", dims[3]))
    n_sorted = int(inp["sorted_token_ids"].numel()) if "sorted_token_ids" in inp else int(dims[4])
    eids_in = inp["expert_ids"].detach().cpu().to(torch.int64).numpy()
    out, eids, total = align_np(ids, nb, bs, n_sorted, eids_in, bool(scalars.get("pad_sorted_token_ids", 1)))
    dev = inp["topk_ids"].device
    f = lambda a: torch.from_numpy(a).to(device=dev, dtype=torch.float64)  # noqa: E731
    return {"sorted_token_ids": f(out), "expert_ids": f(eids),
            "num_tokens_post_pad": torch.tensor([float(total)], dtype=torch.float64, device=dev)}


def canonical(outs: Dict[str, Any], dims) -> Dict[str, Any]:
    """sorted_token_ids with each bucket's region sorted ascending (key: the block's own expert_ids entry,
    then the id), positions up to the output's own total; everything else as written. A wrong expert_ids
    or total fails on its own comparison, and sorting inside equal keys cannot hide a pair in the wrong
    bucket: regions are block-aligned and keyed by their expert."""
    import torch

    if not {"sorted_token_ids", "expert_ids", "num_tokens_post_pad"} <= set(outs) or len(dims) < 4:
        return outs
    s, e = outs["sorted_token_ids"], outs["expert_ids"]
    bs = max(1, int(dims[3]))
    numel = int(dims[0]) * int(dims[1])
    n = min(max(int(outs["num_tokens_post_pad"].reshape(-1)[0].item()), 0), s.numel(), e.numel() * bs)
    if n == 0:
        return outs
    v = s.reshape(-1)[:n].to(torch.int64)
    blk = e.reshape(-1).to(torch.int64)[torch.arange(n, device=s.device) // bs]
    span = numel + 2 + (1 << 20)  # values clamp into one key band per block expert
    key = (blk + 2) * span + v.clamp(-(1 << 20), numel + 1) + (1 << 20)
    out = dict(outs)
    c = s.clone()
    c.reshape(-1)[:n] = v[torch.sort(key, stable=True).indices].to(s.dtype)
    out["sorted_token_ids"] = c
    return out


def bytes_moved(dims, dtype: str) -> int:
    t, k, nb, bs, n_sorted = dims
    return 4 * (t * k + n_sorted + -(-n_sorted // bs) + 1)


def production_int4_overrun(dims) -> int:
    """Ints production's align kernel writes past sorted_token_ids [dims[4]] (its block 1 pads ceil(len / 4)
    int4 vectors; the small-batch kernel, numel < 1024 with <= 64 buckets, pads with scalar stores)."""
    t, k, nb, _bs, n_sorted = (int(x) for x in dims[:5])
    if t * k < 1024 and nb <= 64:
        return 0
    return -(-n_sorted // PAD_VEC) * PAD_VEC - n_sorted


def _overrun_reason(dims) -> Optional[str]:
    over = production_int4_overrun(dims)
    if over:
        n = int(dims[4])
        return (f"sorted_token_ids [{n}] is not a multiple of {PAD_VEC}: production's int4 padding writes {over} "
                f"int(s) past it (SGLang's caching allocator hides that; 0.5.23 allocates the rounded length): "
                f"use {n + over}")
    return None


def _sgl_supports(dims, dtype: str) -> Optional[str]:
    if dims[2] > 8192:
        return f"{dims[2]} buckets: SGLang's kernel takes at most 8192"
    return _overrun_reason(dims)


def _aot_supports(dims, dtype: str) -> Optional[str]:
    if dims[2] > 1024:
        return f"{dims[2]} buckets: the sgl_kernel launcher knows no v2 kernel (use the jit variant)"
    return _overrun_reason(dims)


_JIT = "csrc/moe/moe_align_kernel.cu"
_AOT = "sgl-kernel/csrc/moe/moe_align_kernel.cu"
_LAUNCH_FACTS = lambda path: (  # noqa: E731
    (path, r"bool small_batch_expert_mode = \((?:topk_ids\.)?numel(?:\(\))? < (?P<SMALL_NUMEL>\d+)\) && "
           r"\(num_experts <= (?P<SMALL_BUCKETS>\d+)\);",
     "the small-batch kernel takes numel < SMALL_NUMEL ids and <= SMALL_BUCKETS buckets"),
    (path, r"constexpr int32_t fill_threads = (?P<FILL_THREADS>\d+);", "small-batch kernel's padding threads"),
    (path, r"int threads = (?P<ALIGN_THREADS>\d+);", "threads of the align kernel's blocks"),
    (path, r"const int block_threads = std::min\((?P<SORT_THREADS>\d+), (?:\(int\))?threads\);",
     "count_and_sort threads per block"),
    (path, r"const int max_blocks = (?P<SORT_MAX_BLOCKS>\d+);", "count_and_sort grid cap"),
    (path, r"int32_t expert_id = topk_ids\[i\] \+ 1;", "the +1 convention: id -1 is bucket 0"),
    (path, r"expert_ids\[i\] = left - 2;", "expert_ids = bucket - 1, found by binary search over the prefix"),
    (path, r"if \(blockIdx\.x == 1\) \{\s*if \(pad_sorted_token_ids\) \{",
     "the align kernel's second block pads sorted_token_ids"),
    (path, r"^#define VEC_SIZE 4\s*$", "int4 padding vectors (spec.PAD_VEC: the corpus rounds sorted_token_ids to 4)"),
    (path, r"int32_t total_vecs = \(max_num_tokens_padded \+ VEC_SIZE - 1\) / VEC_SIZE;",
     "block 1 pads ceil(len / VEC_SIZE) vectors (spec.production_int4_overrun)"),
)

SPEC = OpSpec(
    name="moe_align",
    summary="sort (token, slot) ids by expert into block_size-padded segments for fused_moe (moe_align_block_size)",
    dim_names=("num_tokens", "topk", "num_buckets", "block_m", "max_num_tokens_padded"),
    abi=(
        AbiArg("topk_ids", "ptr", "in"),
        AbiArg("sorted_token_ids", "ptr", "out"),
        AbiArg("expert_ids", "ptr", "inout"),  # blocks past the total keep what they held
        AbiArg("num_tokens_post_pad", "ptr", "out"),
        AbiArg("cumsum_buffer", "ptr", "inout"),  # scratch [num_experts + 1]; never compared
        AbiArg("num_tokens", "i64"),
        AbiArg("topk", "i64"),
        AbiArg("max_num_tokens_padded", "i64"),
        AbiArg("num_experts", "i64"),  # buckets, E + 1, as SGLang passes it
        AbiArg("block_size", "i64"),
        AbiArg("pad_sorted_token_ids", "i64"),
    ),
    variants=(
        Variant(
            name="jit",
            description="SGLang's JIT port of the sgl_kernel kernels (sglang/kernels/jit csrc/moe/moe_align_kernel.cu: "
            "the same moe::moe_align_block_size_kernel + moe::count_and_sort_expert_tokens_kernel, launched as "
            "sgl_kernel launches them)",
            provenance="sglang/kernels/ops/moe/moe_align.py moe_align_block_size -> MoeAlignBlockSizeKernel<int>::run "
            "(the registry's JIT backend for moe.moe_align_block_size; the AOT backend sgl_kernel runs the same "
            "kernels, see the sgl_kernel variant)",
            sources=(SourceFile("sglang_jit", _JIT),),
            include_roots=("tvm_ffi", "dlpack"),
            launcher="launch_jit.cu.in",
            flag_profile="sglang_jit",
            source_facts=_LAUNCH_FACTS(_JIT) + (
                (_JIT, r"template <typename scalar_t>\s*__global__ void moe_align_block_size_kernel\([^{]*?"
                 r"int32_t\* __restrict__ cumsum,\s*bool pad_sorted_token_ids,\s*const int32_t scan_size,\s*"
                 r"int32_t max_num_tokens_padded\) \{",
                 "0.5.17's align kernel signature (0.5.23's is templated on write/map/pad flags: launcher update)"),
                (_JIT, r"^namespace moe \{", "kernels in namespace moe at file scope"),
            ),
            dtypes=("int32",),
            supports=_sgl_supports,
        ),
        Variant(
            name="sgl_kernel",
            description="sgl_kernel moe_align_block_size (sgl-kernel csrc/moe/moe_align_kernel.cu, what 0.5.17 runs)",
            provenance="sglang.kernels.ops.moe.moe_align_block_size -> get_kernel(AOT) -> sgl_kernel.moe_align_block_size "
            "-> sgl-kernel csrc/moe/moe_align_kernel.cu: moe_align_block_size_kernel<int><<<2, 1024, smem>>> then "
            "count_and_sort_expert_tokens_kernel<int><<<min(ceil(numel/256), 65535), 256>>> (numel >= 1024 or more "
            "than 64 buckets; else the one-launch small-batch kernel)",
            sources=(),
            excerpts=(
                Excerpt(
                    SourceFile("sglang_checkout", _AOT),
                    start=r"^#define VEC_SIZE 4",
                    end=r"\n\}\n(?=\s*void moe_align_block_size\()",
                    header="moe_align_kernels.cuh",
                    meaning="the device kernels (the host function needs torch)",
                ),
            ),
            launcher="launch_sgl_kernel.cu.in",
            flag_profile="sgl_kernel_aot",
            source_facts=_LAUNCH_FACTS(_AOT) + (
                (_AOT, r"bool pad_sorted_token_ids,\s*(?:bool )?(?P<SGL_IGNORE>(?<=bool )ignore_invalid_expert|),?\s*"
                 r"const int32_t scan_size",
                 "whether the kernels take ignore_invalid_expert (after pad_sorted_token_ids / numel)"),
            ),
            dtypes=("int32",),
            requires_root="sglang_checkout",
            supports=_aot_supports,
        ),
    ),
    default_variant=lambda roots: "sgl_kernel" if roots.get("sglang_checkout") else "jit",
    dtypes=("int32",),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=1.0, floor={"int32": 0.0}),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("uniform", "skewed", "ep"),
    replaces=(
        "sglang.kernels.ops.moe:moe_align_block_size",
        "sgl_kernel:moe_align_block_size",
        "sglang.kernels.ops.moe.moe_align:moe_align_block_size",
    ),
    # sgl_kernel / JIT kernels (small-batch, v2 included), astra's (namespace astra_malign::)
    kernel_symbols=(r"moe_align_block_size", r"count_and_sort_expert_tokens", r"astra_malign::"),
    canonical=canonical,
)
