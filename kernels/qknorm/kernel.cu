// astra-sglang optimized qknorm: Qwen3's per-head RMSNorm of q and k, in place.
//   x[t, h, :] <- x[t, h, :] * rsqrt(mean(x[t, h, :]^2) + eps) * w      (w = q_weight or k_weight)
// q and k are column blocks of the qkv projection's output: token rows q_stride / k_stride elements apart.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_qknorm(void* q, void* k, const void* q_weight, const void* k_weight,
//         int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
//         int64_t q_stride, int64_t k_stride, double eps, int dtype, cudaStream_t stream)
// dtype: 1 fp16, 2 bf16.  Launches on `stream` only; no allocation, no host sync; capturable.
//
// Design:
//  * One head row per group of LANES threads, each thread one 16-byte vector (head_dim 128: 16 lanes, two
//    rows per warp; 64: four rows per warp; 256+: a full warp, more vectors per lane). The group's sum of
//    squares is an xor-shuffle reduction inside the group. Narrower vectors when a pointer or a stride is
//    not 16-byte aligned.
//  * A flat grid of 256-thread blocks over all (token, head) rows, no persistent loop: rows are
//    independent and a decode step has few of them, so the shortest path from launch to store wins.
//  * Programmatic dependent launch on sm_90+: the weights (constants, not produced upstream) are loaded
//    before griddepcontrol.wait; q/k are read only after it; dependents are released right after the wait
//    (their own wait still orders them after this grid's stores).
//  * fp32 math as production computes it: x * rsqrt(sum / d + eps) * w, rounded once.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_QKN_PDL
#define ASTRA_QKN_PDL 1  // dev: 0 launches without PDL (no-op griddepcontrol); kernels/NOTES.md, seventeenth session
#endif

// 1: the sum of squares in production's order wherever the lane's vector holds whole production units (16-byte
// vectors, the aligned case): check 104 of 104 comparisons bit-identical to SGLang, decode corpus in context 1.060x ->
// 1.084x in one run (H200, 2026-11-27, results/2026-11-27-h200/session10). 0: one chain per lane (92 of 104).
#ifndef ASTRA_QKN_ORDER
#define ASTRA_QKN_ORDER 1
#endif

