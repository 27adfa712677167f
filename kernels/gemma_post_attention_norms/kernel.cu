// astra-sglang fused gemma_post_attention_norms: a Gemma-2 / Gemma-3 decoder layer's post_attention_layernorm
// (GemmaRMSNorm / Gemma3RMSNorm without a residual: FlashInfer's GemmaRMSNorm) and pre_feedforward_layernorm (with
// the residual: GemmaFusedAddRMSNorm) in ONE launch, in place. Per row, x = float(input):
//   y = T(x * rsqrt(mean(x^2) + eps1) * (1 + weight1))       what the first kernel stores (rounded to T)
//   s = float(y) + float(residual);  residual = T(s)           (fp32 sum, as FlashInfer's fused add)
//   input = T(s * rsqrt(mean(s^2) + eps2) * (1 + weight2))      (the norm of the fp32 sum s, not of T(s))
// Gemma stores weight - 1; the 1 is added in fp32 (FlashInfer's weight_bias = 1). Both sums of squares are taken
// in FlashInfer's order, bit for bit (the shared row-plan block below, the same in the norm kernels): outputs equal
// production's two kernels (and kernels/gemma_rmsnorm + kernels/gemma_fused_add_rmsnorm) wherever they run.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_gemma_post_attention_norms(void* input, void* residual, const void* weight1,
//           const void* weight2, int64_t num_tokens, int64_t hidden, double eps1, double eps2, int dtype,
//           cudaStream_t stream)
// dtype: 1 fp16, 2 bf16 (0 fp32 also works).  Launches on `stream` only; no allocation, no host sync; capturable.
//
// Design: kernels/gemma_fused_add_rmsnorm/kernel.cu's (measurements in kernels/NOTES.md), both reductions in one CTA:
//  * Register-cached rows: each thread loads its K vectors of input and residual (and, for K <= 2, both weights) in
//    one batch, keeps x, then s, in registers and writes residual and the output straight from them: input and
//    residual are read once, the intermediate y never leaves the SM (production writes it and reads it back).
//  * Two reductions over the same slots: the first over x, the second over s, each in FlashInfer's order (slot
//    chains, warp butterflies, red1[] / red2[] and the cross-warp butterfly), one barrier each where a row spans
//    several warps. Rows of up to 2048 vectors (hidden <= 16384 in fp16 / bf16: every Gemma width) take this kernel.
//  * Wider rows (or rows the plan gives to a cluster): FlashInfer's own layout, one 1024-thread CTA per row, the row
//    kept in dynamic shared memory (d floats) across both norms: correct, FlashInfer's order, not tuned.
//  * Vector width W = widest (<= 16 bytes) dividing hidden and every pointer's alignment (FlashInfer: gcd(16 /
//    sizeof(T), hidden); the two agree on the aligned tensors SGLang passes).
//  * Programmatic dependent launch on sm_90+: every read and write behind griddepcontrol.wait; the dependents are
//    released right after it, and problems <= 8 MB warm L2 with their rows (the weights from the first CTA only).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
// 0: plain launch; 1: PDL, trigger after the stores; 2: PDL, L2 prefetch, trigger right after griddepcontrol.wait.
#define ASTRA_PDL 2
#endif
#ifndef ASTRA_ONE_MAX
// One vector per thread for rows of up to 1024 vectors at decode sizes (<= 256 tokens): the fused norms' setting.
#define ASTRA_ONE_MAX 1024u
#endif
#ifndef ASTRA_PF_MAX
#define ASTRA_PF_MAX (8u << 20)  // L2 prefetch before the PDL wait when input+residual fit in this
#endif

