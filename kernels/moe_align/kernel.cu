// astra moe_align: SGLang's moe_align_block_size (sgl_kernel align + count_and_sort) with the astra ABI.
// Up to kFusedMaxNumel ids: ONE launch, one block: shared-memory histogram whose atomicAdd results are
// each id's rank in its bucket (kept in registers), a coalesced 16-byte fill of the whole padded buffer, block-padded
// scan, then scatter + expert_ids (no second pass over the ids). Production needs two launches here.
// The fill replaced per-bucket padding stores inside each segment (one thread a bucket, a store a slot: uncoalesced),
// which lost to SGLang from ~1024 ids on (0.88x at 2048 ids, 129 buckets); with the fill 1.27x (H200, 2026-11-29,
// results/2026-11-29-h200/session19).
// Larger inputs: two launches like production (align: 1 block; sort: many blocks) with PDL between them,
// warp-aggregated atomics in the sort (one atomic per bucket per warp, not per id) and padding written
// only where it is (inside segments and the tail), not over the whole buffer first.
// Order within a bucket is atomic order (as production's): the op's contract compares it canonically.
#include <cuda_runtime.h>

#include <cstdint>

namespace astra_malign {
namespace {  // internal linkage: the library exports only astra_moe_align

// Dev flags (kernels/dev/bench_variants.sh), shipped values as defaults.
#ifndef ASTRA_FUSED_MAX_NUMEL  // the most ids the one-launch path takes
#define ASTRA_FUSED_MAX_NUMEL 4096
#endif
#ifndef ASTRA_PER_BUCKET_MAX_BS  // write_layout's one-thread-per-bucket branch up to this block size
#define ASTRA_PER_BUCKET_MAX_BS 32
#endif
#ifndef ASTRA_WIDE_TWO_MIN_NUMEL  // above this many ids on more than 256 buckets: two launches, the first filling
#define ASTRA_WIDE_TWO_MIN_NUMEL (1 << 30)  // sorted coalesced; lost at 2048 ids on 257 (0.86x vs 1.14x, session 19)
#endif
#ifndef ASTRA_FILL_MIN_NUMEL  // one-launch path: from this many ids on, fill all of sorted (16-byte stores), then scatter
#define ASTRA_FILL_MIN_NUMEL 0      // (1 << 30): per-bucket padding stores, as shipped before session 19
#endif

constexpr int kMaxThreads = 1024;
constexpr int kItems = 4;  // ids per thread held in registers on the one-launch path
constexpr int kFusedMaxNumel = ASTRA_FUSED_MAX_NUMEL;
static_assert(kFusedMaxNumel <= kMaxThreads * kItems, "the one-launch path holds kItems ids a thread");
constexpr int kMaxBuckets = 8192;  // SGLang's limit (its kernel's RuntimeCheck)
constexpr int kSortThreads = 256;
constexpr int kPadPerThread = 8;  // one-launch path: padding slots per thread before the block grows

// ASTRA_WIDE_TWO_MIN_NUMEL's rule (the host's path choice and the align kernel's fill agree on it)
__host__ __device__ __forceinline__ bool wide_two_launch(int numel, int buckets) {
  return numel > ASTRA_WIDE_TWO_MIN_NUMEL && buckets > 256;
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// SGLang's +1 convention: id -1 (EP-filtered) is bucket 0. Out-of-range ids are dropped (undefined in
// production, which indexes shared memory with them).
__device__ __forceinline__ int bucket_of(int id, int buckets) {
  const int b = id + 1;
  return (b >= 0 && b < buckets) ? b : -1;
}

// prefix[0..n] = exclusive scan of counts rounded up to bs (prefix[n] = total), any n <= kMaxBuckets.
// Every thread of the block must call it; ends with a barrier.
__device__ void padded_scan(const int* counts, int* prefix, int n, int bs, int* warp_sums) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nthreads = blockDim.x, nwarps = nthreads >> 5;
  const int ept = (n + nthreads - 1) / nthreads;
  const int start = tid * ept;
  int local = 0;
  for (int i = 0; i < ept; ++i) {
    const int e = start + i;
    if (e < n) local += (counts[e] + bs - 1) / bs * bs;
  }
  int incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < nwarps ? warp_sums[lane] : 0;
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += v;
    }
    warp_sums[lane] = wi - w;  // each lane its own slot: no hazard
  }
  __syncthreads();
  int run = warp_sums[warp] + incl - local;
  for (int i = 0; i < ept; ++i) {
    const int e = start + i;
    if (e < n) {
      prefix[e] = run;
      run += (counts[e] + bs - 1) / bs * bs;
    }
  }
  if (tid == nthreads - 1) prefix[n] = run;  // the last thread's inclusive sum is the total
  __syncthreads();
}

