// astra-sglang optimized dense_rope_store: the rope + KV store of dense (Llama-style) attention in one launch, where
// SGLang runs its rope kernel, then the attention backend's KV store. Rotary embedding of k in place and of q into
// its own buffer q_out (rope_dim = head_dim), the rotated k and the untouched v stored into the KV cache at each
// token's slot:
//   q_out[t,h] <- rotate(q[t,h], cos_sin_cache[positions[t]]);  k[t,h] <- rotate(k[t,h], .)   NeoX or GPT-J
//   k_cache[out_loc[t], h*D:(h+1)*D] = rotated k[t,h];  v_cache[out_loc[t], ...] = v[t,h]
// q/k/v/q_out: token rows q_stride / k_stride / v_stride / q_out_stride elements apart, heads head_dim apart; caches
// contiguous [slots, num_kv_heads * head_dim].
// Why q_out: q is a column block of the qkv output (rows q_size + 2 kv_size apart); handed to the attention as that
// strided view, SGLang 0.5.17's fa3 backend copies it (q.contiguous()), one more kernel a layer from batch 2 on. The
// patch passes a contiguous [num_tokens, num_q_heads * head_dim] q_out instead (RESULTS.md). q_out may be q itself
// with q_out_stride = q_stride (in place, the adapter's ASTRA_DRS_Q_OUT=0 arm): each thread reads its elements before
// it writes them and no other thread touches them; any other overlap of q and q_out is the caller's error.
// The same computation as rope_store's kernel (kernels/rope_store/kernel.cu), kept as its own self-contained source:
// this op's production is two SGLang kernels, rope_store's one.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_dense_rope_store(const void* q, void* q_out, void* k, const void* v,
//         void* k_cache, void* v_cache, const void* cos_sin_cache, const void* positions, const void* out_loc,
//         int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
//         int64_t k_stride, int64_t v_stride, int64_t q_out_stride, int64_t is_neox, int dtype, cudaStream_t stream)
// (q_out_stride after v_stride: the ABI's int64s are the spec's dims in order, and rope_store's seven come first)
// positions, out_loc: int64. dtype: 1 fp16, 2 bf16. Launches on `stream` only; no allocation, no host sync.
//
// Design (the rope kernel's, kernels/rope/kernel.cu, with v rows added):
//  * A flat grid of 256-thread blocks over the q, k and v head rows of every token; each thread owns one
//    16-byte vector (NeoX: and its partner half a rotation away), so a 128-wide head is 8 threads.
//  * A v row is a copy; a k row is rotated once and stored twice (in place and into the cache).
//  * The head's vectors load in the same batch as the position and the slot; only cos/sin wait for the position.
//  * PDL on sm_90+: every read behind griddepcontrol.wait; dependents released right after it.
//  * fp32 math as production, with production's fma contraction (ASTRA_ROPE_X/Y): bit-identical to SGLang's rope;
//    the cached k is bit-identical to the in-place k.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

// How the two products of a rotated element meet: where nvcc contracts `x * c - y * s` into an fma depends on the code
// around it, and production's build contracted otherwise than this kernel's did (199 of 224 check comparisons
// bit-identical; Gemma-2-9B's greedy tokens diverged in 10 of 40 requests). Spelled out, each form was checked
// against SGLang 0.5.17's JIT rope on an H200 (results/2026-11-27-h200/session8, call D): X=1 Y=2 is bit-identical
// in 224 of 224 comparisons (1/1: 201, 2/2: 200, 2/1: 191, 3/3: 189).
// x' = x c - y s: 0 as written (the compiler contracts), 1 fma(x, c, -(y s)), 2 fma(-y, s, x c), 3 no fma.
#ifndef ASTRA_ROPE_X
#define ASTRA_ROPE_X 1
#endif
// y' = x s + y c: 0 as written, 1 fma(x, s, y c), 2 fma(y, c, x s), 3 no fma.
#ifndef ASTRA_ROPE_Y
#define ASTRA_ROPE_Y 2
#endif

