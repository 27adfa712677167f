// astra-sglang optimized merge_state (SGLang merge_state_v2 semantics):
//   v_a, v_b, v_out: [tokens, heads, head_dim] (dtype);  s_a, s_b, s_out: [tokens, heads] fp32, natural-log LSE.
//   s_a/s_b of +inf or -inf count as -inf (an empty state);  m = max(s_a, s_b);
//   p = exp(s_a - m), q = exp(s_b - m);  v_out = v_a * p/(p+q) + v_b * q/(p+q);  s_out = log(p+q) + m.
//   Two empty states give NaN, exactly as sgl-kernel's merge_attn_states kernel and the Triton fallback.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_merge_state(const void* v_a, const void* s_a, const void* v_b,
//           const void* s_b, void* v_out, void* s_out, int64_t num_tokens, int64_t num_heads,
//           int64_t head_dim, int dtype, cudaStream_t stream)
// dtype: 0 fp32, 1 fp16, 2 bf16.  s_out may be null (not written).  Launches on `stream` only; no
// allocation, no host sync; CUDA-graph capturable.
//
// Design (measurements in kernels/NOTES.md):
//  * Flat over [tokens*heads, head_dim/W] vectors, W = widest vector (<= 16 bytes) dividing head_dim
//    and the pointers' alignment (any head_dim works); the LSE index of a vector is simply idx / (D/W).
//  * One 16-byte vector per thread, 256-thread blocks, all four loads (both LSEs, both V vectors) in
//    flight at once; no per-token blocks, so no (head_dim/vec x heads)-thread blocks that leave the
//    last wave ragged, as FlashInfer's MergeState does.
//  * Programmatic dependent launch on sm_90+ (all reads/writes behind griddepcontrol.wait, dependents
//    released right after it; the first wave warms L2 with its inputs before the wait).
//  * fp32 math with the fast exp/log/division that sgl-kernel's -use_fast_math build uses.
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
#define ASTRA_P_BIG 1  // vectors per thread once the problem is over one wave
#endif
#ifndef ASTRA_PRECISE
#define ASTRA_PRECISE 0  // 1: expf/logf/IEEE division instead of the fast-math intrinsics
#endif