namespace astra_qkn {
// internal linkage: no GNU-unique statics shared with another loaded build of this file
namespace {

// 64-thread blocks (a decode step's few rows over more SMs) were slower in context: 1.064x -> 1.021x (H200, 2026-11-28)
constexpr int kThreads = 256;
// Production's unit: the elements one of its threads sums in one chain (qknorm.cuh: head_dim <= 256 takes a warp per
// row, head_dim / 32 elements a lane; 512 and 1024 take a CTA of head_dim / 8 threads, 8 elements each).
template <int D> constexpr int kUnit = D <= 256 ? D / 32 : 8;

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

__device__ __forceinline__ float2 to_f2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_f2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
template <typename T2> __device__ __forceinline__ T2 from_f2(float a, float b);
template <> __device__ __forceinline__ __half2 from_f2<__half2>(float a, float b) { return __floats2half2_rn(a, b); }
template <> __device__ __forceinline__ __nv_bfloat162 from_f2<__nv_bfloat162>(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

// VEC elements of T moved as one access.
template <int BYTES> struct Raw;
template <> struct Raw<16> { using type = uint4; };
template <> struct Raw<8> { using type = uint2; };
template <> struct Raw<4> { using type = unsigned int; };

template <typename T, int VEC>
struct alignas(VEC * sizeof(T)) Vec {
  using T2 = typename Pair<T>::type;
  T2 v[VEC / 2];
};

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load(const T* p) {
  using R = typename Raw<VEC * sizeof(T)>::type;
  R r = *reinterpret_cast<const R*>(p);
  return *reinterpret_cast<Vec<T, VEC>*>(&r);
}
template <typename T, int VEC>
__device__ __forceinline__ void store(T* p, const Vec<T, VEC>& x) {
  using R = typename Raw<VEC * sizeof(T)>::type;
  *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(&x);
}

// D: head_dim, VEC: elements per access. LANES threads own one row; each holds NV vectors.
template <typename T, int D, int VEC>
__global__ void __launch_bounds__(kThreads) qknorm_kernel(T* __restrict__ q, T* __restrict__ k,
                                                          const T* __restrict__ qw, const T* __restrict__ kw,
                                                          uint32_t rows, uint32_t heads, uint32_t hq, int64_t qs,
                                                          int64_t ks, float eps) {
  constexpr int LANES = (D / VEC) < 32 ? (D / VEC) : 32;
  constexpr int NV = D / (LANES * VEC);
  constexpr int RPB = kThreads / LANES;  // rows per block
  static_assert(NV * LANES * VEC == D, "head_dim must split into whole vectors");
  using T2 = typename Pair<T>::type;

  const uint32_t lane = threadIdx.x % LANES;
  const uint32_t want = blockIdx.x * RPB + threadIdx.x / LANES;
  const bool valid = want < rows;
  const uint32_t row = valid ? want : rows - 1;  // a spare group recomputes the last row, stores nothing
  const uint32_t t = row / heads;
  const uint32_t h = row - t * heads;
  const bool is_q = h < hq;

  Vec<T, VEC> w[NV];
  const T* wp = is_q ? qw : kw;
#pragma unroll
  for (int i = 0; i < NV; ++i) w[i] = load<T, VEC>(wp + (i * LANES + lane) * VEC);

  // Released after the wait: releasing before it read faster chained (1.299x -> 1.397x) but slower in context
  // (1.095x -> 1.057x, decode corpus, both orders; H200, 2026-11-28).
  pdl_wait();
  pdl_trigger();

  T* x = is_q ? q + static_cast<int64_t>(t) * qs + static_cast<int64_t>(h) * D
              : k + static_cast<int64_t>(t) * ks + static_cast<int64_t>(h - hq) * D;
  Vec<T, VEC> v[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) v[i] = load<T, VEC>(x + (i * LANES + lane) * VEC);

  float ss = 0.f;
  if constexpr (ASTRA_QKN_ORDER && VEC % kUnit<D> == 0) {
    // Production's order: one fma chain per production thread's run of kUnit<D> elements (CH chains per lane), each
    // chain's butterfly across the row's lanes (production's offsets of its whole units), then the rest of its
    // butterfly inside the lane: within a warp (head_dim <= 256) or over its warp sums, zero padded (512, 1024).
    constexpr int M = VEC / kUnit<D>, CH = NV * M;
    float c[CH];
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int u = 0; u < M; ++u) {
        float s = 0.f;
#pragma unroll
        for (int j = u * kUnit<D> / 2; j < (u + 1) * kUnit<D> / 2; ++j) {
          const float2 f = to_f2(v[i].v[j]);
          s += f.x * f.x;
          s += f.y * f.y;
        }
        c[i * M + u] = s;
      }
#pragma unroll
    for (int m = LANES / 2; m > 0; m >>= 1)
#pragma unroll
      for (int k = 0; k < CH; ++k) c[k] += __shfl_xor_sync(0xffffffffu, c[k], m, LANES);
#pragma unroll
    for (int o = CH / 2; o > 0; o >>= 1)
#pragma unroll
      for (int k = 0; k < o; ++k) c[k] = c[k] + c[k + o];  // chains k and k ^ o: the sum both ends of the pair get
    ss = c[0];
  } else {
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int j = 0; j < VEC / 2; ++j) {
        const float2 f = to_f2(v[i].v[j]);
        ss += f.x * f.x;
        ss += f.y * f.y;
      }
#pragma unroll
    for (int m = LANES / 2; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m, LANES);
  }
  const float r = rsqrtf(ss / D + eps);

#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
      const float2 f = to_f2(v[i].v[j]);
      const float2 g = to_f2(w[i].v[j]);
      v[i].v[j] = from_f2<T2>(f.x * r * g.x, f.y * r * g.y);
    }
  if (valid) {
#pragma unroll
    for (int i = 0; i < NV; ++i) store<T, VEC>(x + (i * LANES + lane) * VEC, v[i]);
  }
}

