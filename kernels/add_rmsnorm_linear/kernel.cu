// astra-sglang add_rmsnorm_linear: a FUSED op. A decoder layer's fused add + RMSNorm and the decode GEMV that reads
// its output (input_layernorm -> qkv_proj), in one launch:
//   s[t, k]     = float(x[t, k]) + float(residual[t, k])                               fp32
//   residual_out[t, k] = T(s[t, k])                                                    the new residual
//   normed[t, k] = T( s[t, k] * rsqrt(sum_k s^2 / H + eps) * (0 + norm_weight[k]) )  FlashInfer's FusedAddRMSNorm
//   out[t, n]   = T( sum_k float(normed[t, k]) * float(weight[n, k]) )                 linear's GEMV on the normed row
// where SGLang runs sgl_kernel.fused_add_rmsnorm (in place: x <- normed, residual <- T(s)), then the projection's
// F.linear (cuBLAS, or astra's linear) on x.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_add_rmsnorm_linear(const void* x, const void* residual, const void* norm_weight,
//           const void* weight, void* out, void* residual_out, void* normed, int64_t num_tokens, int64_t in_features,
//           int64_t out_features, double eps, int dtype, cudaStream_t stream)
// x, residual [tokens, H] (read only), norm_weight [H], weight [N, H], out [tokens, N], residual_out and normed
// [tokens, H] (normed may be null: not written), all contiguous and 16-byte aligned, H = in_features a multiple of 8
// and at most 8192, dtype 1 fp16, 2 bf16; otherwise cudaErrorInvalidValue. Launches on `stream` only; no
// allocation, no host sync.
//
// Why: at 1-2 tokens the norm is a separate ~2 us launch per site in SGLang's decode graph, and its output is read
// only by the GEMV after it. A GEMV CTA reads the whole x row anyway (every CTA, from L1/L2), so each CTA forms the
// normed row itself from x and residual (a few KB, one add and one FMA per element) instead of reading it: the
// norm's launch and its round trip through memory go. This is not the recomputation that sank silu_down_proj
// (kernels/gate_up_silu/RESULTS.md: an expensive activation of a 14336-wide row in 1024 CTAs): here the row is
// 2-8 K elements, its math is what the norm kernel does per element, and the x loads were already there.
//  * The GEMV is linear's FMA path (kernels/linear/kernel.cu) unchanged: 8 warps, kRows = 4 output rows per CTA,
//    thread i takes 16-byte vectors i, i + 256, ... of each row, weights through ld.global.nc.L1::no_allocate, the
//    first weight vectors loaded BEFORE griddepcontrol.wait (parameters no kernel before us writes), fp32 FMA chain
//    per thread in vector order, warp butterfly, the 8 warps' partials in warp order. Fed the same normed values,
//    out is what astra's linear writes for them, bit for bit (this file is built with --use_fast_math for the norm,
//    so its sums flush fp32 subnormals, which linear's do not: only a partial sum below 1.2e-38 could differ).
//  * The norm is FlashInfer's order (kernels/fused_add_rmsnorm/kernel.cu's, bit for bit): for H <= 8192 (nv <= 1024
//    vectors) norm.cuh runs n_fi = round_up32(nv) threads, thread t owning vector t alone, so FlashInfer's thread t
//    is GEMV thread t % 256 at sweep t / 256 and its warp t / 32 is warp (t % 256) / 32 at that sweep: a thread's
//    squares of one vector form one chain (s = fma(v, v, s) over its 8 elements), each (warp, sweep) butterfly is
//    one of FlashInfer's warp sums, kept in shared memory at its warp index, and every warp then runs FlashInfer's
//    cross-warp butterfly (zero padded to 32) itself. n_fi comes from the row plan block copied from the norm
//    (tests/test_op_add_rmsnorm_linear.py checks the copy). rsqrt(ss / H + eps), (s * rcp) * (0 + w): the norm's
//    expressions, compiled with the norm's --use_fast_math.
//  * Registers: the thread holds its x and residual vectors (sweeps x tokens) only through the sum of squares; after
//    the barrier it reads them again from L1 (a volatile load: kept live across the barrier as fp32 sums they cost
//    up to 207 registers, reloaded 48-70) with the norm weight, and writes its normed vectors into its own slots of a
//    shared buffer (ys, 4-32 KB; no barrier: only the writing thread reads a slot), which the GEMV sweep reads in
//    x's place.
//  * residual_out and normed are written by CTA 0 alone (out of place: every CTA still reads the old residual).
//  * Tokens come in groups of up to 2 (one launch each): the FMA path's range; more tokens are more groups.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, first weights loaded before the wait, trigger right after it
#endif

