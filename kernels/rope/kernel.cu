// astra-sglang optimized rope: rotary position embedding of q and k, in place.
//   NeoX  (is_neox=1): x = h[i], y = h[i + r/2];  GPT-J (is_neox=0): x = h[2i], y = h[2i + 1];   i < r/2
//   (x, y) <- (x cos_i - y sin_i, x sin_i + y cos_i),  cos_i / sin_i = cos_sin_cache[pos][i] / [r/2 + i] (fp32)
// q and k are column blocks of the qkv output: token rows q_stride / k_stride elements apart, heads head_size
// apart; columns past rope_dim are left alone.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_rope(void* q, void* k, const void* cos_sin_cache, const void* positions,
//         int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_size, int64_t rope_dim,
//         int64_t q_stride, int64_t k_stride, int64_t is_neox, int dtype, cudaStream_t stream)
// positions: int64. dtype: 1 fp16, 2 bf16. Launches on `stream` only; no allocation, no host sync; capturable.
//
// Design:
//  * A flat grid of 256-thread blocks; each thread owns one 16-byte vector of x (and, NeoX, the matching vector
//    of y half a rotation away): rope_dim 128 is 8 threads per head (NeoX) instead of production's 16 threads
//    moving 8 bytes each, so twice the bytes in flight per thread and no persistent loop.
//  * The head's q/k vectors are loaded in the same batch as the position; only the cos/sin rows wait for it.
//  * Programmatic dependent launch on sm_90+: every read behind griddepcontrol.wait (positions, q and k can all
//    be written by the kernels just before); dependents are released right after the wait.
//  * fp32 math as production, with production's fma contraction (ASTRA_ROPE_X/Y): x*cos - y*sin, x*sin + y*cos,
//    rounded once.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

// How the two products of a rotated element meet (as in dense_rope_store, whose forms were checked against SGLang
// 0.5.17's JIT rope on an H200; results/2026-11-27-h200/session8 call D): where nvcc contracts `x * c - y * s` into
// an fma depends on the code around it, so the form is spelled out. X=1 Y=2 is the one found bit-identical there.
// x' = x c - y s: 0 as written (the compiler contracts), 1 fma(x, c, -(y s)), 2 fma(-y, s, x c), 3 no fma.
#ifndef ASTRA_ROPE_X
#define ASTRA_ROPE_X 1
#endif
// y' = x s + y c: 0 as written, 1 fma(x, s, y c), 2 fma(y, c, x s), 3 no fma.
#ifndef ASTRA_ROPE_Y
#define ASTRA_ROPE_Y 2
#endif

// Dev knob (kernels/dev/bench_variants.sh): 1 releases dependents after the stores, where production does, instead
// of right after griddepcontrol.wait.
#ifndef ASTRA_TRIG_END
#define ASTRA_TRIG_END 0
#endif
#ifndef ASTRA_THREADS
#define ASTRA_THREADS 256  // dev knob: threads per block (a smaller block spreads a decode batch over more SMs)
#endif