namespace astra_drs {
// internal linkage: no GNU-unique statics shared with another loaded build of this file
namespace {

constexpr int kThreads = 256;

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

// V: elements per access. A head row is `lanes` threads: NeoX r/2/V (each a vector of x and of y), GPT-J r/V.
template <typename T, int V, bool kNeox>
__global__ void __launch_bounds__(kThreads) rope_store_kernel(
    const T* q, T* qo, T* __restrict__ k, const T* __restrict__ v, T* __restrict__ kc, T* __restrict__ vc,
    const float* __restrict__ cache, const int64_t* __restrict__ positions, const int64_t* __restrict__ out_loc,
    uint32_t total, uint32_t lanes, uint32_t hq, uint32_t hk, int64_t qs, int64_t qos, int64_t ks, int64_t vs,
    int d) {
  using T2 = typename Pair<T>::type;
  const uint32_t gid = blockIdx.x * kThreads + threadIdx.x;
  pdl_wait();
  pdl_trigger();
  if (gid >= total) return;
  const uint32_t heads = hq + 2 * hk;
  const uint32_t row = gid / lanes;
  const uint32_t lane = gid - row * lanes;
  const uint32_t t = row / heads;
  const uint32_t h = row - t * heads;
  const int off = static_cast<int>(lane) * V;
  constexpr int kParts = kNeox ? 2 : 1;  // vectors per thread: x and y (NeoX) or one run of pairs (GPT-J)
  const int half = d / 2;
  const int64_t row_elems = static_cast<int64_t>(hk) * d;  // a cache slot
  if (h >= hq + hk) {  // v: copy into the cache
    const uint32_t hv = h - hq - hk;
    const T* src = v + static_cast<int64_t>(t) * vs + static_cast<int64_t>(hv) * d + off;
    Vec<T, V> a[kParts];
#pragma unroll
    for (int p = 0; p < kParts; ++p) a[p] = load<T, V>(src + p * half);
    const int64_t slot = out_loc[t];
    T* dst = vc + slot * row_elems + static_cast<int64_t>(hv) * d + off;
#pragma unroll
    for (int p = 0; p < kParts; ++p) store<T, V>(dst + p * half, a[p]);
    return;
  }
  const bool is_q = h < hq;
  const uint32_t hh = is_q ? h : h - hq;
  // q: read from q, written to q_out (may be q itself); k: read and written in place
  const T* src = is_q ? q + static_cast<int64_t>(t) * qs + static_cast<int64_t>(hh) * d
                      : k + static_cast<int64_t>(t) * ks + static_cast<int64_t>(hh) * d;
  T* base = is_q ? qo + static_cast<int64_t>(t) * qos + static_cast<int64_t>(hh) * d
                 : k + static_cast<int64_t>(t) * ks + static_cast<int64_t>(hh) * d;
  const int64_t pos = positions[t];
  const int64_t slot = is_q ? 0 : out_loc[t];
  const float* row_cs = cache + pos * d;
  if constexpr (kNeox) {
    Vec<T, V> x = load<T, V>(src + off);
    Vec<T, V> y = load<T, V>(src + off + half);
    const Vec<float, V> c = load<float, V>(row_cs + off);
    const Vec<float, V> s = load<float, V>(row_cs + half + off);
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      const float2 a = to_f2(*reinterpret_cast<const T2*>(&x.v[j]));
      const float2 b = to_f2(*reinterpret_cast<const T2*>(&y.v[j]));
      *reinterpret_cast<T2*>(&x.v[j]) = from_f2<T2>(rot_x(a.x, b.x, c.v[j], s.v[j]), rot_x(a.y, b.y, c.v[j + 1], s.v[j + 1]));
      *reinterpret_cast<T2*>(&y.v[j]) = from_f2<T2>(rot_y(a.x, b.x, c.v[j], s.v[j]), rot_y(a.y, b.y, c.v[j + 1], s.v[j + 1]));
    }
    store<T, V>(base + off, x);
    store<T, V>(base + off + half, y);
    if (!is_q) {
      T* dst = kc + slot * row_elems + static_cast<int64_t>(hh) * d + off;
      store<T, V>(dst, x);
      store<T, V>(dst + half, y);
    }
  } else {
    constexpr int P = V / 2;
    Vec<T, V> x = load<T, V>(src + off);
    const Vec<float, P> c = load<float, P>(row_cs + off / 2);
    const Vec<float, P> s = load<float, P>(row_cs + half + off / 2);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float2 a = to_f2(*reinterpret_cast<const T2*>(&x.v[2 * j]));
      *reinterpret_cast<T2*>(&x.v[2 * j]) = from_f2<T2>(rot_x(a.x, a.y, c.v[j], s.v[j]), rot_y(a.x, a.y, c.v[j], s.v[j]));
    }
    store<T, V>(base + off, x);
    if (!is_q) store<T, V>(kc + slot * row_elems + static_cast<int64_t>(hh) * d + off, x);
  }
}