namespace astra_arl {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 4;      // output rows per CTA: linear's (tuned on an H200)
constexpr int kMaxGroup = 2;  // tokens per launch (linear's FMA path, where the adapter takes them)
constexpr int kMaxIters = 4;  // sweeps of 256 vectors: H <= 8192, where FlashInfer's threads own one vector each
constexpr unsigned kFull = 0xffffffffu;
// FlashInfer multiplies by (weight_bias + weight), weight_bias = 0 (the norm kernel's kWeightBias)
constexpr float kWeightBias = 0.f;

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

// x or residual again after the reduction, from L1: volatile, so the compiler reloads it instead of keeping the fp32
// sums of the first pass live across the barrier (32 registers more per 2 tokens x 2 sweeps)
__device__ __forceinline__ uint4 load_again(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// the norm weight (a parameter) into L1 before the PDL wait, for the normed values after the reduction: one L2 round
// trip off the prologue's path, no register held
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// a weight vector: streamed once, never kept in L1
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f(e[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// CTA b owns output rows [4b, 4b + 4) for NT tokens; thread i takes vectors i + 256 j, j < IT, of every row (IT =
// ceil(nv / 256) sweeps).
template <typename T, int NT, int IT>
__global__ void __launch_bounds__(kThreads) add_rmsnorm_linear_kernel(
    const T* __restrict__ x, const T* __restrict__ res, const T* __restrict__ nw, const T* __restrict__ w,
    T* __restrict__ out, T* __restrict__ res_out, T* __restrict__ normed, int in_features, int out_features,
    int n_fi, float fd, float eps) {
  __shared__ float red[NT][32];                // FlashInfer's warp sums of each token's row, at their warp index
  __shared__ float part[kWarps][kRows * NT];   // linear's per-warp partial sums
  __shared__ uint4 ys[NT][IT * kThreads];      // the normed row, each thread's own vectors (16 KB at H 4096, 2 tokens)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = in_features >> 3;
  const int row0 = blockIdx.x * kRows;
  const uint4* wv4 = reinterpret_cast<const uint4*>(w);
  const uint4* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // rows past the end read the last row again; their sums are not stored
    wrow[r] = wv4 + static_cast<int64_t>(min(row0 + r, out_features - 1)) * nvec;

  // Before the wait: the first sweep's weight vectors (parameters no kernel before us writes), the norm weight into L1
  uint4 wv[kRows];
  {
    const bool live = static_cast<int>(threadIdx.x) < nvec;
#pragma unroll
    for (int r = 0; r < kRows; ++r) wv[r] = live ? load_stream(wrow[r] + threadIdx.x) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < IT; ++j)
    if (j * kThreads + static_cast<int>(threadIdx.x) < nvec)
      prefetch_l1(reinterpret_cast<const uint4*>(nw) + j * kThreads + threadIdx.x);
#if ASTRA_PDL
  pdl_wait();  // x and residual come from the previous kernel
  pdl_trigger();
#endif

  // The norm: s = x + residual per element, FlashInfer's chains and warp sums (see the header)
  uint4 xa[NT][IT], ra[NT][IT];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int j = 0; j < IT; ++j) {
      const int v = j * kThreads + threadIdx.x;
      const int64_t o = static_cast<int64_t>(t) * nvec + v;
      const bool live = v < nvec;
      xa[t][j] = live ? __ldg(reinterpret_cast<const uint4*>(x) + o) : make_uint4(0, 0, 0, 0);
      ra[t][j] = live ? __ldg(reinterpret_cast<const uint4*>(res) + o) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int j = 0; j < IT; ++j) {
      const T* a = reinterpret_cast<const T*>(&xa[t][j]);
      const T* b = reinterpret_cast<const T*>(&ra[t][j]);
      float s = 0.f;  // FlashInfer thread j * 256 + threadIdx.x: its one vector (dead lanes: zeros, as its own)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float v = to_f(a[e]) + to_f(b[e]);
        s += v * v;
      }
      const float ss = warp_sum(s);
      if (lane == 0) red[t][j * kWarps + warp] = ss;
    }
  __syncthreads();
  const int nred = n_fi >> 5;  // FlashInfer's warps (<= IT * 8: every one written above)
  float rcp[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float ss = warp_sum(lane < nred ? red[t][lane] : 0.f);  // FlashInfer's cross-warp butterfly
    rcp[t] = rsqrtf(ss / fd + eps);
  }
  // normed = T((s * rcp) * (0 + w)) into this thread's own slots of ys (no barrier: no other thread reads them);
  // CTA 0 also writes residual_out and normed
  const bool writer = blockIdx.x == 0;
#pragma unroll
  for (int j = 0; j < IT; ++j) {
    const int v = j * kThreads + threadIdx.x;
    if (v < nvec) {
      const uint4 gv = __ldg(reinterpret_cast<const uint4*>(nw) + v);
      const T* gw = reinterpret_cast<const T*>(&gv);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int64_t o = static_cast<int64_t>(t) * nvec + v;
        const uint4 xv = load_again(reinterpret_cast<const uint4*>(x) + o);
        const uint4 rv = load_again(reinterpret_cast<const uint4*>(res) + o);
        const T* a = reinterpret_cast<const T*>(&xv);
        const T* b = reinterpret_cast<const T*>(&rv);
        uint4 rs, ny;
        T* rsv = reinterpret_cast<T*>(&rs);
        T* nyv = reinterpret_cast<T*>(&ny);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float s = to_f(a[e]) + to_f(b[e]);
          rsv[e] = from_f<T>(s);
          nyv[e] = from_f<T>(s * rcp[t] * (kWeightBias + to_f(gw[e])));
        }
        ys[t][v] = ny;
        if (writer) {
          reinterpret_cast<uint4*>(res_out)[o] = rs;
          if (normed != nullptr) reinterpret_cast<uint4*>(normed)[o] = ny;
        }
      }
    }
  }