namespace astra_rope_k {
// internal linkage: no GNU-unique statics shared with another loaded build of this file
namespace {

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

template <int BYTES> struct Raw;
template <> struct Raw<16> { using type = uint4; };
template <> struct Raw<8> { using type = uint2; };
template <> struct Raw<4> { using type = unsigned int; };

// N elements of T as one access
template <typename T, int N>
struct alignas(N * sizeof(T)) Vec {
  T v[N];
};
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load(const void* p) {
  constexpr int B = N * sizeof(T);
  if constexpr (B <= 16) {
    typename Raw<B>::type r = *reinterpret_cast<const typename Raw<B>::type*>(p);
    return *reinterpret_cast<Vec<T, N>*>(&r);
  } else {  // 32 bytes of fp32 cos/sin: two 16-byte loads
    Vec<T, N> out;
    const uint4* s = reinterpret_cast<const uint4*>(p);
    uint4* d = reinterpret_cast<uint4*>(&out);
#pragma unroll
    for (int i = 0; i < B / 16; ++i) d[i] = s[i];
    return out;
  }
}
template <typename T, int N>
__device__ __forceinline__ void store(void* p, const Vec<T, N>& x) {
  constexpr int B = N * sizeof(T);
  static_assert(B <= 16, "stores are one access");
  *reinterpret_cast<typename Raw<B>::type*>(p) = *reinterpret_cast<const typename Raw<B>::type*>(&x);
}

__device__ __forceinline__ float rot_x(float x, float y, float c, float s) {
#if ASTRA_ROPE_X == 1
  return fmaf(x, c, -__fmul_rn(y, s));
#elif ASTRA_ROPE_X == 2
  return fmaf(-y, s, __fmul_rn(x, c));
#elif ASTRA_ROPE_X == 3
  return __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
#else
  return x * c - y * s;
#endif
}
__device__ __forceinline__ float rot_y(float x, float y, float c, float s) {
#if ASTRA_ROPE_Y == 1
  return fmaf(x, s, __fmul_rn(y, c));
#elif ASTRA_ROPE_Y == 2
  return fmaf(y, c, __fmul_rn(x, s));
#elif ASTRA_ROPE_Y == 3
  return __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
#else
  return x * s + y * c;
#endif
}

// V: elements of T per access. NeoX: a thread owns V elements of x (and of y). GPT-J: V elements = V/2 pairs.
// lanes = threads per head (runtime: r / 2 / V for NeoX, r / V for GPT-J).
template <typename T, int V, bool kNeox>
__global__ void __launch_bounds__(kThreads) rope_kernel(T* __restrict__ q, T* __restrict__ k,
                                                        const float* __restrict__ cache,
                                                        const int64_t* __restrict__ positions, uint32_t total,
                                                        uint32_t lanes, uint32_t heads, uint32_t hq, int64_t qs,
                                                        int64_t ks, int64_t hs, int r) {
  using T2 = typename Pair<T>::type;
  const uint32_t gid = blockIdx.x * kThreads + threadIdx.x;
  pdl_wait();
  if (!ASTRA_TRIG_END) pdl_trigger();
  if (gid >= total) return;
  const uint32_t row = gid / lanes;
  const uint32_t lane = gid - row * lanes;
  const uint32_t t = row / heads;
  const uint32_t h = row - t * heads;
  const int64_t pos = positions[t];
  T* base = h < hq ? q + static_cast<int64_t>(t) * qs + static_cast<int64_t>(h) * hs
                   : k + static_cast<int64_t>(t) * ks + static_cast<int64_t>(h - hq) * hs;
  const float* row_cs = cache + pos * r;
  if constexpr (kNeox) {
    const int off = static_cast<int>(lane) * V;
    T* px = base + off;
    T* py = base + off + r / 2;
    Vec<T, V> x = load<T, V>(px);
    Vec<T, V> y = load<T, V>(py);
    const Vec<float, V> c = load<float, V>(row_cs + off);
    const Vec<float, V> s = load<float, V>(row_cs + r / 2 + off);
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      const float2 a = to_f2(*reinterpret_cast<const T2*>(&x.v[j]));
      const float2 b = to_f2(*reinterpret_cast<const T2*>(&y.v[j]));
      *reinterpret_cast<T2*>(&x.v[j]) = from_f2<T2>(rot_x(a.x, b.x, c.v[j], s.v[j]), rot_x(a.y, b.y, c.v[j + 1], s.v[j + 1]));
      *reinterpret_cast<T2*>(&y.v[j]) = from_f2<T2>(rot_y(a.x, b.x, c.v[j], s.v[j]), rot_y(a.y, b.y, c.v[j + 1], s.v[j + 1]));
    }
    store<T, V>(px, x);
    store<T, V>(py, y);
    if (ASTRA_TRIG_END) pdl_trigger();
  } else {
    constexpr int P = V / 2;  // pairs per thread
    const int off = static_cast<int>(lane) * V;
    T* px = base + off;
    Vec<T, V> x = load<T, V>(px);
    const Vec<float, P> c = load<float, P>(row_cs + off / 2);
    const Vec<float, P> s = load<float, P>(row_cs + r / 2 + off / 2);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float2 a = to_f2(*reinterpret_cast<const T2*>(&x.v[2 * j]));
      *reinterpret_cast<T2*>(&x.v[2 * j]) = from_f2<T2>(rot_x(a.x, a.y, c.v[j], s.v[j]), rot_y(a.x, a.y, c.v[j], s.v[j]));
    }
    store<T, V>(px, x);
    if (ASTRA_TRIG_END) pdl_trigger();
  }
}