template <typename T, int D, int VEC>
cudaError_t launch(void* q, void* k, const void* qw, const void* kw, uint32_t rows, uint32_t heads, uint32_t hq,
                   int64_t qs, int64_t ks, float eps, cudaStream_t stream) {
  constexpr int LANES = (D / VEC) < 32 ? (D / VEC) : 32;
  constexpr uint32_t RPB = kThreads / LANES;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((rows + RPB - 1) / RPB);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ASTRA_QKN_PDL ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, qknorm_kernel<T, D, VEC>, static_cast<T*>(q), static_cast<T*>(k),
                            static_cast<const T*>(qw), static_cast<const T*>(kw), rows, heads, hq, qs, ks, eps);
}

template <typename T, int D>
cudaError_t by_vec(int vec, void* q, void* k, const void* qw, const void* kw, uint32_t rows, uint32_t heads,
                   uint32_t hq, int64_t qs, int64_t ks, float eps, cudaStream_t s) {
  switch (vec) {
    case 8: return launch<T, D, 8>(q, k, qw, kw, rows, heads, hq, qs, ks, eps, s);
    case 4: return launch<T, D, 4>(q, k, qw, kw, rows, heads, hq, qs, ks, eps, s);
    default: return launch<T, D, 2>(q, k, qw, kw, rows, heads, hq, qs, ks, eps, s);
  }
}

template <typename T>
cudaError_t run(void* q, void* k, const void* qw, const void* kw, int64_t t, int64_t hq, int64_t hk, int64_t d,
                int64_t qs, int64_t ks, float eps, cudaStream_t s) {
  if (t <= 0 || hq + hk <= 0) return t == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (hq < 0 || hk < 0 || qs < hq * d || ks < hk * d) return cudaErrorInvalidValue;
  const int64_t rows64 = t * (hq + hk);
  if (rows64 > 0x7fffffffLL) return cudaErrorInvalidValue;
  // widest access every pointer and row stride allows
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         reinterpret_cast<uintptr_t>(qw) | reinterpret_cast<uintptr_t>(kw) |
                         static_cast<uintptr_t>(qs * 2) | static_cast<uintptr_t>(ks * 2);
  if (bits % 4) return cudaErrorMisalignedAddress;  // SGLang's kernel needs at least this too
  const int vec = bits % 16 == 0 ? 8 : bits % 8 == 0 ? 4 : 2;
  const uint32_t rows = static_cast<uint32_t>(rows64), heads = static_cast<uint32_t>(hq + hk);
  const uint32_t nq = static_cast<uint32_t>(hq);
  switch (d) {
    case 64: return by_vec<T, 64>(vec, q, k, qw, kw, rows, heads, nq, qs, ks, eps, s);
    case 128: return by_vec<T, 128>(vec, q, k, qw, kw, rows, heads, nq, qs, ks, eps, s);
    case 256: return by_vec<T, 256>(vec, q, k, qw, kw, rows, heads, nq, qs, ks, eps, s);
    case 512: return by_vec<T, 512>(vec, q, k, qw, kw, rows, heads, nq, qs, ks, eps, s);
    case 1024: return by_vec<T, 1024>(vec, q, k, qw, kw, rows, heads, nq, qs, ks, eps, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace astra_qkn

extern "C" cudaError_t astra_qknorm(void* q, void* k, const void* q_weight, const void* k_weight, int64_t num_tokens,
                                    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                                    int64_t k_stride, double eps, int dtype, cudaStream_t stream) {
  const float e = static_cast<float>(eps);
  switch (dtype) {
    case 1: return astra_qkn::run<__half>(q, k, q_weight, k_weight, num_tokens, num_q_heads, num_kv_heads,
                                             head_dim, q_stride, k_stride, e, stream);
    case 2: return astra_qkn::run<__nv_bfloat16>(q, k, q_weight, k_weight, num_tokens, num_q_heads,
                                                    num_kv_heads, head_dim, q_stride, k_stride, e, stream);
    default: return cudaErrorInvalidValue;
  }
}