namespace astra_gpan {
// Internal linkage (see kernels/gemma_fused_add_rmsnorm/kernel.cu: per-library statics).
namespace {

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

// input/residual are read and written by this kernel: plain coherent loads; the weights through the read-only path.
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
// blockDim = (R, ROWS): R threads (a multiple of 32) per row, ROWS rows per CTA. Thread x holds K vectors (slots);
// each slot is one vector of one of FlashInfer's threads (its warp vw, this lane: thread t = 32*vw + lane, vector
// t + i*n_fi of round i), laid out by L (see row_plan; kernels/gemma_fused_add_rmsnorm/kernel.cu says more).
enum Layout { kOne = 0, kTwo = 1, kPacked = 2, kCluster = 3 };
template <int L> constexpr int kSlots = L == kOne ? 1 : L == kTwo ? 2 : 4;

template <int L>
__device__ __forceinline__ bool slot(int k, uint32_t warp, uint32_t wpr, uint32_t nv, uint32_t& vw, uint32_t& i) {
  vw = warp;
  i = 0;
  if constexpr (L == kTwo) {
    vw = uint32_t(k) * wpr + warp;  // FlashInfer's warps w and w + R/32
  } else if constexpr (L == kPacked) {
    // FlashInfer's warps of two rounds first (nd of them, both rounds in one slot pair), then those of one round
    const uint32_t nd = (nv - 1024u + 31u) >> 5, p = 4u * warp + uint32_t(k);
    if (p < 2u * nd) {
      vw = p >> 1;
      i = p & 1u;
      return i != 0;
    }
    vw = p - nd;  // >= 32 past the row: masked
  }
  return false;
}

// The sum of squares of v (this thread's slots of one row) in FlashInfer's order: one fma chain per FlashInfer
// thread (a run of slots), its warp's butterfly, the warp sums to rr[], then (several warps) one barrier and the
// cross-warp butterfly over rr[], zero padded to 32. Every thread of the CTA calls it (the barrier).
template <int L, int W>
__device__ __forceinline__ float row_sum_sq(const float (&v)[kSlots<L>][W], float* rr, uint32_t nred, uint32_t warp,
                                            uint32_t lane, uint32_t wpr, uint32_t nv) {
  constexpr int K = kSlots<L>;
  float s = 0.f, ss = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    uint32_t vw, i, vw1, i1;
    if (!slot<L>(k, warp, wpr, nv, vw, i)) s = 0.f;  // a FlashInfer thread's sum_sq starts
#pragma unroll
    for (int e = 0; e < W; ++e) s += v[k][e] * v[k][e];
    if (k + 1 == K || !slot<L>((k + 1) % K, warp, wpr, nv, vw1, i1)) {
      ss = warp_sum(s);  // ... and ends: its warp's butterfly, the warp sum to rr[]
      if (lane == 0 && vw < nred) rr[vw] = ss;
    }
  }
  if (nred > 1) {
    __syncthreads();
    ss = warp_sum(lane < nred ? rr[lane] : 0.f);  // FlashInfer's cross-warp butterfly, zero padded
  }
  return ss;
}

template <typename T, int W, int L>
__global__ void __launch_bounds__(kSlots<L> >= 4 ? 512 : 1024)
    gemma_post_attention_norms_kernel(T* __restrict__ input, T* __restrict__ residual, const T* __restrict__ weight1,
                                      const T* __restrict__ weight2, uint32_t tokens, uint32_t nv, uint32_t n_fi,
                                      float fd, float eps1, float eps2, int prefetch) {
  constexpr int K = kSlots<L>;
  __shared__ float red1[32], red2[32];
  const uint32_t R = blockDim.x, wpr = R >> 5;
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t warp = threadIdx.x >> 5;
  const uint32_t row = blockIdx.x * blockDim.y + threadIdx.y;
  const bool row_ok = row < tokens;
  const uint32_t nred = n_fi >> 5;  // FlashInfer's warps of this row
  const size_t roff = size_t(row) * nv * W;

  auto vec = [&](int k) {
    uint32_t vw, i;
    slot<L>(k, warp, wpr, nv, vw, i);
    return size_t(32u * vw + lane + i * n_fi);
  };
  bool ok[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    uint32_t vw, i;
    slot<L>(k, warp, wpr, nv, vw, i);
    ok[k] = row_ok && 32u * vw + lane < n_fi && vec(k) < nv;
  }
  constexpr bool kWLate = K >= 4;  // wide rows load each weight when it is needed (fewer live registers)
#if ASTRA_PDL >= 2
  if (prefetch) {
    const bool pf_w = threadIdx.y == 0 && blockIdx.x == 0;  // the weights: the first CTA only (L2 hot spot)
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (ok[k]) {
        prefetch_l2(input + roff + vec(k) * W);
        prefetch_l2(residual + roff + vec(k) * W);
        if (pf_w) {
          prefetch_l2(weight1 + vec(k) * W);
          prefetch_l2(weight2 + vec(k) * W);
        }
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
  Vec<T, W> a[K], b[K], w1[K], w2[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      a[k] = ld<T, W>(input + roff + vec(k) * W);
      b[k] = ld<T, W>(residual + roff + vec(k) * W);
      if constexpr (!kWLate) {
        w1[k] = ldg<T, W>(weight1 + vec(k) * W);
        w2[k] = ldg<T, W>(weight2 + vec(k) * W);
      }
    }
  }
  float x[K][W];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < W; ++e) x[k][e] = ok[k] ? to_f(a[k].v[e]) : 0.f;
  float* rr1 = red1 + threadIdx.y * nred;
  float* rr2 = red2 + threadIdx.y * nred;
  // post_attention_layernorm: y = T(x * rcp1 * (1 + w1)), then s = float(y) + float(residual) in place of x
  const float ss1 = row_sum_sq<L, W>(x, rr1, nred, warp, lane, wpr, nv);
  if constexpr (kWLate) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (ok[k]) w1[k] = ldg<T, W>(weight1 + vec(k) * W);
  }
  const float rcp1 = rsqrtf(ss1 / fd + eps1);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      Vec<T, W> r;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const T y = from_f<T>(x[k][e] * rcp1 * (1.f + to_f(w1[k].v[e])));
        const float v = to_f(y) + to_f(b[k].v[e]);
        x[k][e] = v;
        r.v[e] = from_f<T>(v);
      }
      st<T, W>(residual + roff + vec(k) * W, r);
    }
  }
  // pre_feedforward_layernorm (fused add): the norm of the fp32 sum s
  const float ss2 = row_sum_sq<L, W>(x, rr2, nred, warp, lane, wpr, nv);
  if constexpr (kWLate) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (ok[k]) w2[k] = ldg<T, W>(weight2 + vec(k) * W);
  }
  const float rcp2 = rsqrtf(ss2 / fd + eps2);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      Vec<T, W> o;