template <typename T, int V, bool kNeox>
cudaError_t launch(void* q, void* k, const void* cache, const void* pos, uint32_t rows, uint32_t heads, uint32_t hq,
                   int64_t qs, int64_t ks, int64_t hs, int r, cudaStream_t stream) {
  const uint32_t lanes = static_cast<uint32_t>(kNeox ? r / 2 / V : r / V);
  const uint64_t total = static_cast<uint64_t>(rows) * lanes;
  if (total > 0xffffffffull - kThreads) return cudaErrorInvalidValue;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<uint32_t>((total + kThreads - 1) / kThreads));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, rope_kernel<T, V, kNeox>, static_cast<T*>(q), static_cast<T*>(k),
                            static_cast<const float*>(cache), static_cast<const int64_t*>(pos),
                            static_cast<uint32_t>(total), lanes, heads, hq, qs, ks, hs, r);
}

template <typename T, bool kNeox>
cudaError_t by_vec(int v, void* q, void* k, const void* c, const void* p, uint32_t rows, uint32_t heads, uint32_t hq,
                   int64_t qs, int64_t ks, int64_t hs, int r, cudaStream_t s) {
  switch (v) {
    case 8: return launch<T, 8, kNeox>(q, k, c, p, rows, heads, hq, qs, ks, hs, r, s);
    case 4: return launch<T, 4, kNeox>(q, k, c, p, rows, heads, hq, qs, ks, hs, r, s);
    default: return launch<T, 2, kNeox>(q, k, c, p, rows, heads, hq, qs, ks, hs, r, s);
  }
}

template <typename T>
cudaError_t run(void* q, void* k, const void* cache, const void* pos, int64_t t, int64_t hq, int64_t hk, int64_t hs,
                int64_t r, int64_t qs, int64_t ks, int64_t neox, cudaStream_t s) {
  if (t == 0) return cudaSuccess;
  if (t < 0 || hq < 0 || hk < 0 || hq + hk == 0 || r <= 0 || r % 4 || r > hs || qs < hq * hs || ks < hk * hs)
    return cudaErrorInvalidValue;
  const int64_t rows = t * (hq + hk);
  if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  // widest vector every address allows: pointers, strides, the y half (NeoX) and the cos/sin rows (fp32)
  const int64_t span = neox ? r / 2 : r;  // elements the threads of one head tile
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                         static_cast<uintptr_t>((qs | ks | hs | (neox ? r / 2 : 0)) * 2);
  const uintptr_t cbits = reinterpret_cast<uintptr_t>(cache) | static_cast<uintptr_t>(r * 2);  // sin half: r/2 floats
  int v = 2;
  if (bits % 16 == 0 && span % 8 == 0 && cbits % (neox ? 32 : 16) == 0) v = 8;
  else if (bits % 8 == 0 && span % 4 == 0 && cbits % (neox ? 16 : 8) == 0) v = 4;
  if (bits % 4 || cbits % 8) return cudaErrorMisalignedAddress;
  const uint32_t R = static_cast<uint32_t>(rows), H = static_cast<uint32_t>(hq + hk), Q = static_cast<uint32_t>(hq);
  const int ri = static_cast<int>(r);
  return neox ? by_vec<T, true>(v, q, k, cache, pos, R, H, Q, qs, ks, hs, ri, s)
              : by_vec<T, false>(v, q, k, cache, pos, R, H, Q, qs, ks, hs, ri, s);
}

}  // namespace
}  // namespace astra_rope_k

extern "C" cudaError_t astra_rope(void* q, void* k, const void* cos_sin_cache, const void* positions,
                                  int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_size,
                                  int64_t rope_dim, int64_t q_stride, int64_t k_stride, int64_t is_neox, int dtype,
                                  cudaStream_t stream) {
  switch (dtype) {
    case 1: return astra_rope_k::run<__half>(q, k, cos_sin_cache, positions, num_tokens, num_q_heads, num_kv_heads,
                                            head_size, rope_dim, q_stride, k_stride, is_neox, stream);
    case 2: return astra_rope_k::run<__nv_bfloat16>(q, k, cos_sin_cache, positions, num_tokens, num_q_heads,
                                                   num_kv_heads, head_size, rope_dim, q_stride, k_stride, is_neox,
                                                   stream);
    default: return cudaErrorInvalidValue;
  }
}
