// astra-sglang optimized gelu_tanh_and_mul:  out[t, i] = gelu_tanh(x[t, i]) * x[t, d + i],  x: [tokens, 2d],
// gelu_tanh(g) = g * 0.5 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (torch's approximate="tanh").
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_gelu_tanh_and_mul(void* out, const void* input, int64_t num_tokens,
//                                                       int64_t hidden, int dtype, cudaStream_t stream)
// dtype: 0 fp32, 1 fp16, 2 bf16.  Launches on `stream` only; no allocation, no host sync; capturable.
//
// Design: kernels/silu_and_mul/kernel.cu's (see kernels/NOTES.md for the measurements behind it), with
// the activation swapped:
//  * Flat over the [tokens, d/W] vector grid, W = widest vector (<= 16 bytes) that divides d and the
//    pointers' alignment, so any hidden size works (odd sizes fall back to narrower vectors).
//  * One 16-byte vector of gate and of up per thread (both loads in flight at once), 256-thread blocks,
//    as many waves as the problem needs (the production JIT kernel's shape, which already streams at
//    the copy ceiling on large shapes; the gains are in the launch/latency path below).
//  * Programmatic dependent launch on sm_90+: every read and write of the op's buffers sits behind
//    griddepcontrol.wait; the dependents are released once this grid has passed its wait, and the
//    first wave warms L2 with its inputs (prefetch only, no data is read) while the previous kernel
//    drains. That overlaps one call's launch and DRAM latency with the previous call's tail.
//  * fp32 math; gelu_tanh as SGLang's JIT kernel writes it (tanhf), built with the workspace's flags
//    (SGLang's --use_fast_math): same numerics as production.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
// 0: plain launch; 1: PDL, trigger after the stores (production's placement); 2: PDL, L2 prefetch,
// trigger right after griddepcontrol.wait; 3 (dev only): trigger before the wait.
#define ASTRA_PDL 2
#endif
#ifndef ASTRA_PF_MAX
#define ASTRA_PF_MAX (1u << 31)  // dev: L2 prefetch before the PDL wait only when the op's inputs fit in this
#endif
#ifndef ASTRA_PF_ALL
#define ASTRA_PF_ALL 1  // the first wave of a multi-wave grid prefetches too (0, dev: single-wave grids only)
#endif
#ifndef ASTRA_P_BIG
#define ASTRA_P_BIG 1  // vectors per thread once the problem is over one wave (1: plain multi-wave stream)
#endif

namespace astra_gelu_tanh {
// Internal linkage for everything below: the statics of inline/template functions (occupancy and
// smem-attribute caches) would otherwise be GNU-unique symbols, shared by every build of this file
// loaded into one process (a baseline and a candidate derived from it, or two variants), each then
// trusting a cache filled for another library's kernels.
namespace {

#ifndef ASTRA_THREADS
#define ASTRA_THREADS 256
#endif
constexpr int kThreads = ASTRA_THREADS;

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
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Raw storage for N elements of T, loaded/stored as one access of sizeof(T)*N bytes.
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

#ifndef ASTRA_CS
#define ASTRA_CS 0  // dev: bit 0 streaming (evict-first) loads, bit 1 streaming stores
#endif
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> ldg(const T* p) {
  Vec<T, N> r;
#if ASTRA_CS & 1
  r.raw = __ldcs(reinterpret_cast<const typename Raw<sizeof(T) * N>::type*>(p));
#else
  r.raw = __ldg(reinterpret_cast<const typename Raw<sizeof(T) * N>::type*>(p));
#endif
  return r;
}
template <typename T, int N>
__device__ __forceinline__ void stg(T* p, const Vec<T, N>& r) {
#if ASTRA_CS & 2
  __stcs(reinterpret_cast<typename Raw<sizeof(T) * N>::type*>(p), r.raw);
#else
  *reinterpret_cast<typename Raw<sizeof(T) * N>::type*>(p) = r.raw;
#endif
}

__device__ __forceinline__ float gelu_tanh(float x) {
  // SGLang's ActivationKind::kGELUTanh expression, term for term (same numerics under the same
  // --use_fast_math build); tanhf saturates to +-1 for large |x| (no NaN).
  constexpr float kAlpha = 0.044715f;
  constexpr float kBeta = 0.7978845608028654f;
  const float cdf = 0.5f * (1.0f + tanhf(kBeta * (x + kAlpha * x * x * x)));
  return x * cdf;
}

// ---------------------------------------------------------------- kernel
// Vector j of thread t in block b: idx = (b * P + j) * kThreads + t  (coalesced per j).
// Row r = idx / nv, column c = idx % nv: gate at r*2d + c*W, up at r*2d + d + c*W, out at r*d + c*W.
template <typename T, int W, int P>
__global__ void __launch_bounds__(kThreads) gelu_tanh_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in,
                                                                 uint32_t nv, uint32_t total, uint32_t pf_blocks) {
  uint32_t row[P], col[P];
  bool ok[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const uint32_t idx = (blockIdx.x * P + j) * kThreads + threadIdx.x;
    ok[j] = idx < total;
    row[j] = idx / nv;
    col[j] = idx - row[j] * nv;
  }
  const size_t d = size_t(nv) * W;
#if ASTRA_PDL >= 2
  if (blockIdx.x < pf_blocks) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (ok[j]) {
        const T* g = in + size_t(row[j]) * 2 * d + size_t(col[j]) * W;
        prefetch_l2(g);
        prefetch_l2(g + d);
      }
    }
  }
#endif
#if ASTRA_PDL == 3
  pdl_trigger();
#endif
#if ASTRA_PDL >= 1
  pdl_wait();
#endif
#if ASTRA_PDL == 2
  pdl_trigger();
#endif
  Vec<T, W> g[P], u[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (ok[j]) {
      const T* gp = in + size_t(row[j]) * 2 * d + size_t(col[j]) * W;
      g[j] = ldg<T, W>(gp);
      u[j] = ldg<T, W>(gp + d);
    }
  }
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (ok[j]) {
      Vec<T, W> o;
#pragma unroll
      for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(gelu_tanh(to_f(g[j].v[i])) * to_f(u[j].v[i]));
      stg<T, W>(out + size_t(row[j]) * d + size_t(col[j]) * W, o);
    }
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

template <typename T, int W, int P>
inline int blocks_per_sm() {
  // Occupancy of one kernel instance, cached per instance (a function-local static of this template).
  static int cached = 0;
  if (cached == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gelu_tanh_and_mul_kernel<T, W, P>, kThreads, 0) != cudaSuccess ||
        n <= 0) {
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

template <typename T, int W, int P>
cudaError_t launch_p(T* out, const T* in, uint32_t nv, uint32_t total, bool pdl, bool prefetch, cudaStream_t stream) {
  const uint32_t per_block = uint32_t(kThreads) * P;
  const uint32_t blocks = (total + per_block - 1) / per_block;
  // Only the first wave (the blocks resident at once) prefetches: later blocks start after the wait is met.
  const uint32_t pf_blocks = prefetch ? uint32_t(dev_info().sms) * uint32_t(blocks_per_sm<T, W, P>()) : 0u;
  return launch(gelu_tanh_and_mul_kernel<T, W, P>, dim3(blocks), dim3(kThreads), stream, pdl, out, in, nv, total, pf_blocks);
}

template <typename T, int W>
cudaError_t run_w(T* out, const T* in, int64_t tokens, int64_t d, cudaStream_t stream) {
  const uint64_t total64 = uint64_t(tokens) * uint64_t(d / W);
  if (total64 >= (1ull << 31)) return cudaErrorInvalidValue;  // > 2^31 vectors: beyond any real shape
  const uint32_t total = uint32_t(total64);
  const uint32_t nv = uint32_t(d / W);
  const DevInfo info = dev_info();
  const bool pdl = (ASTRA_PDL != 0) && info.major >= 9;
  // One vector per thread while the problem fits one wave of resident threads; past that, ASTRA_P_BIG
  // per thread over as many waves as it takes (several waves keep reads and writes streaming together;
  // packing a medium problem into one wave of 4-vector threads measured slower: reads first, then
  // all the writes).
  const uint64_t resident1 = uint64_t(info.sms) * blocks_per_sm<T, W, 1>() * kThreads;
  const int p = total > resident1 ? ASTRA_P_BIG : 1;
  // The first wave prefetches at any size (multi-wave grids measured 1-5% faster with it: kernels/NOTES.md).
  const bool prefetch = (ASTRA_PF_ALL || total <= resident1) &&
                        uint64_t(tokens) * uint64_t(d) * 2 * sizeof(T) <= uint64_t(ASTRA_PF_MAX);
  if (p == 2) return launch_p<T, W, 2>(out, in, nv, total, pdl, prefetch, stream);
  return launch_p<T, W, 1>(out, in, nv, total, pdl, prefetch, stream);
}

template <typename T>
cudaError_t run(void* out, const void* input, int64_t tokens, int64_t d, cudaStream_t stream) {
  if (tokens < 0 || d < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || d == 0) return cudaSuccess;
  T* o = static_cast<T*>(out);
  const T* in = static_cast<const T*>(input);
  // Widest vector that divides d and both base pointers' alignment.
  const uintptr_t align = (reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(input));
  constexpr int kMaxW = 16 / sizeof(T);
  int w = kMaxW;
  while (w > 1 && ((d % w) != 0 || (align % (w * sizeof(T))) != 0)) w >>= 1;
  if (w == kMaxW) return run_w<T, kMaxW>(o, in, tokens, d, stream);
  if constexpr (kMaxW >= 8) {
    if (w == 4) return run_w<T, 4>(o, in, tokens, d, stream);
  }
  if (w == 2) return run_w<T, 2>(o, in, tokens, d, stream);
  return run_w<T, 1>(o, in, tokens, d, stream);
}

}  // namespace
}  // namespace astra_gelu_tanh

extern "C" cudaError_t astra_gelu_tanh_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden,
                                               int dtype, cudaStream_t stream) {
  cudaError_t e;
  switch (dtype) {
    case 0: e = astra_gelu_tanh::run<float>(out, input, num_tokens, hidden, stream); break;
    case 1: e = astra_gelu_tanh::run<__half>(out, input, num_tokens, hidden, stream); break;
    case 2: e = astra_gelu_tanh::run<__nv_bfloat16>(out, input, num_tokens, hidden, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return e;
}
