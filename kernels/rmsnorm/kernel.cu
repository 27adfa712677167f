// astra-sglang optimized rmsnorm (FlashInfer/sgl-kernel semantics, out of place):
//   out = T(x * rsqrt(mean(x^2) + eps) * (kWeightBias + weight)),  x = float(input),  kWeightBias = 0
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_rmsnorm(void* out, const void* input, const void* weight,
//           int64_t num_tokens, int64_t hidden, double eps, int dtype, cudaStream_t stream)
// dtype: 1 fp16, 2 bf16 (0 fp32 also works).  Launches on `stream` only; no allocation, no host sync;
// capturable.  out may alias input (every element is read by the thread that writes it, before it writes).
//
// The design of kernels/fused_add_rmsnorm/kernel.cu (measurements in kernels/NOTES.md), minus the
// residual:
//  * Register-cached rows: each thread loads its K vectors of input and weight in one batch (every load
//    in flight before the first use), keeps them in registers and writes the output straight from them:
//    the input is read once, no second pass over global memory, and the weight load is not serialised
//    behind the reduction (FlashInfer's RMSNorm reads the row twice and the weight after the barrier).
//  * Threads per row R (a multiple of 32) and rows per CTA from the hidden size and the token count:
//    warp-per-row (no __syncthreads) for narrow rows, several rows per CTA when there are many tokens,
//    one barrier for the cross-warp sum otherwise. Rows of more than 1024 vectors: 4 vectors per
//    thread, weight loaded after the reduction (fewer live registers, more rows resident per SM).
//  * Rows wider than one CTA's registers hold (> 2048 vectors): a thread-block cluster splits the row
//    over C CTAs, partial sums meet through distributed shared memory (sm_90); without clusters
//    (pre-sm_90): a two-pass CTA-per-row kernel.
//  * Vector width W = widest (<= 16 bytes) dividing hidden and the pointers' alignment: any hidden size.
//  * Programmatic dependent launch on sm_90+: every read and write behind griddepcontrol.wait; the
//    dependents are released right after it, and problems <= 8 MB warm L2 with their rows (the weight
//    from the first CTA only) first.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
// 0: plain launch; 1: PDL, trigger after the stores (production's placement); 2: PDL, L2 prefetch,
// trigger right after griddepcontrol.wait.
#define ASTRA_PDL 2
#endif
#ifndef ASTRA_K4_MIN
#define ASTRA_K4_MIN 1024  // rows of more vectors than this use K = 4 (weight loaded late)
#endif
#ifndef ASTRA_PF_MAX
#define ASTRA_PF_MAX (8u << 20)  // L2 prefetch before the PDL wait when the input fits in this
#endif
#ifndef ASTRA_RMS_KT
#define ASTRA_RMS_KT 2  // target vectors per thread when picking threads per row
#endif
#ifndef ASTRA_KT1_MAX
#define ASTRA_KT1_MAX 256  // rows of at most this many vectors: 1 vector per thread
#endif

namespace astra_rms {
// Internal linkage for everything below (the statics of inline/template functions would otherwise be
// GNU-unique symbols shared by every build of this file loaded into one process).
namespace {

constexpr float kWeightBias = 0.f;  // rmsnorm: weight as is (gemma_rmsnorm: 1 + weight)

// ---------------------------------------------------------------- device helpers
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
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// Read a float at the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ float ld_dsmem(const float* smem_ptr, uint32_t rank) {
  uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <int BYTES> struct Raw;
template <> struct Raw<16> { using type = uint4; };
template <> struct Raw<8> { using type = uint2; };
template <> struct Raw<4> { using type = unsigned int; };
template <> struct Raw<2> { using type = unsigned short; };

template <typename T, int N>
union Vec {
  typename Raw<sizeof(T) * N>::type raw;
  T v[N];
};

// The input may alias the output: plain coherent loads for it, the read-only path for the weight.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> ld(const T* p) {
  Vec<T, N> r;
  r.raw = *reinterpret_cast<const typename Raw<sizeof(T) * N>::type*>(p);
  return r;
}
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> ldg(const T* p) {
  Vec<T, N> r;
  r.raw = __ldg(reinterpret_cast<const typename Raw<sizeof(T) * N>::type*>(p));
  return r;
}
template <typename T, int N>
__device__ __forceinline__ void st(T* p, const Vec<T, N>& r) {
  *reinterpret_cast<typename Raw<sizeof(T) * N>::type*>(p) = r.raw;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---------------------------------------------------------------- kernel
// blockDim = (R, ROWS): R threads (a multiple of 32) per row, ROWS rows per CTA.
// CL: a cluster of CTAs (ROWS == 1) shares one row; CTA rank r owns vectors
// [r*slice, min((r+1)*slice, nv)).  Thread x owns vectors base + x + k*R, k < K.
template <typename T, int W, int K, bool CL>
__global__ void __launch_bounds__(K >= 4 ? 512 : 1024, 1) rmsnorm_kernel(T* out, const T* input,
                                                                       const T* __restrict__ weight, uint32_t tokens,
                                                                       uint32_t nv, uint32_t slice, float fd,
                                                                       float eps, int prefetch) {
  __shared__ float red[32];
  __shared__ float red_cl;
  const uint32_t R = blockDim.x;
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t wpr = R >> 5;  // warps per row
  uint32_t row, base;
  if constexpr (CL) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    const uint32_t rank = cluster_ctarank();
#else
    const uint32_t rank = 0;
#endif
    const uint32_t cl = gridDim.x / tokens;  // cluster size (grid = tokens * cl)
    row = blockIdx.x / cl;
    base = rank * slice;
  } else {
    row = blockIdx.x * blockDim.y + threadIdx.y;
    base = 0;
  }
  const bool row_ok = row < tokens;
  const uint32_t lim = min(nv, base + slice);  // this CTA's vectors end here
  const size_t roff = size_t(row) * nv * W;

  bool ok[K];
  uint32_t vi[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    vi[k] = base + threadIdx.x + uint32_t(k) * R;
    ok[k] = row_ok && vi[k] < lim;
  }
#if ASTRA_PDL >= 2
  if (prefetch) {
    // The weight is shared by every row: only the first row's CTA(s) prefetch it (every CTA
    // prefetching it made an L2 hot spot in fused_add_rmsnorm).
    const bool pf_w = threadIdx.y == 0 && blockIdx.x < (CL ? gridDim.x / tokens : 1u);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (ok[k]) {
        prefetch_l2(input + roff + size_t(vi[k]) * W);
        if (pf_w) prefetch_l2(weight + size_t(vi[k]) * W);
      }
    }
  }
#endif
#if ASTRA_PDL >= 1
  pdl_wait();
#endif
#if ASTRA_PDL == 2
  pdl_trigger();
#endif
  constexpr bool kWLate = K >= 4;  // wide rows load the weight after the reduction
  Vec<T, W> a[K], w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      a[k] = ld<T, W>(input + roff + size_t(vi[k]) * W);
      if constexpr (!kWLate) w[k] = ldg<T, W>(weight + size_t(vi[k]) * W);
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float v = to_f(a[k].v[i]);
        ss += v * v;
      }
    }
  }
  ss = warp_sum(ss);
  if (CL || wpr > 1) {
    if (lane == 0) red[threadIdx.y * wpr + (threadIdx.x >> 5)] = ss;
    __syncthreads();
    ss = 0.f;
    for (uint32_t i = 0; i < wpr; ++i) ss += red[threadIdx.y * wpr + i];
  }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (CL) {
    const uint32_t cl = gridDim.x / tokens;
    if (threadIdx.x == 0) red_cl = ss;
    cluster_arrive();
    cluster_wait();
    ss = 0.f;
    for (uint32_t r = 0; r < cl; ++r) ss += ld_dsmem(&red_cl, r);
    cluster_arrive();  // our reads of the peers' red_cl are done; waited for before exit
  }