#pragma unroll
      for (int e = 0; e < W; ++e) o.v[e] = from_f<T>(x[k][e] * rcp2 * (1.f + to_f(w2[k].v[e])));
      st<T, W>(input + roff + vec(k) * W, o);
    }
  }
#if ASTRA_PDL == 1
  pdl_trigger();
#endif
}

// Rows the register kernel does not take (over 2048 vectors): FlashInfer's layout and sums, one 1024-thread CTA per
// row (thread t: vectors t, t + 1024, ...), the row in dynamic shared memory (d floats) across both norms. Every
// thread reads and rewrites only its own vectors, so no barrier is needed between the passes but the reductions'.
__device__ __forceinline__ float cta_sum_sq(float ss, float* red) {
  ss = warp_sum(ss);
  if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  return warp_sum(red[threadIdx.x & 31u]);  // 32 warps: FlashInfer's cross-warp butterfly
}

template <typename T, int W>
__global__ void __launch_bounds__(1024)
    gemma_post_attention_norms_smem_kernel(T* __restrict__ input, T* __restrict__ residual,
                                           const T* __restrict__ weight1, const T* __restrict__ weight2, uint32_t nv,
                                           float fd, float eps1, float eps2) {
  extern __shared__ float xs[];
  __shared__ float red1[32], red2[32];
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
      xs[v * W + i] = x;
    }
  }
  const float rcp1 = rsqrtf(cta_sum_sq(ss, red1) / fd + eps1);
  ss = 0.f;
  for (uint32_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, W> w = ldg<T, W>(weight1 + size_t(v) * W);
    const Vec<T, W> b = ld<T, W>(residual + roff + size_t(v) * W);
    Vec<T, W> r;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const T y = from_f<T>(xs[v * W + i] * rcp1 * (1.f + to_f(w.v[i])));
      const float s = to_f(y) + to_f(b.v[i]);
      ss += s * s;
      r.v[i] = from_f<T>(s);
      xs[v * W + i] = s;
    }
    st<T, W>(residual + roff + size_t(v) * W, r);
  }
  const float rcp2 = rsqrtf(cta_sum_sq(ss, red2) / fd + eps2);
  for (uint32_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, W> w = ldg<T, W>(weight2 + size_t(v) * W);
    Vec<T, W> o;
#pragma unroll
    for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(xs[v * W + i] * rcp2 * (1.f + to_f(w.v[i])));
    st<T, W>(input + roff + size_t(v) * W, o);
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
inline cudaError_t launch(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// ---- row plan (tests/test_norm_reduction_order.py compiles this part on the host; same in the 4 norms)
// The sum of squares in FlashInfer's order, bit for bit: outputs equal SGLang's, so greedy tokens match.
// norm.cuh runs n_fi = min(1024, nv) threads rounded up to a warp; its thread t sums the squares of
// vectors t, t + n_fi, ... (fma, in order), a shfl_xor butterfly (16..1) sums each warp, and one more
// butterfly sums the warp sums (zero padded to 32).  Our warps stand in for its warps, lane for lane:
//   nv <= 256   kOne:     R = n_fi threads, one vector each (up to ASTRA_ONE_MAX <= 1024 vectors: the fused
//                         norms define 1024, measured faster in context; rmsnorm and gemma_rmsnorm measured slower);
//   nv <= 1024  kTwo:     R = n_fi / 2 (a warp multiple): thread x is its threads x and x + R;
//   nv <= 2048  kPacked:  its warps of 2 rounds, then those of 1, 4 vectors per thread (R ~ nv / 4);
//   nv <= 4096  kCluster: 2 CTAs of 512 threads (sm_90), one of its threads (3-4 rounds) each;
//   wider:      kCluster over 4-8 CTAs of contiguous slices, n_fi = 0: not FlashInfer's order (one of
//               its threads would hold more vectors than our registers do).
// Without clusters, rows over 2048 vectors take the 1024-thread fallback: FlashInfer's layout.
#ifndef ASTRA_ONE_MAX
#define ASTRA_ONE_MAX 256u  // rows of up to this many vectors (<= 1024) take kOne, unless the caller says one_max
#endif
struct RowPlan {
  uint32_t R;      // threads per row (per CTA of a cluster)
  uint32_t n_fi;   // FlashInfer's threads: the stride between a thread's vectors (0: slices)
  uint32_t cl;     // CTAs per row (1: no cluster)
  uint32_t slice;  // vectors per CTA of a cluster
  int layout;      // Layout
};
constexpr uint32_t kMaxVecPerCta = 2048u;
inline uint32_t round_up32(uint32_t v) { return (v + 31u) & ~31u; }
inline bool row_plan(uint32_t nv, bool clusters, RowPlan& p, uint32_t one_max = ASTRA_ONE_MAX) {
  const uint32_t n_fi = round_up32(nv < 1024u ? nv : 1024u);
  p = RowPlan{n_fi, n_fi, 1u, nv, 0};
  if (nv <= one_max) return true;
  if (nv <= 1024u) {
    p.R = round_up32(n_fi / 2u);
    p.layout = 1;
    return true;
  }
  if (nv <= kMaxVecPerCta) {
    const uint32_t nd = (nv - 1024u + 31u) / 32u;  // its warps with a second round
    p.R = 32u * ((32u + nd + 3u) / 4u);
    p.layout = 2;
    return true;
  }
  if (!clusters) return false;
  p.R = 512u;
  p.layout = 3;
  p.cl = 2u;
  while (p.cl < 8u && (nv + p.cl - 1u) / p.cl > kMaxVecPerCta) p.cl *= 2u;
  p.slice = (nv + p.cl - 1u) / p.cl;
  if (p.slice > kMaxVecPerCta) return false;
  if (nv > 4u * 1024u) {
    p.n_fi = 0u;
    p.R = round_up32((p.slice + 3u) / 4u);
  }
  return true;
}
// ---- end of row plan

template <typename T, int W>
cudaError_t launch_smem(T* in, T* res, const T* w1, const T* w2, uint32_t tokens, uint32_t nv, float fd, float e1,
                        float e2, bool pdl, cudaStream_t stream) {
  const size_t smem = size_t(nv) * W * sizeof(float);
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return cudaErrorInvalidValue;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (smem + 64 * sizeof(float) > size_t(optin)) return cudaErrorInvalidValue;  // production's kernels fail here too
  static size_t raised = 0;  // per instantiation
  if (smem > 48u * 1024u && smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(gemma_post_attention_norms_smem_kernel<T, W>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
    raised = smem;
  }
  return launch(gemma_post_attention_norms_smem_kernel<T, W>, dim3(tokens), dim3(1024), smem, stream, pdl, in, res,
                w1, w2, nv, fd, e1, e2);
}

template <typename T, int W>
cudaError_t run_w(T* in, T* res, const T* w1, const T* w2, int64_t tokens64, int64_t d, float e1, float e2,
                  cudaStream_t stream) {
  if (tokens64 >= (1ll << 31)) return cudaErrorInvalidValue;
  const uint32_t tokens = uint32_t(tokens64);
  const uint32_t nv = uint32_t(d / W);
  const DevInfo info = dev_info();
  const bool pdl = (ASTRA_PDL != 0) && info.major >= 9;
  const int prefetch = (uint64_t(tokens) * uint64_t(d) * 2 * sizeof(T) <= uint64_t(ASTRA_PF_MAX)) ? 1 : 0;
  const float fd = float(d);  // sum / d, divided as FlashInfer divides (not sum * (1/d))
  RowPlan p;
  const uint32_t one_max = tokens > 256u ? 256u : ASTRA_ONE_MAX;  // prefill: the plan the norms were timed with
  // no clusters here: rows over 2048 vectors (a cluster in the single norms' plans) take the shared-memory kernel
  if (!row_plan(nv, false, p, one_max) || p.cl > 1)
    return launch_smem<T, W>(in, res, w1, w2, tokens, nv, fd, e1, e2, pdl, stream);
  // Rows per CTA: up to 256 threads per CTA, but keep at least one CTA per SM while tokens allow.
  uint32_t rows = 1;
  while (p.R * rows * 2 <= 256 && uint64_t(tokens) >= uint64_t(info.sms) * rows * 2) rows *= 2;
  const dim3 grid((tokens + rows - 1) / rows), block(p.R, rows);
  auto kernel = p.layout == kOne ? gemma_post_attention_norms_kernel<T, W, kOne>
                : p.layout == kTwo ? gemma_post_attention_norms_kernel<T, W, kTwo>
                                   : gemma_post_attention_norms_kernel<T, W, kPacked>;
  return launch(kernel, grid, block, 0, stream, pdl, in, res, w1, w2, tokens, nv, p.n_fi, fd, e1, e2, prefetch);
}

template <typename T>
cudaError_t run(void* input, void* residual, const void* weight1, const void* weight2, int64_t tokens, int64_t d,
                double eps1, double eps2, cudaStream_t stream) {
  if (tokens < 0 || d < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || d == 0) return cudaSuccess;
  T* in = static_cast<T*>(input);
  T* res = static_cast<T*>(residual);
  const T* w1 = static_cast<const T*>(weight1);
  const T* w2 = static_cast<const T*>(weight2);
  const uintptr_t align = reinterpret_cast<uintptr_t>(input) | reinterpret_cast<uintptr_t>(residual) |
                          reinterpret_cast<uintptr_t>(weight1) | reinterpret_cast<uintptr_t>(weight2);
  constexpr int kMaxW = 16 / sizeof(T);
  int vw = kMaxW;
  while (vw > 1 && ((d % vw) != 0 || (align % (vw * sizeof(T))) != 0)) vw >>= 1;
  const float e1 = static_cast<float>(eps1), e2 = static_cast<float>(eps2);
  if (vw == kMaxW) return run_w<T, kMaxW>(in, res, w1, w2, tokens, d, e1, e2, stream);
  if constexpr (kMaxW >= 8) {
    if (vw == 4) return run_w<T, 4>(in, res, w1, w2, tokens, d, e1, e2, stream);
  }
  if (vw == 2) return run_w<T, 2>(in, res, w1, w2, tokens, d, e1, e2, stream);
  return run_w<T, 1>(in, res, w1, w2, tokens, d, e1, e2, stream);
}

}  // namespace
}  // namespace astra_gpan

extern "C" cudaError_t astra_gemma_post_attention_norms(void* input, void* residual, const void* weight1,
                                                        const void* weight2, int64_t num_tokens, int64_t hidden,
                                                        double eps1, double eps2, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 0: return astra_gpan::run<float>(input, residual, weight1, weight2, num_tokens, hidden, eps1, eps2, stream);
    case 1: return astra_gpan::run<__half>(input, residual, weight1, weight2, num_tokens, hidden, eps1, eps2, stream);
    case 2:
      return astra_gpan::run<__nv_bfloat16>(input, residual, weight1, weight2, num_tokens, hidden, eps1, eps2, stream);
    default: return cudaErrorInvalidValue;
  }
}
