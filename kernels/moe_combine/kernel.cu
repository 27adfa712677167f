// astra-sglang moe_combine:  out[t, :] = scale * sum_k in[t, k, :],  in: [tokens, topk, hidden] (fused_moe's
// router-weighted intermediate_cache3), out: [tokens, hidden].
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_combine(const void* input, void* output, int64_t num_tokens,
//           int64_t topk, int64_t hidden, double routed_scaling_factor, int dtype, cudaStream_t stream)
// dtype: 0 fp32, 1 fp16, 2 bf16.  Launches on `stream` only; no allocation, no host sync; capturable.
//
// Design (not yet timed on a GPU: kernels/moe_combine/RESULTS.md):
//  * Flat over the [tokens, hidden / W] vector grid, W = widest vector (<= 16 bytes) dividing hidden and the
//    pointers' alignment (any hidden size). Each thread issues its topk 16-byte loads before the first add
//    (topk 1..9 unrolled at compile time, others a 4-way unrolled loop), so a thread has all of its row
//    slice in flight at once.
//  * fp32 accumulation in expert order k = 0..topk-1, one multiply by float(scale), one rounding: the same
//    arithmetic as sgl_kernel's moe_sum_reduce kernels, hence the same bits.
//  * Decode shapes (few vectors): blocks shrink to 64 threads until the grid covers the SMs. A single CTA per
//    token row would leave one SM fetching a whole row (DeepSeek-V3 top-9: 129 KB) at DRAM latency; spreading
//    the row over SMs is what the production Inductor kernel (hidden / XBLOCK programs) does as well.
//  * Programmatic dependent launch on sm_90+ (house style, kernels/silu_and_mul): every read and write of
//    the op's buffers sits behind griddepcontrol.wait; the dependents are released right after it, and the
//    first wave warms L2 with its input lines (prefetch only, nothing read) while the producer drains.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
// 0: plain launch; 1: PDL, trigger after the stores; 2: PDL, L2 prefetch, trigger right after the wait.
#define ASTRA_PDL 2
#endif
#ifndef ASTRA_PF_MAX
#define ASTRA_PF_MAX (64u << 20)  // L2 prefetch before the PDL wait only when the input fits in this
#endif
#ifndef ASTRA_MIN_THREADS
#define ASTRA_MIN_THREADS 64  // smallest block when the grid is shrunk to cover the SMs
#endif

namespace astra_moec {
// Internal linkage: the function-local caches below must not be shared with another build of this file
// loaded into the same process (baseline and candidate).
namespace {

constexpr int kMaxThreads = 256;

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

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> ldg(const T* p) {
  Vec<T, N> r;
  r.raw = __ldg(reinterpret_cast<const typename Raw<sizeof(T) * N>::type*>(p));
  return r;
}
template <typename T, int N>
__device__ __forceinline__ void stg(T* p, const Vec<T, N>& r) {
  *reinterpret_cast<typename Raw<sizeof(T) * N>::type*>(p) = r.raw;
}

// Thread idx -> row r = idx / nv, column c = idx % nv; expert k's vector at (r * topk + k) * h + c * W.
// K > 0: topk == K at compile time; K == 0: runtime topk.
template <typename T, int W, int K>
__global__ void __launch_bounds__(kMaxThreads) moe_combine_kernel(T* __restrict__ out, const T* __restrict__ in,
                                                                  uint32_t nv, uint32_t total, uint32_t topk,
                                                                  float scale, uint32_t pf_blocks) {
  const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
  const bool ok = idx < total;
  const uint32_t row = ok ? idx / nv : 0u;
  const uint32_t col = idx - row * nv;
  const size_t h = size_t(nv) * W;
  const uint32_t kk = K > 0 ? uint32_t(K) : topk;
  const T* src = in + size_t(row) * kk * h + size_t(col) * W;
#if ASTRA_PDL >= 2
  if (ok && blockIdx.x < pf_blocks) {
    for (uint32_t k = 0; k < kk; ++k) prefetch_l2(src + size_t(k) * h);
  }
#endif
#if ASTRA_PDL >= 1
  pdl_wait();
#endif
#if ASTRA_PDL == 2
  pdl_trigger();
#endif
  if (ok) {
    float acc[W];
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] = 0.f;
    if constexpr (K > 0) {
      Vec<T, W> x[K];
#pragma unroll
      for (int k = 0; k < K; ++k) x[k] = ldg<T, W>(src + size_t(k) * h);
#pragma unroll
      for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int i = 0; i < W; ++i) acc[i] += to_f(x[k].v[i]);
      }
    } else {
      uint32_t k = 0;
      for (; k + 4 <= kk; k += 4) {
        Vec<T, W> x[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) x[j] = ldg<T, W>(src + size_t(k + j) * h);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int i = 0; i < W; ++i) acc[i] += to_f(x[j].v[i]);
        }
      }
      for (; k < kk; ++k) {
        const Vec<T, W> x = ldg<T, W>(src + size_t(k) * h);
#pragma unroll
        for (int i = 0; i < W; ++i) acc[i] += to_f(x.v[i]);
      }
    }
    Vec<T, W> o;