  // linear's FMA GEMV loop on the normed vectors (ys in x's place), in linear's order
  float acc[kRows][NT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  // every thread runs the same number of iterations (the guard is inside), so the barrier below is uniform
  for (int v0 = 0; v0 < nvec; v0 += kThreads) {
    const int v = v0 + threadIdx.x;
    const bool live = v < nvec;
    if (v0 > 0) {  // the first sweep's vectors were loaded before the wait
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r] = live ? load_stream(wrow[r] + v) : make_uint4(0, 0, 0, 0);
    }
    if (live) {
      float b[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) unpack8<T>(wv[r], b[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float a[8];
        unpack8<T>(ys[t][v], a);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(a[e], b[r][e], acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0) part[warp][r * NT + t] = s;
    }
  __syncthreads();
  if (threadIdx.x < kRows * NT) {
    const int r = threadIdx.x / NT, t = threadIdx.x % NT;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < kWarps; ++p) s += part[p][threadIdx.x];
    if (row0 + r < out_features) out[static_cast<int64_t>(t) * out_features + row0 + r] = from_f<T>(s);
  }
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

int device_major() {
  static int cached_dev = -1, major = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev != cached_dev) {
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cached_dev = dev;
  }
  return major;
}

template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, int threads, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (ASTRA_PDL && device_major() >= 9) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

template <typename T, int NT>
cudaError_t launch_group(const T* x, const T* res, const T* nw, const T* w, T* out, T* res_out, T* normed, int h,
                         int n, int n_fi, float fd, float eps, cudaStream_t stream) {
  const dim3 grid((n + kRows - 1) / kRows);
  const int iters = (h / 8 + kThreads - 1) / kThreads;
  switch (iters) {
    case 1: return launch(add_rmsnorm_linear_kernel<T, NT, 1>, grid, kThreads, stream, x, res, nw, w, out, res_out,
                          normed, h, n, n_fi, fd, eps);
    case 2: return launch(add_rmsnorm_linear_kernel<T, NT, 2>, grid, kThreads, stream, x, res, nw, w, out, res_out,
                          normed, h, n, n_fi, fd, eps);
    case 3: return launch(add_rmsnorm_linear_kernel<T, NT, 3>, grid, kThreads, stream, x, res, nw, w, out, res_out,
                          normed, h, n, n_fi, fd, eps);
    default: return launch(add_rmsnorm_linear_kernel<T, NT, 4>, grid, kThreads, stream, x, res, nw, w, out, res_out,
                           normed, h, n, n_fi, fd, eps);
  }
}

template <typename T>
cudaError_t dispatch(const void* xp, const void* rp, const void* nwp, const void* wp, void* op, void* rop, void* np,
                     int tokens, int h, int n, float eps, cudaStream_t stream) {
  const uintptr_t align = reinterpret_cast<uintptr_t>(xp) | reinterpret_cast<uintptr_t>(rp) |
                          reinterpret_cast<uintptr_t>(nwp) | reinterpret_cast<uintptr_t>(wp) |
                          reinterpret_cast<uintptr_t>(rop) | reinterpret_cast<uintptr_t>(np);
  if (h % 8 != 0 || h / 8 > kMaxIters * kThreads || align % 16 != 0) return cudaErrorInvalidValue;
  RowPlan p;
  row_plan(static_cast<uint32_t>(h / 8), false, p);
  if (p.n_fi < static_cast<uint32_t>(h / 8)) return cudaErrorInvalidValue;  // one vector per FlashInfer thread
  const int n_fi = static_cast<int>(p.n_fi);
  const float fd = static_cast<float>(h);  // mean of squares = sum / H, divided as the norm divides
  const T* x = static_cast<const T*>(xp);
  const T* res = static_cast<const T*>(rp);
  const T* nw = static_cast<const T*>(nwp);
  const T* w = static_cast<const T*>(wp);
  T* out = static_cast<T*>(op);
  T* res_out = static_cast<T*>(rop);
  T* normed = static_cast<T*>(np);
  for (int t0 = 0; t0 < tokens; t0 += kMaxGroup) {
    const int nt = min(kMaxGroup, tokens - t0);
    const int64_t xo = static_cast<int64_t>(t0) * h;
    T* ng = normed ? normed + xo : nullptr;
    T* og = out + static_cast<int64_t>(t0) * n;
    const cudaError_t err =
        nt == 1 ? launch_group<T, 1>(x + xo, res + xo, nw, w, og, res_out + xo, ng, h, n, n_fi, fd, eps, stream)
                : launch_group<T, 2>(x + xo, res + xo, nw, w, og, res_out + xo, ng, h, n, n_fi, fd, eps, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace astra_arl

extern "C" cudaError_t astra_add_rmsnorm_linear(const void* x, const void* residual, const void* norm_weight,
                                                const void* weight, void* out, void* residual_out, void* normed,
                                                int64_t num_tokens, int64_t in_features, int64_t out_features,
                                                double eps, int dtype, cudaStream_t stream) {
  using namespace astra_arl;
  if (num_tokens < 0 || in_features < 1 || out_features < 1) return cudaErrorInvalidValue;
  if (num_tokens > (int64_t(1) << 20) || in_features > (int64_t(1) << 24) || out_features > (int64_t(1) << 24))
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), k = static_cast<int>(in_features), n = static_cast<int>(out_features);
  const float e = static_cast<float>(eps);
  switch (dtype) {
    case 1: return dispatch<__half>(x, residual, norm_weight, weight, out, residual_out, normed, t, k, n, e, stream);
    case 2:
      return dispatch<__nv_bfloat16>(x, residual, norm_weight, weight, out, residual_out, normed, t, k, n, e, stream);
    default: return cudaErrorInvalidValue;
  }
}
