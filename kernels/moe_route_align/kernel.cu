// astra-sglang moe_route_align: SGLang's softmax top-k router and moe_align_block_size in ONE launch.
//   topk_ids[t, :], topk_weights[t, :]  as fused_topk's Triton router (softmax scoring): the topk experts by
//       descending fp32 logit, ties to the LOWEST expert id; weights exp(s - max) / row sum (renormalize: / the
//       routed sum, 1 when it is 0)
//   sorted_token_ids, expert_ids, num_tokens_post_pad  as moe_align_block_size(topk_ids, block_size, E) (the
//       +1 bucket convention; every bucket's pairs padded to block_size; unused slots hold numel; expert_ids of
//       the blocks past the total are not written)
// What it replaces in a decode step: the router kernel, then the align kernel(s), back to back on every MoE layer.
// Both are latency-bound at decode sizes (one warp and one block of work), so one launch saves a launch and the
// router -> align dependency; the ids never leave shared memory between the two.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_route_align(const void* scores, void* topk_weights, void* topk_ids,
//           void* sorted_token_ids, void* expert_ids, void* num_tokens_post_pad, int64_t num_tokens,
//           int64_t num_experts, int64_t topk, int64_t max_num_tokens_padded, int64_t block_size,
//           int renormalize, int dtype, cudaStream_t stream)
// scores [tokens, experts] contiguous (dtype 0 fp32, 1 fp16, 2 bf16), experts <= 1024, topk <= 32,
// tokens * topk <= 4096 (one block holds every id); sorted_token_ids [max_num_tokens_padded] int32,
// expert_ids [ceil(max_num_tokens_padded / block_size)] int32, num_tokens_post_pad [1] int32.
//
// Design:
//  * One block. Warps take tokens in turn; a token's row lives in one warp's registers (lane l: experts l,
//    l + 32, ...), softmax in fp32, topk rounds of a warp argmax on order-preserving integer keys (value, then
//    the lowest id), the winner set to -inf (0.5.17's rule). Each slot's id goes to global memory and to a
//    shared-memory copy.
//  * Then the alignment on the shared ids: shared histogram whose atomicAdd results are each id's rank in its
//    bucket, block-padded exclusive scan, scatter, padding and expert_ids: disjoint writes, no second pass.
//    Order within a bucket is atomic order, as production's (the op's contract compares it canonically).
//  * Programmatic dependent launch on sm_90+: every read behind griddepcontrol.wait (the logits come from the
//    router GEMM just before); dependents are released once the ids are aligned.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace astra_mra {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxThreads = 1024;
constexpr int kItems = 4;                      // ids per thread in the alignment
constexpr int kMaxNumel = kMaxThreads * kItems;
constexpr int kPadPerThread = 8;               // padding slots per thread before the block grows
constexpr int kIdBase = 0xFFFF;                // ids stay below 1024: kIdBase - id > 0

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// An unsigned key with the order of the float (-0 and +0 canonicalized by the caller; no NaN here).
__device__ __forceinline__ unsigned ordered_key(float f) {
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ unsigned warp_max(unsigned x) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  return __reduce_max_sync(kFull, x);
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(kFull, x, o));
  return x;
#endif
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// One token's routing by one warp: writes its topk weights and ids, and the ids into `sids`.
template <typename T, int V>
__device__ __forceinline__ void route_row(const T* __restrict__ src, float* __restrict__ weights,
                                          int32_t* __restrict__ ids, int* sids, int experts, int topk,
                                          int renormalize) {
  const int lane = threadIdx.x & 31;
  float s[V], v[V], p[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int e = j * 32 + lane;
    s[j] = e < experts ? to_f(src[e]) : -INFINITY;
  }
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    v[j] = (s[j] == s[j]) ? s[j] : -1e30f;  // NaN ranks as -1e30 (SGLang's kernel)
    if (v[j] == 0.f) v[j] = 0.f;              // -0 == +0: equal keys, the lower id wins
    m = fmaxf(m, s[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  float total = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    p[j] = (j * 32 + lane) < experts ? expf(s[j] - m) : 0.f;
    total += p[j];
  }
  float my_w = 0.f;
  int my_id = 0;
  for (int r = 0; r < topk; ++r) {
    float bv = v[0];  // this lane's best; ids rise with j, so a strict > keeps the lowest id among equals
    int bi = lane;
#pragma unroll
    for (int j = 1; j < V; ++j) {
      if (v[j] > bv) {
        bv = v[j];
        bi = j * 32 + lane;
      }
    }
    const unsigned key = ordered_key(bv);
    const unsigned top = warp_max(key);
    bi = kIdBase - static_cast<int>(warp_max(key == top ? static_cast<unsigned>(kIdBase - bi) : 0u));
    float w = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j * 32 + lane == bi) {
        w = p[j];
        v[j] = -INFINITY;
      }
    }
    w = __shfl_sync(kFull, w, bi & 31);
    if (lane == r) {
      my_w = w;
      my_id = bi;
    }
  }
  float routed = lane < topk ? my_w : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    routed += __shfl_xor_sync(kFull, routed, o);
    total += __shfl_xor_sync(kFull, total, o);
  }
  if (lane < topk) {
    const float den = renormalize ? (routed > 0.f ? routed : 1.f) : total;
    weights[lane] = my_w / den;
    ids[lane] = my_id;
    sids[lane] = my_id;
  }
}