#pragma unroll
    for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(acc[i] * scale);
    stg<T, W>(out + size_t(row) * h + size_t(col) * W, o);
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

template <typename T, int W, int K>
inline int blocks_per_sm() {
  static int cached = 0;  // per kernel instance
  if (cached == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, moe_combine_kernel<T, W, K>, kMaxThreads, 0) !=
            cudaSuccess || n <= 0) {
      cudaGetLastError();
      n = 1;
    }
    cached = n;
  }
  return cached;
}

template <typename... Args>
inline cudaError_t launch(void (*kernel)(Args...), dim3 grid, dim3 block, cudaStream_t stream, bool pdl,
                          Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename T, int W, int K>
cudaError_t launch_k(T* out, const T* in, uint32_t nv, uint32_t total, uint32_t topk, float scale, bool prefetch,
                     cudaStream_t stream) {
  const DevInfo info = dev_info();
  const bool pdl = (ASTRA_PDL != 0) && info.major >= 9;
  // Halve the block until the grid covers the SMs (decode), never below ASTRA_MIN_THREADS.
  uint32_t threads = kMaxThreads;
  while (threads > ASTRA_MIN_THREADS && (total + threads - 1) / threads < uint32_t(info.sms)) threads >>= 1;
  const uint32_t blocks = (total + threads - 1) / threads;
  // Only the first wave (the blocks resident at once) prefetches: later blocks start after the wait is met.
  const uint32_t resident = uint32_t(info.sms) * uint32_t(blocks_per_sm<T, W, K>()) * (kMaxThreads / threads);
  const uint32_t pf_blocks = prefetch ? resident : 0u;
  return launch(moe_combine_kernel<T, W, K>, dim3(blocks), dim3(threads), stream, pdl, out, in, nv, total, topk,
                scale, pf_blocks);
}

template <typename T, int W>
cudaError_t run_w(T* out, const T* in, int64_t tokens, int64_t topk, int64_t h, float scale, cudaStream_t stream) {
  const uint64_t total64 = uint64_t(tokens) * uint64_t(h / W);
  if (total64 >= (1ull << 31) || uint64_t(topk) > 0xffffffffull) return cudaErrorInvalidValue;
  const uint32_t total = uint32_t(total64), nv = uint32_t(h / W), k = uint32_t(topk);
  const bool prefetch = uint64_t(tokens) * uint64_t(topk) * uint64_t(h) * sizeof(T) <= uint64_t(ASTRA_PF_MAX);
  switch (k) {
    case 1: return launch_k<T, W, 1>(out, in, nv, total, k, scale, prefetch, stream);
    case 2: return launch_k<T, W, 2>(out, in, nv, total, k, scale, prefetch, stream);
    case 4: return launch_k<T, W, 4>(out, in, nv, total, k, scale, prefetch, stream);
    case 6: return launch_k<T, W, 6>(out, in, nv, total, k, scale, prefetch, stream);
    case 8: return launch_k<T, W, 8>(out, in, nv, total, k, scale, prefetch, stream);
    case 9: return launch_k<T, W, 9>(out, in, nv, total, k, scale, prefetch, stream);
    default: return launch_k<T, W, 0>(out, in, nv, total, k, scale, prefetch, stream);
  }
}

template <typename T>
cudaError_t run(void* output, const void* input, int64_t tokens, int64_t topk, int64_t h, double scale,
                cudaStream_t stream) {
  if (tokens < 0 || topk <= 0 || h < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || h == 0) return cudaSuccess;
  T* o = static_cast<T*>(output);
  const T* in = static_cast<const T*>(input);
  const float s = static_cast<float>(scale);  // sgl_kernel casts the double to its float opmath type too
  const uintptr_t align = reinterpret_cast<uintptr_t>(output) | reinterpret_cast<uintptr_t>(input);
  constexpr int kMaxW = 16 / sizeof(T);
  int w = kMaxW;
  while (w > 1 && ((h % w) != 0 || (align % (w * sizeof(T))) != 0)) w >>= 1;
  if (w == kMaxW) return run_w<T, kMaxW>(o, in, tokens, topk, h, s, stream);
  if constexpr (kMaxW >= 8) {
    if (w == 4) return run_w<T, 4>(o, in, tokens, topk, h, s, stream);
  }
  if (w == 2) return run_w<T, 2>(o, in, tokens, topk, h, s, stream);
  return run_w<T, 1>(o, in, tokens, topk, h, s, stream);
}

}  // namespace
}  // namespace astra_moec

extern "C" cudaError_t astra_moe_combine(const void* input, void* output, int64_t num_tokens, int64_t topk,
                                         int64_t hidden, double routed_scaling_factor, int dtype,
                                         cudaStream_t stream) {
  switch (dtype) {
    case 0:
      return astra_moec::run<float>(output, input, num_tokens, topk, hidden, routed_scaling_factor, stream);
    case 1:
      return astra_moec::run<__half>(output, input, num_tokens, topk, hidden, routed_scaling_factor, stream);
    case 2:
      return astra_moec::run<__nv_bfloat16>(output, input, num_tokens, topk, hidden, routed_scaling_factor,
                                                   stream);
    default:
      return cudaErrorInvalidValue;
  }
}