#endif
  if constexpr (kWLate) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (ok[k]) w[k] = ldg<T, W>(weight + size_t(vi[k]) * W);
  }
  const float rcp = rsqrtf(ss / fd + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      Vec<T, W> o;
#pragma unroll
      for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(to_f(a[k].v[i]) * rcp * (kWeightBias + to_f(w[k].v[i])));
      st<T, W>(out + roff + size_t(vi[k]) * W, o);
    }
  }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (CL) cluster_wait();  // keep red_cl alive until every peer has read it
#endif
#if ASTRA_PDL == 1
  pdl_trigger();
#endif
}

// Fallback for rows no CTA's registers hold when clusters are unavailable (pre-sm_90, or rows of more
// than 8 * 2048 vectors): one 1024-thread CTA per row, two passes over the row (the second from L2).
// Each thread reads and writes the same vectors in both passes, so out may alias input.
template <typename T, int W>
__global__ void __launch_bounds__(1024) rmsnorm_2pass_kernel(T* out, const T* input, const T* __restrict__ weight,
                                                             uint32_t nv, float fd, float eps) {
  __shared__ float red[32];
  const size_t roff = size_t(blockIdx.x) * nv * W;
#if ASTRA_PDL >= 1
  pdl_wait();
#endif
#if ASTRA_PDL >= 2
  pdl_trigger();
#endif
  float ss = 0.f;
  for (uint32_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, W> a = ld<T, W>(input + roff + size_t(v) * W);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float x = to_f(a.v[i]);
      ss += x * x;
    }
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  ss = 0.f;
  for (uint32_t i = 0; i < (blockDim.x >> 5); ++i) ss += red[i];
  const float rcp = rsqrtf(ss / fd + eps);
  for (uint32_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, W> a = ld<T, W>(input + roff + size_t(v) * W);
    const Vec<T, W> w = ldg<T, W>(weight + size_t(v) * W);
    Vec<T, W> o;
#pragma unroll
    for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(to_f(a.v[i]) * rcp * (kWeightBias + to_f(w.v[i])));
    st<T, W>(out + roff + size_t(v) * W, o);
  }
#if ASTRA_PDL == 1
  pdl_trigger();
#endif
}

