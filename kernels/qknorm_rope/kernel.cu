// astra-sglang optimized qknorm_rope (a FUSED op): Qwen3's per-head q/k RMSNorm, then rotary embedding (rope_dim =
// head_dim), in one launch: k in place, q into its own buffer q_out (or in place, q_out = q). Dense Qwen3 attention;
// the KV store comes later (attention).
// It replaces SGLang's JIT q/k norm (qknorm.cuh) followed by its JIT rope (rope.cuh FusedRopeKernel::run):
//   q_out[t,h] <- rotate(rmsnorm(q[t,h]) * q_weight, cos_sin_cache[positions[t]])    NeoX (halves) or GPT-J (pairs)
//   k[t,h] <- rotate(rmsnorm(k[t,h]) * k_weight, ...)
// rmsnorm(x) = x * rsqrt(mean(x^2) + eps). q/k/q_out: token rows q_stride / k_stride / q_out_stride elements apart,
// heads head_dim apart.
// Why q_out: q is a column block of the qkv output (rows q_size + 2 kv_size apart); handed to the attention as that
// strided view, SGLang 0.5.17's fa3 backend copies it (q.contiguous()), one more kernel a layer from batch 2 on. The
// patch passes a contiguous [num_tokens, num_q_heads * head_dim] q_out instead (RESULTS.md). q_out may be q itself
// with q_out_stride = q_stride (in place, the adapter's ASTRA_QKR_Q_OUT=0 arm): one warp reads a head row whole (its
// lanes shuffle the loaded values) before any lane writes it, and no other warp touches that row; any other overlap
// of q and q_out is the caller's error.
// (kernels/qknorm_rope_store/kernel.cu is the same design with the KV store: this file is it without the v items
// and the cache stores.)
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_qknorm_rope(const void* q, void* q_out, void* k, const void* q_weight,
//         const void* k_weight, const void* cos_sin_cache, const void* positions, int64_t num_tokens,
//         int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride,
//         int64_t q_out_stride, int64_t is_neox, double eps, int dtype, cudaStream_t stream)
// positions: int64. dtype: 1 fp16, 2 bf16. head_dim: 64, 128 or 256. Launches on `stream` only; no allocation, no
// host sync; capturable.
//
// Design (decode latency first: 1-64 tokens dominate):
//  * One warp per (token, head) work item over the q heads and the k heads of every token, token major (the warps
//    of a block share a token's position and cos/sin row in L1). Each item is normed and rotated: k in place, q
//    into q_out.
//  * Each lane holds head_dim/32 contiguous elements as one vector access (bf16 head_dim 128: 4 elements, 8
//    bytes), so a head row is one coalesced warp access; the sum of squares is a full-warp xor-shuffle.
//    NeoX: element i pairs with i + D/2, which is lane ^ 16 for every head_dim (D/2 elements = 16 lanes), one
//    __shfl_xor_sync per element. GPT-J: the pairs sit inside the lane's vector.
//  * fp32 math, rounded as production rounds: the normed value to the storage dtype (production's two kernels
//    store it between them; ASTRA_QKN_ROUND), then the rotation with production's fma contraction (ASTRA_ROPE_X/Y)
//    and one rounding at the store.
//  * 4 warps per block, as many blocks as work items need up to a full wave of resident blocks; a grid-stride
//    loop over the rest (prefill).
//  * Narrower accesses (4-byte pairs, scalar cos/sin) when a pointer or a stride does not allow the wide ones.
//  * PDL on sm_90+: the weights (constants, not produced upstream) load before griddepcontrol.wait; q, k,
//    positions and cos/sin rows only after it; dependents released right after the wait (their own wait still
//    orders them after this grid's stores), as the other shipped kernels do.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

// Production runs the q/k norm and the rope as two kernels: the normed value is rounded to the storage dtype between
// them. ASTRA_QKN_ROUND 1 rounds it here too, so the output is bit-identical to SGLang's and greedy tokens cannot
// drift from it (Gemma-2's did while dense_rope_store computed otherwise); 0 keeps it in fp32 (one rounding, as
// before 2026-11-27).
#ifndef ASTRA_QKN_ROUND
#define ASTRA_QKN_ROUND 1
#endif
// How the rotation's two products meet, spelled out as in dense_rope_store (X=1 Y=2: bit-identical to SGLang's rope
// on an H200, results/2026-11-27-h200/session8 call D). x' = x c - y s: 0 as written (the compiler contracts),
// 1 fma(x, c, -(y s)), 2 fma(-y, s, x c), 3 no fma. y' = x s + y c: 0 as written, 1 fma(x, s, y c), 2 fma(y, c, x s),
// 3 no fma.
#ifndef ASTRA_ROPE_X
#define ASTRA_ROPE_X 1
#endif
#ifndef ASTRA_ROPE_Y
#define ASTRA_ROPE_Y 2
#endif

namespace astra_qkr {
// internal linkage: no GNU-unique statics shared with another loaded build of this file
namespace {

constexpr int kWarps = 4;  // warps (work items in flight) per block
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

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

// N elements of T (N even) at p into fp32: one N*sizeof(T)-byte access (kWide) or N/2 four-byte ones.
template <typename T, int N, bool kWide>
__device__ __forceinline__ void load_f(const T* p, float (&f)[N]) {
  using T2 = typename Pair<T>::type;
  if constexpr (kWide) {
    using R = typename Raw<N * sizeof(T)>::type;
    const R r = *reinterpret_cast<const R*>(p);
    const T2* h = reinterpret_cast<const T2*>(&r);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const float2 a = to_f2(h[j]);
      f[2 * j] = a.x;
      f[2 * j + 1] = a.y;
    }
  } else {
    const T2* h = reinterpret_cast<const T2*>(p);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const float2 a = to_f2(h[j]);
      f[2 * j] = a.x;
      f[2 * j + 1] = a.y;
    }
  }
}

// N fp32 values rounded once to T (pairs in one aligned register vector), stored as one access (kWide) or N/2
// four-byte ones.
template <typename T, int N>
struct alignas(N * sizeof(T)) Packed {
  typename Pair<T>::type h[N / 2];
};
template <typename T, int N>
__device__ __forceinline__ Packed<T, N> pack(const float (&f)[N]) {
  using T2 = typename Pair<T>::type;
  Packed<T, N> out;
#pragma unroll
  for (int j = 0; j < N / 2; ++j) out.h[j] = from_f2<T2>(f[2 * j], f[2 * j + 1]);
  return out;
}
template <typename T, int N, bool kWide>
__device__ __forceinline__ void store_h(T* p, const Packed<T, N>& x) {
  using T2 = typename Pair<T>::type;
  if constexpr (kWide) {
    using R = typename Raw<N * sizeof(T)>::type;
    *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(&x);
  } else {
    T2* d = reinterpret_cast<T2*>(p);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) d[j] = x.h[j];
  }
}