// expert_ids of every used block; with `pad`, padding inside segments and past the total (the two-launch path; the
// one-launch path fills sorted first and passes pad = false).
// Decode-sized layouts (no more blocks than threads, block_size <= 32) go one thread per bucket: its own
// blocks' expert ids and its own padding, with no search and no loop over buckets. The other way, used
// before, runs 26 buckets in turn per warp at Qwen3-30B-A3B batch 1 (160 threads) plus a binary search
// per block; the kernel took 3.74 us per call there (H200, 2026-11-26). Larger layouts keep it: it spreads
// thousands of blocks and up to 127-slot pads over the whole block.
__device__ void write_layout(const int* counts, const int* prefix, int n, int bs, int numel, int max_len,
                             bool pad, int32_t* __restrict__ sorted, int32_t* __restrict__ expert_ids) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const int total = prefix[n];
  const int nblk = total / bs;
  const bool per_bucket = nblk <= static_cast<int>(blockDim.x) && bs <= ASTRA_PER_BUCKET_MAX_BS;
  if (per_bucket) {
    for (int e = tid; e < n; e += blockDim.x) {
      const int lo = prefix[e], hi = prefix[e + 1];
      for (int q = lo / bs; q < hi / bs; ++q) expert_ids[q] = e - 1;  // bucket e is expert e - 1
      if (pad)
        for (int p = lo + counts[e]; p < hi; ++p) sorted[p] = numel;
    }
  } else {
    for (int j = tid; j < nblk; j += blockDim.x) {
      const int start = j * bs;
      int lo = 0, hi = n;  // first bucket whose prefix exceeds start
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (prefix[mid] <= start) lo = mid + 1;
        else hi = mid;
      }
      expert_ids[j] = lo - 2;  // bucket lo - 1, expert = bucket - 1
    }
    if (pad)
      for (int e = warp; e < n; e += nwarps) {
        for (int p = prefix[e] + counts[e] + lane; p < prefix[e + 1]; p += 32) sorted[p] = numel;
      }
  }
  if (!pad) return;
  for (int p = total + tid; p < max_len; p += blockDim.x) sorted[p] = numel;
}

// sorted[0, max_len) = numel, coalesced (16-byte stores where sorted is 16-byte aligned); the caller's barrier
// orders these stores before the scatter that overwrites the used slots.
__device__ void fill_sorted(int32_t* __restrict__ sorted, int max_len, int numel) {
  int head = 0;
  if (reinterpret_cast<uintptr_t>(sorted) % 16 == 0) {
    const int4 v = make_int4(numel, numel, numel, numel);
    head = max_len / 4 * 4;
    for (int i = threadIdx.x; i < head / 4; i += blockDim.x) reinterpret_cast<int4*>(sorted)[i] = v;
  }
  for (int i = head + threadIdx.x; i < max_len; i += blockDim.x) sorted[i] = numel;
}