namespace astra_merge {
// Internal linkage for everything below: the statics of inline/template functions (occupancy and
// smem-attribute caches) would otherwise be GNU-unique symbols, shared by every build of this file
// loaded into one process (a baseline and a candidate derived from it, or two variants), each then
// trusting a cache filled for another library's kernels.
namespace {

#ifndef ASTRA_THREADS
#define ASTRA_THREADS 256
#endif
constexpr int kThreads = ASTRA_THREADS;

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

// Vector j of thread t in block b: idx = (b * P + j) * kThreads + t (coalesced per j); it covers
// elements [idx*W, idx*W + W) of the flattened [tokens*heads*head_dim] arrays and belongs to the
// (token, head) pair hp = idx / nvh, whose LSE sits at s[hp].
template <typename T, int W, int P>
__global__ void __launch_bounds__(kThreads) merge_state_kernel(const T* __restrict__ va, const float* __restrict__ sa,
                                                              const T* __restrict__ vb, const float* __restrict__ sb,
                                                              T* __restrict__ vo, float* __restrict__ so,
                                                              uint32_t nvh, uint32_t total, uint32_t pf_blocks) {
  uint32_t idx[P], hp[P];
  bool ok[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    idx[j] = (blockIdx.x * P + j) * kThreads + threadIdx.x;
    ok[j] = idx[j] < total;
    hp[j] = idx[j] / nvh;
  }
#if ASTRA_PDL >= 2
  if (blockIdx.x < pf_blocks) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (ok[j]) {
        prefetch_l2(va + size_t(idx[j]) * W);
        prefetch_l2(vb + size_t(idx[j]) * W);
        if (idx[j] == hp[j] * nvh && (hp[j] & 31u) == 0) {  // one request per 128-byte line of LSEs
          prefetch_l2(sa + hp[j]);
          prefetch_l2(sb + hp[j]);
        }
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
  float la[P], lb[P];
  Vec<T, W> a[P], b[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (ok[j]) {
      la[j] = __ldg(sa + hp[j]);
      lb[j] = __ldg(sb + hp[j]);
      a[j] = ldg<T, W>(va + size_t(idx[j]) * W);
      b[j] = ldg<T, W>(vb + size_t(idx[j]) * W);
    }
  }
  const float kNegInf = -__int_as_float(0x7f800000);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (ok[j]) {
      float p = la[j], q = lb[j];
      p = isinf(p) ? kNegInf : p;
      q = isinf(q) ? kNegInf : q;
      const float m = fmaxf(p, q);
#if ASTRA_PRECISE
      const float ep = expf(p - m);
      const float eq = expf(q - m);
      const float se = ep + eq;
      const float sp = ep / se;
      const float sq = eq / se;
#else
      // The fast-math forms sgl-kernel's -use_fast_math build compiles expf / logf / '/' to.
      const float ep = __expf(p - m);
      const float eq = __expf(q - m);
      const float se = ep + eq;
      const float sp = __fdividef(ep, se);
      const float sq = __fdividef(eq, se);
#endif
      Vec<T, W> o;
#pragma unroll
      for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(to_f(a[j].v[i]) * sp + to_f(b[j].v[i]) * sq);
      stg<T, W>(vo + size_t(idx[j]) * W, o);
#if ASTRA_PRECISE
      if (so != nullptr && idx[j] == hp[j] * nvh) so[hp[j]] = logf(se) + m;
#else
      if (so != nullptr && idx[j] == hp[j] * nvh) so[hp[j]] = __logf(se) + m;
#endif
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
  static int cached = 0;
  if (cached == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, merge_state_kernel<T, W, P>, kThreads, 0) != cudaSuccess ||
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
cudaError_t launch_p(const T* va, const float* sa, const T* vb, const float* sb, T* vo, float* so, uint32_t nvh,
                     uint32_t total, bool pdl, bool prefetch, cudaStream_t stream) {
  const uint32_t per_block = uint32_t(kThreads) * P;
  const uint32_t blocks = (total + per_block - 1) / per_block;
  // Only the first wave (the blocks resident at once) prefetches: later blocks start after the wait is met.
  const uint32_t pf_blocks = prefetch ? uint32_t(dev_info().sms) * uint32_t(blocks_per_sm<T, W, P>()) : 0u;
  return launch(merge_state_kernel<T, W, P>, dim3(blocks), dim3(kThreads), stream, pdl, va, sa, vb, sb, vo, so, nvh,
                total, pf_blocks);
}

template <typename T, int W>
cudaError_t run_w(const T* va, const float* sa, const T* vb, const float* sb, T* vo, float* so, int64_t th,
                  int64_t D, cudaStream_t stream) {
  const uint64_t total64 = uint64_t(th) * uint64_t(D / W);
  if (total64 >= (1ull << 31)) return cudaErrorInvalidValue;
  const uint32_t total = uint32_t(total64);
  const uint32_t nvh = uint32_t(D / W);
  const DevInfo info = dev_info();
  const bool pdl = (ASTRA_PDL != 0) && info.major >= 9;
  // One vector per thread while the problem fits one wave; past that ASTRA_P_BIG per thread over as
  // many waves as it takes (streaming waves beat packing into one wave of fat threads: measured).
  const uint64_t resident1 = uint64_t(info.sms) * blocks_per_sm<T, W, 1>() * kThreads;
  const int p = total > resident1 ? ASTRA_P_BIG : 1;
  // The first wave prefetches at any size (multi-wave grids measured 1-5% faster with it: kernels/NOTES.md).
  const bool prefetch = (ASTRA_PF_ALL || total <= resident1) &&
                        uint64_t(th) * uint64_t(D) * 2 * sizeof(T) <= uint64_t(ASTRA_PF_MAX);
  if (p == 2) return launch_p<T, W, 2>(va, sa, vb, sb, vo, so, nvh, total, pdl, prefetch, stream);
  return launch_p<T, W, 1>(va, sa, vb, sb, vo, so, nvh, total, pdl, prefetch, stream);
}

template <typename T>
cudaError_t run(const void* v_a, const void* s_a, const void* v_b, const void* s_b, void* v_out, void* s_out,
                int64_t tokens, int64_t heads, int64_t D, cudaStream_t stream) {
  if (tokens < 0 || heads < 0 || D < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || heads == 0) return cudaSuccess;
  if (D == 0) return cudaErrorInvalidValue;  // s_out would need writing with no vector to carry it
  const T* va = static_cast<const T*>(v_a);
  const T* vb = static_cast<const T*>(v_b);
  T* vo = static_cast<T*>(v_out);
  const float* sa = static_cast<const float*>(s_a);
  const float* sb = static_cast<const float*>(s_b);
  float* so = static_cast<float*>(s_out);
  const uintptr_t align = reinterpret_cast<uintptr_t>(v_a) | reinterpret_cast<uintptr_t>(v_b) |
                          reinterpret_cast<uintptr_t>(v_out);
  constexpr int kMaxW = 16 / sizeof(T);
  int w = kMaxW;
  while (w > 1 && ((D % w) != 0 || (align % (w * sizeof(T))) != 0)) w >>= 1;
  const int64_t th = tokens * heads;
  if (w == kMaxW) return run_w<T, kMaxW>(va, sa, vb, sb, vo, so, th, D, stream);
  if constexpr (kMaxW >= 8) {
    if (w == 4) return run_w<T, 4>(va, sa, vb, sb, vo, so, th, D, stream);
  }
  if (w == 2) return run_w<T, 2>(va, sa, vb, sb, vo, so, th, D, stream);
  return run_w<T, 1>(va, sa, vb, sb, vo, so, th, D, stream);
}

}  // namespace
}  // namespace astra_merge

extern "C" cudaError_t astra_merge_state(const void* v_a, const void* s_a, const void* v_b, const void* s_b,
                                         void* v_out, void* s_out, int64_t num_tokens, int64_t num_heads,
                                         int64_t head_dim, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 0: return astra_merge::run<float>(v_a, s_a, v_b, s_b, v_out, s_out, num_tokens, num_heads, head_dim, stream);
    case 1: return astra_merge::run<__half>(v_a, s_a, v_b, s_b, v_out, s_out, num_tokens, num_heads, head_dim, stream);
    case 2:
      return astra_merge::run<__nv_bfloat16>(v_a, s_a, v_b, s_b, v_out, s_out, num_tokens, num_heads, head_dim, stream);
    default: return cudaErrorInvalidValue;
  }
}