// prefix[0..n] = exclusive scan of counts rounded up to bs (prefix[n] = total). Every thread calls it; ends
// with a barrier.
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
    const int v = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < nwarps ? warp_sums[lane] : 0;
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(kFull, wi, o);
      if (lane >= o) wi += v;
    }
    warp_sums[lane] = wi - w;
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
  if (tid == nthreads - 1) prefix[n] = run;
  __syncthreads();
}

template <typename T, int V>
__global__ void __launch_bounds__(kMaxThreads) route_align_kernel(
    const T* __restrict__ scores, float* __restrict__ weights, int32_t* __restrict__ ids,
    int32_t* __restrict__ sorted, int32_t* __restrict__ expert_ids, int32_t* __restrict__ total_out, int tokens,
    int experts, int topk, int renormalize, int bs, int max_len) {
  extern __shared__ int smem[];
  const int buckets = experts + 1;          // SGLang's +1 convention: expert e is bucket e + 1
  const int numel = tokens * topk;
  int* counts = smem;                       // [buckets]
  int* prefix = counts + buckets;           // [buckets + 1]
  int* warp_sums = prefix + buckets + 1;    // [32]
  int* sids = warp_sums + 32;               // [numel]
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid >> 5, nwarps = nthreads >> 5;
  for (int i = tid; i < buckets; i += nthreads) counts[i] = 0;
  pdl_wait();
  for (int t = warp; t < tokens; t += nwarps)
    route_row<T, V>(scores + static_cast<int64_t>(t) * experts, weights + t * topk, ids + t * topk, sids + t * topk,
                    experts, topk, renormalize);
  __syncthreads();
  int bkt[kItems], rank[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = tid + k * nthreads;
    bkt[k] = i < numel ? sids[i] + 1 : -1;  // router ids are in [0, experts)
    rank[k] = bkt[k] >= 0 ? atomicAdd(&counts[bkt[k]], 1) : 0;
  }
  __syncthreads();
  padded_scan(counts, prefix, buckets, bs, warp_sums);
  pdl_trigger();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if (bkt[k] >= 0) sorted[prefix[bkt[k]] + rank[k]] = tid + k * nthreads;
  }
  // expert_ids of the used blocks and the padding inside each bucket's segment: one thread per bucket when the
  // blocks fit the block (decode), else spread over the block with a search per block
  const int total = prefix[buckets];
  const int nblk = total / bs;
  if (nblk <= nthreads && bs <= 32) {
    for (int e = tid; e < buckets; e += nthreads) {
      const int lo = prefix[e], hi = prefix[e + 1];
      for (int q = lo / bs; q < hi / bs; ++q) expert_ids[q] = e - 1;
      for (int p = lo + counts[e]; p < hi; ++p) sorted[p] = numel;
    }
  } else {
    const int lane = tid & 31;
    for (int j = tid; j < nblk; j += nthreads) {
      const int start = j * bs;
      int lo = 0, hi = buckets;  // first bucket whose prefix exceeds start
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (prefix[mid] <= start) lo = mid + 1;
        else hi = mid;
      }
      expert_ids[j] = lo - 2;
    }
    for (int e = warp; e < buckets; e += nwarps)
      for (int p = prefix[e] + counts[e] + lane; p < prefix[e + 1]; p += 32) sorted[p] = numel;
  }
  for (int p = total + tid; p < max_len; p += nthreads) sorted[p] = numel;
  if (tid == 0) *total_out = total;
}

struct DeviceInfo {
  int major = 0;
};

DeviceInfo device_info() {
  static int cached_dev = -1;
  static DeviceInfo info;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DeviceInfo{};
  if (dev != cached_dev) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    info.major = major;
    cached_dev = dev;
  }
  return info;
}