// The one-launch path: numel <= blockDim.x * kItems. `fill`: the padding as one coalesced fill of sorted before the
// scatter, instead of per-bucket stores inside each segment.
__global__ void __launch_bounds__(kMaxThreads) fused_align_kernel(
    const int32_t* __restrict__ ids, int32_t* __restrict__ sorted, int32_t* __restrict__ expert_ids,
    int32_t* __restrict__ total_out, int numel, int buckets, int bs, int max_len, bool pad, bool fill) {
  extern __shared__ int smem[];
  int* counts = smem;                    // [buckets]
  int* prefix = counts + buckets;        // [buckets + 1]
  int* warp_sums = prefix + buckets + 1;  // [32]
  const int tid = threadIdx.x, nthreads = blockDim.x;
  for (int i = tid; i < buckets; i += nthreads) counts[i] = 0;
  pdl_wait();  // topk_ids come from the router kernel just before
  __syncthreads();
  int bkt[kItems], rank[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = tid + k * nthreads;
    bkt[k] = i < numel ? bucket_of(ids[i], buckets) : -1;
    rank[k] = bkt[k] >= 0 ? atomicAdd(&counts[bkt[k]], 1) : 0;
  }
  if (pad && fill) fill_sorted(sorted, max_len, numel);
  __syncthreads();
  padded_scan(counts, prefix, buckets, bs, warp_sums);
  pdl_trigger();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if (bkt[k] >= 0) sorted[prefix[bkt[k]] + rank[k]] = tid + k * nthreads;
  }
  write_layout(counts, prefix, buckets, bs, numel, max_len, pad && !fill, sorted, expert_ids);
  if (tid == 0) *total_out = prefix[buckets];
}

// Two-launch path, launch 1: counts, scan, cumsum (each bucket's first slot), layout. One block.
__global__ void __launch_bounds__(kMaxThreads) align_kernel(
    const int32_t* __restrict__ ids, int32_t* __restrict__ sorted, int32_t* __restrict__ expert_ids,
    int32_t* __restrict__ total_out, int32_t* __restrict__ cumsum, int numel, int buckets, int bs, int max_len,
    bool pad) {
  extern __shared__ int smem[];
  int* counts = smem;
  int* prefix = counts + buckets;
  int* warp_sums = prefix + buckets + 1;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  for (int i = tid; i < buckets; i += nthreads) counts[i] = 0;
  pdl_wait();
  __syncthreads();
  for (int i = tid; i < numel; i += nthreads) {
    const int b = bucket_of(ids[i], buckets);
    if (b >= 0) atomicAdd(&counts[b], 1);
  }
  const bool fill = pad && wide_two_launch(numel, buckets);
  if (fill) fill_sorted(sorted, max_len, numel);  // the sort kernel writes only after this grid has ended
  __syncthreads();
  padded_scan(counts, prefix, buckets, bs, warp_sums);
  for (int e = tid; e <= buckets; e += nthreads) cumsum[e] = prefix[e];
  pdl_trigger();  // the sort kernel's griddepcontrol.wait still waits for all of this grid
  write_layout(counts, prefix, buckets, bs, numel, max_len, pad && !fill, sorted, expert_ids);
  if (tid == 0) *total_out = prefix[buckets];
}

// Two-launch path, launch 2: each id to cumsum[bucket]++ (warp-aggregated: one atomic per bucket per warp).
__global__ void __launch_bounds__(kSortThreads) sort_kernel(const int32_t* __restrict__ ids,
                                                              int32_t* __restrict__ sorted,
                                                              int32_t* __restrict__ cumsum, int numel, int buckets) {
  const int lane = threadIdx.x & 31;
  const int stride = blockDim.x * gridDim.x;
  int base = blockIdx.x * blockDim.x + (threadIdx.x & ~31);
  // loads do not depend on the align kernel: issue the first before waiting on it
  int b = base + lane < numel ? bucket_of(ids[base + lane], buckets) : -1;
  pdl_wait();
  for (; base < numel; base += stride) {  // warp-uniform loop: every lane takes part in the match
    const int i = base + lane;
    const unsigned peers = __match_any_sync(0xffffffffu, b);
    if (b >= 0) {
      const int leader = __ffs(peers) - 1;
      int slot = 0;
      if (lane == leader) slot = atomicAdd(&cumsum[b], __popc(peers));
      slot = __shfl_sync(peers, slot, leader) + __popc(peers & ((1u << lane) - 1));
      sorted[slot] = i;
    }
    const int nxt = base + stride + lane;
    b = nxt < numel ? bucket_of(ids[nxt], buckets) : -1;
  }
}