// ---------------------------------------------------------------- host side
struct DevInfo {
  int sms = 0;
  int major = 0;
};

inline DevInfo dev_info() {
  static DevInfo cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return DevInfo{132, 9};
  }
  DevInfo& c = cache[dev];
  if (c.sms == 0) {
    int sms = 0, major = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    c.major = major;
    c.sms = sms > 0 ? sms : 132;
  }
  return c;
}

template <typename... Args>
inline cudaError_t launch(void (*kernel)(Args...), dim3 grid, dim3 block, uint32_t cluster, cudaStream_t stream,
                          bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

inline uint32_t round_up32(uint32_t v) { return (v + 31u) & ~31u; }

template <typename T, int W, bool CL>
cudaError_t launch_k(int k, dim3 grid, dim3 block, uint32_t cl, cudaStream_t stream, bool pdl, T* out, const T* in,
                     const T* w, uint32_t tokens, uint32_t nv, uint32_t slice, float fd, float eps, int prefetch) {
  switch (k) {
    case 1: return launch(rmsnorm_kernel<T, W, 1, CL>, grid, block, cl, stream, pdl, out, in, w, tokens, nv, slice, fd, eps, prefetch);
    case 2: return launch(rmsnorm_kernel<T, W, 2, CL>, grid, block, cl, stream, pdl, out, in, w, tokens, nv, slice, fd, eps, prefetch);
    case 4: return launch(rmsnorm_kernel<T, W, 4, CL>, grid, block, cl, stream, pdl, out, in, w, tokens, nv, slice, fd, eps, prefetch);
    default: return cudaErrorInvalidValue;
  }
}

// Threads per row and vectors per thread for `n` vectors: R = 32*ceil(n / (32*KT)) capped at 1024,
// KT = 1 for rows of <= ASTRA_KT1_MAX vectors, else ASTRA_RMS_KT; K = ceil(n / R) rounded up to 1, 2
// or 4 (R <= 512 for K = 4: register budget).  false when n is over 2048 vectors.
constexpr uint32_t kMaxVecPerCta = 2048u;
inline bool pick_rk(uint32_t n, uint32_t& R, int& K) {
  if (n > kMaxVecPerCta) return false;
  if (n > ASTRA_K4_MIN) {
    R = round_up32((n + 3) / 4);
    K = 4;
    return true;
  }
  const uint32_t kt = n <= uint32_t(ASTRA_KT1_MAX) ? 1u : uint32_t(ASTRA_RMS_KT);
  uint32_t r = round_up32((n + kt - 1) / kt);
  if (r < 32) r = 32;
  if (r > 1024) r = 1024;
  uint32_t k = (n + r - 1) / r;
  int kk = k <= 1 ? 1 : k <= 2 ? 2 : 4;
  r = round_up32((n + kk - 1) / kk);  // fewer threads when the rounded-up K covers the row anyway
  R = r;
  K = kk;
  return true;
}

template <typename T, int W>
cudaError_t run_w(T* out, const T* in, const T* w, int64_t tokens64, int64_t d, float eps, cudaStream_t stream) {
  if (tokens64 >= (1ll << 31)) return cudaErrorInvalidValue;
  const uint32_t tokens = uint32_t(tokens64);
  const uint32_t nv = uint32_t(d / W);
  const DevInfo info = dev_info();
  const bool pdl = (ASTRA_PDL != 0) && info.major >= 9;
  const int prefetch = (uint64_t(tokens) * uint64_t(d) * sizeof(T) <= uint64_t(ASTRA_PF_MAX)) ? 1 : 0;
  const float fd = float(d);  // mean of squares = sum / d, divided as FlashInfer does: sum * (1/d) rounds
  // differently where 1/d is inexact (d not a power of two) and flips bf16 outputs (Gemma-2 greedy tokens diverged)

  if (nv > kMaxVecPerCta) {  // rows too wide for one CTA's registers
    uint32_t cl = 1;
    if (info.major >= 9) {
      while (cl < 8 && (nv + cl - 1) / cl > kMaxVecPerCta) cl *= 2;
    }
    const uint32_t slice = (nv + cl - 1) / cl;
    if (cl > 1 && slice <= kMaxVecPerCta && uint64_t(tokens) * cl < (1ull << 31)) {
      uint32_t R;
      int K;
      if (!pick_rk(slice, R, K)) return cudaErrorInvalidValue;
      return launch_k<T, W, true>(K, dim3(tokens * cl), dim3(R, 1), cl, stream, pdl, out, in, w, tokens, nv, slice,
                                  fd, eps, prefetch);
    }
    return launch(rmsnorm_2pass_kernel<T, W>, dim3(tokens), dim3(1024), 1, stream, pdl, out, in, w, nv, fd, eps);
  }
  uint32_t R;
  int K;
  if (!pick_rk(nv, R, K)) return cudaErrorInvalidValue;
  // Rows per CTA: up to 256 threads per CTA, but keep at least one CTA per SM while tokens allow.
  uint32_t rows = 1;
  while (R * rows * 2 <= 256 && uint64_t(tokens) >= uint64_t(info.sms) * rows * 2) rows *= 2;
  const uint32_t blocks = (tokens + rows - 1) / rows;
  return launch_k<T, W, false>(K, dim3(blocks), dim3(R, rows), 1, stream, pdl, out, in, w, tokens, nv, nv, fd, eps,
                               prefetch);
}

template <typename T>
cudaError_t run(void* out, const void* input, const void* weight, int64_t tokens, int64_t d, double eps,
                cudaStream_t stream) {
  if (tokens < 0 || d < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || d == 0) return cudaSuccess;
  T* o = static_cast<T*>(out);
  const T* in = static_cast<const T*>(input);
  const T* w = static_cast<const T*>(weight);
  const uintptr_t align = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(input) |
                          reinterpret_cast<uintptr_t>(weight);
  constexpr int kMaxW = 16 / sizeof(T);
  int vw = kMaxW;
  while (vw > 1 && ((d % vw) != 0 || (align % (vw * sizeof(T))) != 0)) vw >>= 1;
  const float e = static_cast<float>(eps);
  if (vw == kMaxW) return run_w<T, kMaxW>(o, in, w, tokens, d, e, stream);
  if constexpr (kMaxW >= 8) {
    if (vw == 4) return run_w<T, 4>(o, in, w, tokens, d, e, stream);
  }
  if (vw == 2) return run_w<T, 2>(o, in, w, tokens, d, e, stream);
  return run_w<T, 1>(o, in, w, tokens, d, e, stream);
}

}  // namespace
}  // namespace astra_rms

extern "C" cudaError_t astra_rmsnorm(void* out, const void* input, const void* weight, int64_t num_tokens,
                                     int64_t hidden, double eps, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 0: return astra_rms::run<float>(out, input, weight, num_tokens, hidden, eps, stream);
    case 1: return astra_rms::run<__half>(out, input, weight, num_tokens, hidden, eps, stream);
    case 2: return astra_rms::run<__nv_bfloat16>(out, input, weight, num_tokens, hidden, eps, stream);
    default: return cudaErrorInvalidValue;
  }
}