template <typename T, int V>
cudaError_t launch(const void* scores, void* weights, void* ids, void* sorted, void* eids, void* total, int tokens,
                   int experts, int topk, int renormalize, int bs, int max_len, cudaStream_t stream) {
  const int numel = tokens * topk, buckets = experts + 1;
  // enough threads for the ids (kItems each), one bucket each, kPadPerThread padding slots each, and a warp per
  // token up to 32 warps
  int threads = (numel + kItems - 1) / kItems;
  threads = threads > buckets ? threads : buckets;
  const int pad_threads = (max_len + kPadPerThread - 1) / kPadPerThread;
  threads = threads > pad_threads ? threads : pad_threads;
  const int route_threads = 32 * (tokens < 32 ? tokens : 32);
  threads = threads > route_threads ? threads : route_threads;
  threads = threads < kMaxThreads ? threads : kMaxThreads;
  threads = (threads + 31) / 32 * 32;
  threads = threads < 64 ? 64 : threads;
  const size_t smem = (2 * static_cast<size_t>(buckets) + 1 + 32 + numel) * sizeof(int);
  auto kernel = route_align_kernel<T, V>;
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = device_info().major >= 9 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(scores), static_cast<float*>(weights),
                            static_cast<int32_t*>(ids), static_cast<int32_t*>(sorted), static_cast<int32_t*>(eids),
                            static_cast<int32_t*>(total), tokens, experts, topk, renormalize, bs, max_len);
}

template <typename T>
cudaError_t dispatch(const void* scores, void* weights, void* ids, void* sorted, void* eids, void* total, int tokens,
                     int experts, int topk, int renormalize, int bs, int max_len, cudaStream_t stream) {
#define ASTRA_MRA_LAUNCH(V) \
  launch<T, V>(scores, weights, ids, sorted, eids, total, tokens, experts, topk, renormalize, bs, max_len, stream)
  if (experts <= 32) return ASTRA_MRA_LAUNCH(1);
  if (experts <= 64) return ASTRA_MRA_LAUNCH(2);
  if (experts <= 128) return ASTRA_MRA_LAUNCH(4);
  if (experts <= 256) return ASTRA_MRA_LAUNCH(8);
  if (experts <= 512) return ASTRA_MRA_LAUNCH(16);
  return ASTRA_MRA_LAUNCH(32);
#undef ASTRA_MRA_LAUNCH
}

}  // namespace
}  // namespace astra_mra

extern "C" cudaError_t astra_moe_route_align(const void* scores, void* topk_weights, void* topk_ids,
                                             void* sorted_token_ids, void* expert_ids, void* num_tokens_post_pad,
                                             int64_t num_tokens, int64_t num_experts, int64_t topk,
                                             int64_t max_num_tokens_padded, int64_t block_size, int renormalize,
                                             int dtype, cudaStream_t stream) {
  using namespace astra_mra;
  if (num_tokens < 0 || num_experts < 1 || num_experts > 1024 || topk < 1 || topk > 32 || topk > num_experts ||
      block_size < 1 || max_num_tokens_padded < 0 || num_tokens * topk > kMaxNumel)
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  // every aligned slot must fit: the total is at most numel + buckets * (block_size - 1)
  const int64_t numel = num_tokens * topk, buckets = num_experts + 1;
  const int64_t worst = numel < buckets ? numel * block_size : numel + buckets * (block_size - 1);
  if (max_num_tokens_padded < worst || max_num_tokens_padded > (int64_t{1} << 30)) return cudaErrorInvalidValue;
  const int t = static_cast<int>(num_tokens), e = static_cast<int>(num_experts), k = static_cast<int>(topk);
  const int bs = static_cast<int>(block_size), max_len = static_cast<int>(max_num_tokens_padded);
  const int rn = renormalize ? 1 : 0;
  switch (dtype) {
    case 0: return dispatch<float>(scores, topk_weights, topk_ids, sorted_token_ids, expert_ids, num_tokens_post_pad,
                                   t, e, k, rn, bs, max_len, stream);
    case 1: return dispatch<__half>(scores, topk_weights, topk_ids, sorted_token_ids, expert_ids, num_tokens_post_pad,
                                    t, e, k, rn, bs, max_len, stream);
    case 2: return dispatch<__nv_bfloat16>(scores, topk_weights, topk_ids, sorted_token_ids, expert_ids,
                                           num_tokens_post_pad, t, e, k, rn, bs, max_len, stream);
    default: return cudaErrorInvalidValue;
  }
}
