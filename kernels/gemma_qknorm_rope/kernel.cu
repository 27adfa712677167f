// astra-sglang optimized gemma_qknorm_rope (a FUSED op): Gemma-3's per-head q/k norm, x / rms(x) * (1 + w), then
// its rotary embedding by the step's cos/sin rows, in one launch: k in place on the qkv output, q from the qkv output
// into its own buffer q_out (or in place, q_out = q).
// It replaces what SGLang 0.5.17 runs on CUDA in Gemma3Attention.forward_native: Gemma3RMSNorm.forward_native on the
// 4-D q and k views (torch ops: a copy to fp32, pow, mean, add, rsqrt, two multiplies, the weight's 1 + w, a copy
// back: about eight kernels each) and apply_rotary_pos_emb (a torch.compile'd function, two Triton kernels), about
// twenty launches a layer:
//   q_out[t,h] <- rope(round(q[t,h] * rsqrt(mean(q[t,h]^2) + eps) * (1 + q_weight)), cos[t], sin[t])
//   k[t,h] <- likewise with k_weight
//   rope(x)[i] = x[i] cos[i] - x[i + D/2] sin[i]   (i < D/2),   x[i] cos[i] + x[i - D/2] sin[i]   (i >= D/2)
// (rotate_half: NeoX halves, the only form apply_rotary_pos_emb has.) q/k/q_out: token rows q_stride / k_stride /
// q_out_stride elements apart, heads head_dim apart; cos/sin: [num_tokens, head_dim] rows of the storage dtype, as
// Gemma3RotaryEmbedding returns them (cos.to(x.dtype)).
// Why q_out: q is a column block of the qkv output (rows 8192 elements apart on Gemma-3-12B); handed to the attention
// as that strided view, SGLang 0.5.17's fa3 backend copies it (q.contiguous()), one more kernel a layer from batch 2
// on. The patch passes a contiguous [num_tokens, num_q_heads * head_dim] q_out instead (RESULTS.md). q_out may be q
// itself with q_out_stride = q_stride (in place, the adapter's ASTRA_GQKR_Q_OUT=0 arm): each element is read and
// written by the same lane, the whole row read before any of it is written; any other overlap of q and q_out is the
// caller's error.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_gemma_qknorm_rope(const void* q, void* q_out, void* k, const void* q_weight,
//         const void* k_weight, const void* cos, const void* sin, int64_t num_tokens, int64_t num_q_heads,
//         int64_t num_kv_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride, int64_t q_out_stride,
//         double eps, int dtype, cudaStream_t stream)
// dtype: 1 fp16, 2 bf16. head_dim: 64, 128 or 256. Launches on `stream` only; no allocation, no host sync;
// capturable.
//
// Design (kernels/qknorm_rope/kernel.cu's, with Gemma's weight and cos/sin rows instead of a cache and positions):
//  * One warp per (token, head) work item over the q heads and then the k heads of every token, token major.
//  * Bit-identical to production: each lane holds the elements, and adds their squares in the order, that torch's
//    reduce kernel gives one thread for the norm's mean (head_dim 256: 4 elements at 4t and 4 at 128 + 4t, each as
//    one 8-byte access; see Layout), then a full-warp xor-shuffle in torch's warp order. Where a lane holds both
//    halves, the NeoX partner of element i (i +- D/2) is in the same lane; otherwise in lane ^ 16.
//  * fp32 math rounded as production rounds: the normed value to the storage dtype (production's norm returns it
//    so, type_as(x)), then the rotation in fp32 and one rounding at the store.
//  * 4 warps per block, as many blocks as work items need up to a full wave of resident blocks; a grid-stride loop
//    over the rest (prefill).
//  * Narrower accesses (4-byte pairs) when a pointer or a stride does not allow the wide ones.
//  * PDL on sm_90+: the weights (model constants) load before griddepcontrol.wait; q, k and the cos/sin rows (the
//    step's, written by an earlier kernel) only after it; dependents released right after the wait, as the other
//    shipped kernels do.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace astra_gqkr {
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
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

template <int BYTES> struct Raw;
template <> struct Raw<16> { using type = uint4; };
template <> struct Raw<8> { using type = uint2; };
template <> struct Raw<4> { using type = unsigned int; };