// N fp32 values: 8- or 16-byte accesses (kWide, 4 * N-byte aligned up to 16) or scalar ones.
template <int N, bool kWide>
__device__ __forceinline__ void load_cs(const float* p, float (&f)[N]) {
  if constexpr (kWide && N == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    f[0] = a.x;
    f[1] = a.y;
  } else if constexpr (kWide && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 a = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = a.x;
      f[4 * i + 1] = a.y;
      f[4 * i + 2] = a.z;
      f[4 * i + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = p[i];
  }
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
// the value production's first kernel stores (ASTRA_QKN_ROUND)
template <typename T> __device__ __forceinline__ float stored(float v);
template <> __device__ __forceinline__ float stored<__half>(float v) {
  return ASTRA_QKN_ROUND ? __half2float(__float2half_rn(v)) : v;
}
template <> __device__ __forceinline__ float stored<__nv_bfloat16>(float v) {
  return ASTRA_QKN_ROUND ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// D: head_dim, V = D / 32 elements per lane. Work item w: token w / heads, head w % heads, heads = hq + hk
// (q heads, then k heads).
template <typename T, int D, bool kNeox, bool kWide>
__global__ void __launch_bounds__(kThreads) qknorm_rope_kernel(
    // q and q_out without __restrict__: they may be one buffer (in place), so no read-only (non-coherent) loads of q
    const T* q, T* qo, T* __restrict__ k, const T* __restrict__ qw, const T* __restrict__ kw,
    const float* __restrict__ cache, const int64_t* __restrict__ positions, uint32_t total, uint32_t heads,
    uint32_t hq, int64_t qs, int64_t ks, int64_t qos, float eps) {
  constexpr int V = D / 32;
  constexpr int kHalf = D / 2;
  static_assert(V >= 2 && V % 2 == 0 && V * 32 == D, "head_dim must be 32 lanes of whole pairs");

  const int lane = static_cast<int>(threadIdx.x & 31);
  const int off = lane * V;  // this lane's first element in a head row
  const uint32_t warps = gridDim.x * kWarps;
  uint32_t item = blockIdx.x * kWarps + (threadIdx.x >> 5);

  // the weights are model constants: load them while the upstream kernel finishes
  float wq[V], wk[V];
  load_f<T, V, kWide>(qw + off, wq);
  load_f<T, V, kWide>(kw + off, wk);

  pdl_wait();
  pdl_trigger();

  // cos/sin columns this lane rotates with: NeoX the lane's elements (lanes 16-31 mirror 0-15), GPT-J its pairs
  constexpr int NC = kNeox ? V : V / 2;
  const int cs_off = kNeox ? (lane & 15) * V : lane * (V / 2);

  for (; item < total; item += warps) {  // warp-uniform: every lane of a warp takes the same path
    const uint32_t t = item / heads;
    const uint32_t h = item - t * heads;
    const bool is_q = h < hq;
    const uint32_t hh = is_q ? h : h - hq;
    // the head's row read from `row`, written to `dst`: q's into q_out, k's in place
    const int64_t head = static_cast<int64_t>(hh) * D;
    const T* row = is_q ? q + static_cast<int64_t>(t) * qs + head : k + static_cast<int64_t>(t) * ks + head;
    T* dst = is_q ? qo + static_cast<int64_t>(t) * qos + head : k + static_cast<int64_t>(t) * ks + head;
    const int64_t pos = positions[t];
    float x[V];
    load_f<T, V, kWide>(row + off, x);
    float c[NC], s[NC];
    const float* cs_row = cache + pos * D;
    load_cs<NC, kWide>(cs_row + cs_off, c);
    load_cs<NC, kWide>(cs_row + kHalf + cs_off, s);

    // RMSNorm over the head: sum of squares across the warp, fp32 as production
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) ss += x[j] * x[j];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(kFull, ss, m);
    const float r = rsqrtf(ss / D + eps);
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = stored<T>(x[j] * r * (is_q ? wq[j] : wk[j]));

    // rotation, still in fp32
    float o[V];
    if constexpr (kNeox) {
      const bool lo = lane < 16;  // lanes 0-15 hold the x half, 16-31 the y half of the same columns
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float p = __shfl_xor_sync(kFull, x[j], 16);
        o[j] = lo ? rot_x(x[j], p, c[j], s[j]) : rot_y(p, x[j], c[j], s[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < V / 2; ++j) {
        const float a = x[2 * j], b = x[2 * j + 1];
        o[2 * j] = rot_x(a, b, c[j], s[j]);
        o[2 * j + 1] = rot_y(a, b, c[j], s[j]);
      }
    }
    store_h<T, V, kWide>(dst + off, pack<T, V>(o));
  }
}

uint32_t sm_count() {
  static int n = 0;  // one device per serving process; cached like SGLang caches it
  if (n == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (n <= 0) n = 1;
  }
  return static_cast<uint32_t>(n);
}

template <typename T, int D, bool kNeox, bool kWide>
cudaError_t launch(const void* q, void* qo, void* k, const void* qw, const void* kw, const void* cache,
                   const void* pos, uint32_t total, uint32_t heads, uint32_t hq, int64_t qs, int64_t ks, int64_t qos,
                   float eps, cudaStream_t stream) {
  constexpr auto kernel = qknorm_rope_kernel<T, D, kNeox, kWide>;
  static const uint32_t wave = [] {  // resident blocks of one full wave
    int b = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0);
    return static_cast<uint32_t>(b > 0 ? b : 1) * sm_count();
  }();
  const uint32_t need = (total + kWarps - 1) / kWarps;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(need < wave ? need : wave);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(q), static_cast<T*>(qo), static_cast<T*>(k),
                            static_cast<const T*>(qw), static_cast<const T*>(kw), static_cast<const float*>(cache),
                            static_cast<const int64_t*>(pos), total, heads, hq, qs, ks, qos, eps);
}

template <typename T, int D>
cudaError_t by_mode(bool neox, bool wide, const void* q, void* qo, void* k, const void* qw, const void* kw,
                    const void* c, const void* p, uint32_t total, uint32_t heads, uint32_t hq, int64_t qs, int64_t ks,
                    int64_t qos, float eps, cudaStream_t s) {
  if (neox) {
    return wide ? launch<T, D, true, true>(q, qo, k, qw, kw, c, p, total, heads, hq, qs, ks, qos, eps, s)
                : launch<T, D, true, false>(q, qo, k, qw, kw, c, p, total, heads, hq, qs, ks, qos, eps, s);
  }
  return wide ? launch<T, D, false, true>(q, qo, k, qw, kw, c, p, total, heads, hq, qs, ks, qos, eps, s)
              : launch<T, D, false, false>(q, qo, k, qw, kw, c, p, total, heads, hq, qs, ks, qos, eps, s);
}

template <typename T>
cudaError_t run(const void* q, void* qo, void* k, const void* qw, const void* kw, const void* cache, const void* pos,
                int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t qs, int64_t ks, int64_t qos, int64_t neox,
                float eps, cudaStream_t s) {
  if (t == 0) return cudaSuccess;
  if (t < 0 || hq < 0 || hk <= 0 || qs < hq * d || ks < hk * d || qos < hq * d) return cudaErrorInvalidValue;
  if (d != 64 && d != 128 && d != 256) return cudaErrorInvalidValue;
  const int64_t total = t * (hq + hk);
  if (total > 0x7fffffffLL) return cudaErrorInvalidValue;  // item + grid warps stays below 2^32
  // widest access every pointer and row stride allows: a lane's head_dim/32 elements as one access, its
  // cos/sin columns in 8- or 16-byte pieces; else 4-byte pairs and scalar cos/sin
  const int64_t lane_bytes = d / 32 * 2;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(qo) |
                         reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(qw) |
                         reinterpret_cast<uintptr_t>(kw) | static_cast<uintptr_t>((qs | ks | qos) * 2);
  if (bits % 4) return cudaErrorMisalignedAddress;  // SGLang's kernels need at least this too
  const int64_t cs_bytes = (neox ? d / 32 : d / 64) * 4;  // fp32 cos (and sin) columns per lane
  const uintptr_t cs_align = static_cast<uintptr_t>(cs_bytes < 16 ? cs_bytes : 16);
  const bool wide = bits % static_cast<uintptr_t>(lane_bytes) == 0 &&
                    (cs_align < 8 || reinterpret_cast<uintptr_t>(cache) % cs_align == 0);
  const uint32_t T32 = static_cast<uint32_t>(total), H = static_cast<uint32_t>(hq + hk);
  const uint32_t Q = static_cast<uint32_t>(hq);
  switch (d) {
    case 64: return by_mode<T, 64>(neox != 0, wide, q, qo, k, qw, kw, cache, pos, T32, H, Q, qs, ks, qos, eps, s);
    case 128: return by_mode<T, 128>(neox != 0, wide, q, qo, k, qw, kw, cache, pos, T32, H, Q, qs, ks, qos, eps, s);
    default: return by_mode<T, 256>(neox != 0, wide, q, qo, k, qw, kw, cache, pos, T32, H, Q, qs, ks, qos, eps, s);
  }
}

}  // namespace
}  // namespace astra_qkr

extern "C" cudaError_t astra_qknorm_rope(const void* q, void* q_out, void* k, const void* q_weight,
                                         const void* k_weight, const void* cos_sin_cache, const void* positions,
                                         int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                                         int64_t head_dim, int64_t q_stride, int64_t k_stride, int64_t q_out_stride,
                                         int64_t is_neox, double eps, int dtype, cudaStream_t stream) {
  const float e = static_cast<float>(eps);
  switch (dtype) {
    case 1: return astra_qkr::run<__half>(q, q_out, k, q_weight, k_weight, cos_sin_cache, positions, num_tokens,
                                         num_q_heads, num_kv_heads, head_dim, q_stride, k_stride, q_out_stride,
                                         is_neox, e, stream);
    case 2: return astra_qkr::run<__nv_bfloat16>(q, q_out, k, q_weight, k_weight, cos_sin_cache, positions,
                                                num_tokens, num_q_heads, num_kv_heads, head_dim, q_stride, k_stride,
                                                q_out_stride, is_neox, e, stream);
    default: return cudaErrorInvalidValue;
  }
}