template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}

}  // namespace
}  // namespace astra_malign

extern "C" cudaError_t astra_moe_align(const void* topk_ids, void* sorted_token_ids, void* expert_ids,
                                       void* num_tokens_post_pad, void* cumsum_buffer, int64_t num_tokens,
                                       int64_t topk, int64_t max_num_tokens_padded, int64_t num_experts,
                                       int64_t block_size, int64_t pad_sorted_token_ids, cudaStream_t stream) {
  using namespace astra_malign;
  const int64_t numel = num_tokens * topk;
  if (num_tokens < 0 || topk <= 0 || num_experts <= 0 || num_experts > kMaxBuckets || block_size <= 0 ||
      max_num_tokens_padded < 0 || numel > (int64_t{1} << 30) || max_num_tokens_padded > (int64_t{1} << 30))
    return cudaErrorInvalidValue;
  const int n = static_cast<int>(numel), buckets = static_cast<int>(num_experts), bs = static_cast<int>(block_size);
  const int max_len = static_cast<int>(max_num_tokens_padded);
  const bool pad = pad_sorted_token_ids != 0;
  auto* ids = static_cast<const int32_t*>(topk_ids);
  auto* sorted = static_cast<int32_t*>(sorted_token_ids);
  auto* eids = static_cast<int32_t*>(expert_ids);
  auto* total = static_cast<int32_t*>(num_tokens_post_pad);
  const size_t smem = (2 * static_cast<size_t>(buckets) + 1 + 32) * sizeof(int);
  if (n <= kFusedMaxNumel && !wide_two_launch(n, buckets)) {
    // enough threads for the ids (kItems each), one bucket each and kPadPerThread padding slots each, up
    // to a full block. Padding grows with block_size * experts (~8k slots at Qwen3-30B-A3B batch 32);
    // sized by buckets alone (~160 threads) the kernel lost to SGLang's two at batch 8 and 32 (H200, 2026-11-24)
    int threads = (n + kItems - 1) / kItems;
    threads = threads > buckets ? threads : buckets;
    if (pad) {
      const int pad_threads = (max_len + kPadPerThread - 1) / kPadPerThread;
      threads = threads > pad_threads ? threads : pad_threads;
    }
    threads = threads < kMaxThreads ? threads : kMaxThreads;
    threads = (threads + 31) / 32 * 32;
    threads = threads < 64 ? 64 : threads;
    cudaError_t err = allow_smem(fused_align_kernel, smem);
    if (err != cudaSuccess) return err;
    return launch(fused_align_kernel, dim3(1), dim3(threads), smem, stream, ids, sorted, eids, total, n, buckets, bs,
                  max_len, pad, n >= ASTRA_FILL_MIN_NUMEL);
  }
  auto* cumsum = static_cast<int32_t*>(cumsum_buffer);
  cudaError_t err = allow_smem(align_kernel, smem);
  if (err != cudaSuccess) return err;
  err = launch(align_kernel, dim3(1), dim3(kMaxThreads), smem, stream, ids, sorted, eids, total, cumsum, n, buckets,
               bs, max_len, pad);
  if (err != cudaSuccess) return err;
  int blocks = (n + kSortThreads - 1) / kSortThreads;
  blocks = blocks < 65535 ? blocks : 65535;
  return launch(sort_kernel, dim3(blocks), dim3(kSortThreads), 0, stream, ids, sorted, cumsum, n, buckets);
}