template <typename T, int V, bool kNeox>
cudaError_t launch(const void* q, void* qo, void* k, const void* v, void* kc, void* vc, const void* cache,
                   const void* pos, const void* loc, uint32_t t, uint32_t hq, uint32_t hk, int64_t qs, int64_t qos,
                   int64_t ks, int64_t vs, int d, cudaStream_t stream) {
  const uint32_t lanes = static_cast<uint32_t>(kNeox ? d / 2 / V : d / V);
  const uint64_t total = static_cast<uint64_t>(t) * (hq + 2 * hk) * lanes;
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
  return cudaLaunchKernelEx(&cfg, rope_store_kernel<T, V, kNeox>, static_cast<const T*>(q), static_cast<T*>(qo),
                            static_cast<T*>(k), static_cast<const T*>(v), static_cast<T*>(kc), static_cast<T*>(vc),
                            static_cast<const float*>(cache), static_cast<const int64_t*>(pos),
                            static_cast<const int64_t*>(loc), static_cast<uint32_t>(total), lanes, hq, hk, qs, qos,
                            ks, vs, d);
}

template <typename T, bool kNeox>
cudaError_t by_vec(int vec, const void* q, void* qo, void* k, const void* v, void* kc, void* vc, const void* c,
                   const void* p, const void* l, uint32_t t, uint32_t hq, uint32_t hk, int64_t qs, int64_t qos,
                   int64_t ks, int64_t vs, int d, cudaStream_t s) {
  switch (vec) {
    case 8: return launch<T, 8, kNeox>(q, qo, k, v, kc, vc, c, p, l, t, hq, hk, qs, qos, ks, vs, d, s);
    case 4: return launch<T, 4, kNeox>(q, qo, k, v, kc, vc, c, p, l, t, hq, hk, qs, qos, ks, vs, d, s);
    default: return launch<T, 2, kNeox>(q, qo, k, v, kc, vc, c, p, l, t, hq, hk, qs, qos, ks, vs, d, s);
  }
}

template <typename T>
cudaError_t run(const void* q, void* qo, void* k, const void* v, void* kc, void* vc, const void* cache,
                const void* pos, const void* loc, int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t qs,
                int64_t qos, int64_t ks, int64_t vs, int64_t neox, cudaStream_t s) {
  if (t == 0) return cudaSuccess;
  if (t < 0 || hq < 0 || hk <= 0 || d <= 0 || d % 4 || qs < hq * d || qos < hq * d || ks < hk * d || vs < hk * d ||
      t > 0x7fffffffLL || hq + 2 * hk > 0x7fffffffLL)
    return cudaErrorInvalidValue;
  const int64_t span = neox ? d / 2 : d;  // elements the threads of one head tile
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(qo) |
                         reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
                         reinterpret_cast<uintptr_t>(kc) | reinterpret_cast<uintptr_t>(vc) |
                         static_cast<uintptr_t>((qs | qos | ks | vs | d | span) * 2);
  const uintptr_t cbits = reinterpret_cast<uintptr_t>(cache) | static_cast<uintptr_t>(d * 2);  // sin: d/2 floats
  int vec = 2;
  if (bits % 16 == 0 && span % 8 == 0 && cbits % (neox ? 32 : 16) == 0) vec = 8;
  else if (bits % 8 == 0 && span % 4 == 0 && cbits % (neox ? 16 : 8) == 0) vec = 4;
  if (bits % 4 || cbits % 8) return cudaErrorMisalignedAddress;
  const uint32_t T32 = static_cast<uint32_t>(t), Q = static_cast<uint32_t>(hq), K = static_cast<uint32_t>(hk);
  const int di = static_cast<int>(d);
  return neox ? by_vec<T, true>(vec, q, qo, k, v, kc, vc, cache, pos, loc, T32, Q, K, qs, qos, ks, vs, di, s)
              : by_vec<T, false>(vec, q, qo, k, v, kc, vc, cache, pos, loc, T32, Q, K, qs, qos, ks, vs, di, s);
}

}  // namespace
}  // namespace astra_drs

extern "C" cudaError_t astra_dense_rope_store(const void* q, void* q_out, void* k, const void* v, void* k_cache,
                                              void* v_cache, const void* cos_sin_cache, const void* positions,
                                              const void* out_loc, int64_t num_tokens, int64_t num_q_heads,
                                              int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                                              int64_t k_stride, int64_t v_stride, int64_t q_out_stride,
                                              int64_t is_neox, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 1: return astra_drs::run<__half>(q, q_out, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc,
                                          num_tokens, num_q_heads, num_kv_heads, head_dim, q_stride, q_out_stride,
                                          k_stride, v_stride, is_neox, stream);
    case 2: return astra_drs::run<__nv_bfloat16>(q, q_out, k, v, k_cache, v_cache, cos_sin_cache, positions,
                                                 out_loc, num_tokens, num_q_heads, num_kv_heads, head_dim, q_stride,
                                                 q_out_stride, k_stride, v_stride, is_neox, stream);
    default: return cudaErrorInvalidValue;
  }
}