// G elements of T at p into fp32: one G*sizeof(T)-byte access (kWide), G/2 four-byte ones, or one element (G 1).
template <typename T, int G, bool kWide>
__device__ __forceinline__ void load_f(const T* p, float* f) {
  using T2 = typename Pair<T>::type;
  if constexpr (G == 1) {
    f[0] = to_f(*p);
  } else if constexpr (kWide) {
    using R = typename Raw<G * sizeof(T)>::type;
    const R r = *reinterpret_cast<const R*>(p);
    const T2* h = reinterpret_cast<const T2*>(&r);
#pragma unroll
    for (int j = 0; j < G / 2; ++j) {
      const float2 a = to_f2(h[j]);
      f[2 * j] = a.x;
      f[2 * j + 1] = a.y;
    }
  } else {
    const T2* h = reinterpret_cast<const T2*>(p);
#pragma unroll
    for (int j = 0; j < G / 2; ++j) {
      const float2 a = to_f2(h[j]);
      f[2 * j] = a.x;
      f[2 * j + 1] = a.y;
    }
  }
}

// G fp32 values rounded once to T, stored as one access (kWide), G/2 four-byte ones, or one element (G 1).
template <typename T, int G>
struct alignas(G * sizeof(T)) Packed {
  typename Pair<T>::type h[G / 2];
};
template <typename T, int G, bool kWide>
__device__ __forceinline__ void store_f(T* p, const float* f) {
  using T2 = typename Pair<T>::type;
  if constexpr (G == 1) {
    *p = from_f<T>(f[0]);
  } else {
    Packed<T, G> x;
#pragma unroll
    for (int j = 0; j < G / 2; ++j) x.h[j] = from_f2<T2>(f[2 * j], f[2 * j + 1]);
    if constexpr (kWide) {
      using R = typename Raw<G * sizeof(T)>::type;
      *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(&x);
    } else {
      T2* d = reinterpret_cast<T2*>(p);
#pragma unroll
      for (int j = 0; j < G / 2; ++j) d[j] = x.h[j];
    }
  }
}

// the value production's norm returns (type_as(x)): rounded to the storage dtype
template <typename T> __device__ __forceinline__ float stored(float v) { return to_f(from_f<T>(v)); }

// Where a lane's elements sit in a head row, chosen so that the lane's partial sum of squares is the one torch's
// reduce kernel (ATen/native/cuda/Reduce.cuh, torch 2.11) forms for x.pow(2).mean(-1) over the same row: CH chunks of G
// elements, chunk c at c * D/2 + lane * G.
//   D 256: torch reads 4-float vectors; lane t holds elements 4t.. and 128 + 4t..   (CH 2, G 4)
//   D 128: torch reads 4-float vectors, one a thread; lane t holds 4t..             (CH 1, G 4)
//   D 64:  torch reads single floats t and t + 32 in thread t                        (CH 2, G 1)
// With CH 2 the NeoX partner of an element (i +- D/2) is the same position of the lane's other chunk; with CH 1 it is
// in lane ^ 16.
template <int D> struct Layout {
  static constexpr int G = D == 64 ? 1 : 4;
  static constexpr int CH = D == 128 ? 1 : 2;
  static constexpr int V = G * CH;
  static_assert(CH * 32 * G == D, "head_dim must be 64, 128 or 256");
};

// The lane's share of sum(x^2), added in torch's order (no contraction into fma: torch squares, then adds).
// `narrow`: the norm call has at least 16 rows (heads x tokens), so torch gives each row a 32-thread block row;
// with fewer, 64 threads (D 256 only differs): thread t + 32 adds its chunk's sum after thread t's.
template <int D>
__device__ __forceinline__ float lane_sum_sq(const float* x, bool narrow) {
  using L = Layout<D>;
  float a[L::V];
#pragma unroll
  for (int j = 0; j < L::V; ++j) a[j] = __fmul_rn(x[j], x[j]);
  if constexpr (L::CH == 1) {  // one vector: its four accumulators combined in order
    return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), a[2]), a[3]);
  } else if constexpr (L::G == 1) {  // two scalars (D 64, either block width)
    return __fadd_rn(a[0], a[1]);
  } else if (narrow) {  // one thread reads both vectors into four accumulators, then combines them in order
    float s[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) s[g] = __fadd_rn(a[g], a[4 + g]);
    return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[1]), s[2]), s[3]);
  } else {  // a thread a vector; thread t + 32's total joins thread t's through shared memory
    const float lo = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), a[2]), a[3]);
    const float hi = __fadd_rn(__fadd_rn(__fadd_rn(a[4], a[5]), a[6]), a[7]);
    return __fadd_rn(lo, hi);
  }
}

// Work item w: token w / heads, head w % heads, heads = hq + hk (q heads, then k heads).
template <typename T, int D, bool kWide>
__global__ void __launch_bounds__(kThreads) gemma_qknorm_rope_kernel(
    // q and q_out without __restrict__: they may be one buffer (in place), so no read-only (non-coherent) loads of q
    const T* q, T* q_out, T* __restrict__ k, const T* __restrict__ qw, const T* __restrict__ kw,
    const T* __restrict__ cos, const T* __restrict__ sin, uint32_t total, uint32_t heads, uint32_t hq, int64_t qs,
    int64_t ks, int64_t qos, float eps, bool q_narrow, bool k_narrow) {
  using L = Layout<D>;
  constexpr int G = L::G, CH = L::CH, V = L::V;

  const int lane = static_cast<int>(threadIdx.x & 31);
  const bool lo = lane < 16;  // with CH 1: lanes 0-15 hold the first half of a head, 16-31 the second
  const uint32_t warps = gridDim.x * kWarps;
  uint32_t item = blockIdx.x * kWarps + (threadIdx.x >> 5);

  // the weights are model constants: load them (as 1 + w, production's fp32 math) while the upstream kernel ends
  float wq[V], wk[V];
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    load_f<T, G, kWide>(qw + c * (D / 2) + lane * G, wq + c * G);
    load_f<T, G, kWide>(kw + c * (D / 2) + lane * G, wk + c * G);
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    wq[j] = __fadd_rn(1.0f, wq[j]);
    wk[j] = __fadd_rn(1.0f, wk[j]);
  }

  pdl_wait();
  pdl_trigger();

  for (; item < total; item += warps) {  // warp-uniform: every lane of a warp takes the same path
    const uint32_t t = item / heads;
    const uint32_t h = item - t * heads;
    const bool is_q = h < hq;
    const uint32_t hh = is_q ? h : h - hq;
    // the head's row read from `row`, written to `dst`: q's into q_out, k's in place
    const int64_t head = static_cast<int64_t>(hh) * D;
    const T* row = is_q ? q + static_cast<int64_t>(t) * qs + head : k + static_cast<int64_t>(t) * ks + head;
    T* dst = is_q ? q_out + static_cast<int64_t>(t) * qos + head : k + static_cast<int64_t>(t) * ks + head;
    const T* cr = cos + static_cast<int64_t>(t) * D;
    const T* sr = sin + static_cast<int64_t>(t) * D;
    float x[V], c[V], s[V];
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) {
      const int at = ch * (D / 2) + lane * G;
      load_f<T, G, kWide>(row + at, x + ch * G);
      load_f<T, G, kWide>(cr + at, c + ch * G);
      load_f<T, G, kWide>(sr + at, s + ch * G);
    }

    // the norm over the head: torch's mean of x.float()^2, summed in its order; its warp step halves the offset
    // each round (shfl_down 16, 8, .., 1), which a xor butterfly in the same order reproduces in every lane
    float ss = lane_sum_sq<D>(x, is_q ? q_narrow : k_narrow);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(kFull, ss, m));
    const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, 1.0f / D), eps));  // mean: the sum times 1/D, exact for 2^k
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = stored<T>(__fmul_rn(__fmul_rn(x[j], r), is_q ? wq[j] : wk[j]));

    // x cos + rotate_half(x) sin, rotate_half(x) = (-second half, first half)
    float o[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float p;
      bool first;  // element j is in the head's first half
      if constexpr (CH == 2) {
        p = x[(j + G) % V];
        first = j < G;
      } else {
        p = __shfl_xor_sync(kFull, x[j], 16);
        first = lo;
      }
      o[j] = fmaf(x[j], c[j], __fmul_rn(first ? -p : p, s[j]));
    }
#pragma unroll
    for (int ch = 0; ch < CH; ++ch) store_f<T, G, kWide>(dst + ch * (D / 2) + lane * G, o + ch * G);
  }
}

uint32_t sm_count() {
  static int n = 0;  // one device per serving process
  if (n == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (n <= 0) n = 1;
  }
  return static_cast<uint32_t>(n);
}

template <typename T, int D, bool kWide>
cudaError_t launch(const void* q, void* qo, void* k, const void* qw, const void* kw, const void* cos,
                   const void* sin, uint32_t total, uint32_t heads, uint32_t hq, int64_t qs, int64_t ks, int64_t qos,
                   float eps, bool qn, bool kn, cudaStream_t stream) {
  constexpr auto kernel = gemma_qknorm_rope_kernel<T, D, kWide>;
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
                            static_cast<const T*>(qw), static_cast<const T*>(kw), static_cast<const T*>(cos),
                            static_cast<const T*>(sin), total, heads, hq, qs, ks, qos, eps, qn, kn);
}

template <typename T, int D>
cudaError_t by_width(bool wide, const void* q, void* qo, void* k, const void* qw, const void* kw, const void* c,
                     const void* s, uint32_t total, uint32_t heads, uint32_t hq, int64_t qs, int64_t ks, int64_t qos,
                     float eps, bool qn, bool kn, cudaStream_t st) {
  return wide ? launch<T, D, true>(q, qo, k, qw, kw, c, s, total, heads, hq, qs, ks, qos, eps, qn, kn, st)
              : launch<T, D, false>(q, qo, k, qw, kw, c, s, total, heads, hq, qs, ks, qos, eps, qn, kn, st);
}

template <typename T>
cudaError_t run(const void* q, void* qo, void* k, const void* qw, const void* kw, const void* cos, const void* sin,
                int64_t t, int64_t hq, int64_t hk, int64_t d, int64_t qs, int64_t ks, int64_t qos, float eps,
                cudaStream_t st) {
  if (t == 0) return cudaSuccess;
  if (t < 0 || hq < 0 || hk <= 0 || qs < hq * d || ks < hk * d || qos < hq * d) return cudaErrorInvalidValue;
  if (d != 64 && d != 128 && d != 256) return cudaErrorInvalidValue;
  const int64_t total = t * (hq + hk);
  if (total > 0x7fffffffLL) return cudaErrorInvalidValue;  // item + grid warps stays below 2^32
  // widest access every pointer and row stride allows: a lane's chunk of 4 elements as one access; else pairs
  // (head_dim 64 reads single elements)
  const uintptr_t lane_bytes = 8;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(qo) |
                         reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(qw) |
                         reinterpret_cast<uintptr_t>(kw) | reinterpret_cast<uintptr_t>(cos) |
                         reinterpret_cast<uintptr_t>(sin) | static_cast<uintptr_t>((qs | ks | qos) * 2);
  if (bits % 4) return cudaErrorMisalignedAddress;
  const bool wide = bits % lane_bytes == 0;
  const uint32_t N = static_cast<uint32_t>(total), H = static_cast<uint32_t>(hq + hk);
  const uint32_t Q = static_cast<uint32_t>(hq);
  // head_dim 256: torch's reduce gives a norm call of 16 rows or more 32 threads a row, fewer rows 64 (Reduce.cuh
  // set_block_dimension: 512 threads, at most 16 rows a block; head_dim 128 always gets 32 and 64 sums alike either
  // way); q's call has tokens x q heads rows, k's tokens x kv
  const bool qn = t * hq >= 16, kn = t * hk >= 16;
  switch (d) {
    case 64: return by_width<T, 64>(wide, q, qo, k, qw, kw, cos, sin, N, H, Q, qs, ks, qos, eps, qn, kn, st);
    case 128: return by_width<T, 128>(wide, q, qo, k, qw, kw, cos, sin, N, H, Q, qs, ks, qos, eps, qn, kn, st);
    default: return by_width<T, 256>(wide, q, qo, k, qw, kw, cos, sin, N, H, Q, qs, ks, qos, eps, qn, kn, st);
  }
}

}  // namespace
}  // namespace astra_gqkr

extern "C" cudaError_t astra_gemma_qknorm_rope(const void* q, void* q_out, void* k, const void* q_weight,
                                               const void* k_weight, const void* cos, const void* sin,
                                               int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads,
                                               int64_t head_dim, int64_t q_stride, int64_t k_stride,
                                               int64_t q_out_stride, double eps, int dtype, cudaStream_t stream) {
  const float e = static_cast<float>(eps);
  switch (dtype) {
    case 1: return astra_gqkr::run<__half>(q, q_out, k, q_weight, k_weight, cos, sin, num_tokens, num_q_heads,
                                          num_kv_heads, head_dim, q_stride, k_stride, q_out_stride, e, stream);
    case 2: return astra_gqkr::run<__nv_bfloat16>(q, q_out, k, q_weight, k_weight, cos, sin, num_tokens,
                                                 num_q_heads, num_kv_heads, head_dim, q_stride, k_stride,
                                                 q_out_stride, e, stream);
    default: return cudaErrorInvalidValue;
  }
}
