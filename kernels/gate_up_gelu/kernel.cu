// astra-sglang gate_up_gelu: a Gemma-1 MLP's gate_up projection with GELU-and-mul (erf) as its epilogue, at decode
// sizes:
//   g[t, k] = T( sum_h float(x[t, h]) * float(weight[k, h]) )        gate row k        (fp32 sum, rounded to T)
//   u[t, k] = T( sum_h float(x[t, h]) * float(weight[I + k, h]) )    the matching up row (fp32 sum, rounded to T)
//   out[t, k] = T( gelu(g[t, k]) * u[t, k] )                         fp32 math, rounded to T
//   gelu(g) = g * 0.5 (1 + erf(g / sqrt(2)))                         (torch's approximate="none")
// where SGLang (GemmaMLP.forward) runs gate_up_proj's GEMM (cuBLAS, or astra's linear), which writes g and u in T,
// and then GeluAndMul("none")'s gelu_and_mul kernel, which reads them back and writes the activation down_proj reads.
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_gate_up_gelu(const void* x, const void* weight, void* out, int64_t num_tokens,
//           int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream)
// x [tokens, in] (the MLP input, in = hidden size H), weight [2 * out, in] (gate_up_proj.weight: gate rows
// 0..out-1, then the up rows; per rank under tensor parallelism), out [tokens, out] (out = the intermediate width I),
// all contiguous, dtype 1 fp16, 2 bf16. Launches on `stream` only; no allocation, no host sync.
//
// kernels/gate_up_silu/kernel.cu's kernel (see there and its RESULTS.md for the measurements behind the design)
// with only the epilogue's activation changed; each op's kernel stays one self-contained source. At 1-2 tokens
// gate_up_proj is a weight stream and the activation after it a separate launch whose input only this GEMV writes:
// each CTA owns kPairs gate rows and the kPairs up rows they pair with, so both halves of an activation end in the
// same CTA, which applies GELU-and-mul to its own sums and writes kPairs activations per token.
//  * A CTA of 8 warps owns kRows = 2 kPairs weight rows: rows r < kPairs are gate rows p0 + r, rows r >= kPairs the
//    up rows I + p0 + r - kPairs (p0 = kPairs * blockIdx.x). Its 256 threads sweep them in 4 KB strides (thread i
//    takes 16-byte vector i, i + 256, ... of each row): 512-byte warp loads, kRows independent 16-byte loads in
//    flight per thread; kPairs = 2 (4 rows, linear's tuned value on an H200) gives I / 2 CTAs (12288 for Gemma-7B).
//  * Weights are read with ld.global.nc.L1::no_allocate (used once); x (a few KB per token, read by every CTA) goes
//    through L1 with __ldg.
//  * Under programmatic dependent launch the first weight vectors are loaded BEFORE griddepcontrol.wait (weights
//    are parameters no kernel before us writes), the trigger comes right after the wait.
//  * Each row's sum is linear's, in linear's order (per-thread FMA chain, warp butterfly, the 8 warps' partials in
//    warp order), so g and u are bit for bit what astra's linear writes for gate_up_proj; each is rounded to T, as
//    the GEMM stores it, before the epilogue: gelu(g) * u as SGLang 0.5.17's JIT gelu_and_mul computes it on sm_90
//    (activation.cuh, ActivationKind::kGELU: g * (0.5 (1 + erff(g * kSqrt1Over2))), times u, rounded to T; erff is
//    CUDA's libdevice polynomial under --use_fast_math too, in both builds; erf saturates to +-1: no NaN).
//  * Tokens are template groups of up to kMaxGroup (4); more tokens are more groups (the adapter takes 1-2).
//  * in_features not a multiple of 8 or unaligned pointers: a scalar path (same math, no vectors; correctness only).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, first weights loaded before the wait, trigger right after it
#endif
#ifndef ASTRA_GUG_LATE_TRIGGER
#define ASTRA_GUG_LATE_TRIGGER 0  // 1: the next kernel launches only after the weight loop, not right after the wait
#endif
#ifndef ASTRA_GUG_PAIRS
#define ASTRA_GUG_PAIRS 2  // gate/up row pairs per CTA: 2 = linear's 4 rows (tuned on an H200); 4 = 8 rows, to try
#endif

namespace astra_gug {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPairs = ASTRA_GUG_PAIRS;
constexpr int kRows = 2 * kPairs;  // weight rows per CTA: kPairs gate rows, then their kPairs up rows
constexpr int kMaxGroup = 4;       // tokens per pass over the weights
constexpr int kScalarWarps = 4;
constexpr unsigned kFull = 0xffffffffu;
static_assert(kPairs >= 1 && kPairs <= 4, "ASTRA_GUG_PAIRS: 1 to 4 pairs per CTA");

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

// The epilogue: g and u rounded to T (as the gate_up GEMM stores them), gelu(g) * u in fp32, the expression of
// SGLang's kGELU term for term (the same erff under the same --use_fast_math build), rounded to T (as it stores the
// activation; no rounding of the activation before the product).
template <typename T>
__device__ __forceinline__ T gelu_mul(float g_sum, float u_sum) {
  constexpr float kSqrt1Over2 = 0.7071067811865475f;
  const float g = to_f(from_f<T>(g_sum)), u = to_f(from_f<T>(u_sum));
  const float gelu = g * (0.5f * (1.0f + erff(g * kSqrt1Over2)));
  return from_f<T>(gelu * u);
}

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

// Vector path: CTA b owns pairs [kPairs b, kPairs b + kPairs) for NT tokens; thread i accumulates vectors i,
// i + 256, ... of each of its kRows weight rows.
template <typename T, int NT>
__global__ void __launch_bounds__(kThreads) gug_gemv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                            T* __restrict__ out, int in_features, int inter,
                                                            int out_stride) {
  __shared__ float part[kWarps][kRows * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = in_features >> 3;
  const int p0 = blockIdx.x * kPairs;
  const uint4* wv4 = reinterpret_cast<const uint4*>(w);
  const uint4* xv4 = reinterpret_cast<const uint4*>(x);
  const uint4* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {  // pairs past the end read the last pair again; their results are not stored
    const int pair = min(p0 + (r < kPairs ? r : r - kPairs), inter - 1);
    wrow[r] = wv4 + static_cast<int64_t>(r < kPairs ? pair : inter + pair) * nvec;
  }

  float acc[kRows][NT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;

  bool waited = !ASTRA_PDL;
  // every thread runs the same number of iterations (the guard is inside), so the barrier below is uniform
  for (int v0 = 0; v0 < nvec; v0 += kThreads) {
    const int v = v0 + threadIdx.x;
    const bool live = v < nvec;
    uint4 wv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) wv[r] = live ? load_stream(wrow[r] + v) : make_uint4(0, 0, 0, 0);
    if (!waited) {  // x comes from the previous kernel: wait only now, with the first weights in flight
      pdl_wait();
      if (!ASTRA_GUG_LATE_TRIGGER) pdl_trigger();
      waited = true;
    }
    if (live) {
      float b[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) unpack8<T>(wv[r], b[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float a[8];
        unpack8<T>(__ldg(xv4 + static_cast<int64_t>(t) * nvec + v), a);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(a[j], b[r][j], acc[r][t]);
      }
    }
  }
  if (!waited) {  // no vector at all (in_features < 8 takes the scalar path; kept for safety)
    pdl_wait();
    pdl_trigger();
  } else if (ASTRA_GUG_LATE_TRIGGER && ASTRA_PDL) {
    pdl_trigger();
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0) part[warp][r * NT + t] = s;
    }
  __syncthreads();
  // the epilogue: thread (q, t) sums the 8 warps' partials of gate row q and of its up row kPairs + q, each in
  // warp order (linear's), and writes one activation
  if (threadIdx.x < kPairs * NT) {
    const int q = threadIdx.x / NT, t = threadIdx.x % NT;
    float g = 0.f, u = 0.f;
#pragma unroll
    for (int p = 0; p < kWarps; ++p) {
      g += part[p][q * NT + t];
      u += part[p][(kPairs + q) * NT + t];
    }
    if (p0 + q < inter) out[static_cast<int64_t>(t) * out_stride + p0 + q] = gelu_mul<T>(g, u);
  }
}

// Scalar path (in_features % 8 != 0 or unaligned pointers): one warp per pair (its gate row and its up row), every
// token, h strided by lane.
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32) gug_scalar_kernel(const T* __restrict__ x,
                                                                       const T* __restrict__ w, T* __restrict__ out,
                                                                       int tokens, int in_features, int inter) {
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  const int lane = threadIdx.x & 31;
  const int k = blockIdx.x * kScalarWarps + (threadIdx.x >> 5);
  if (k >= inter) return;
  const T* grow = w + static_cast<int64_t>(k) * in_features;
  const T* urow = w + static_cast<int64_t>(inter + k) * in_features;
  for (int t = 0; t < tokens; ++t) {
    const T* xrow = x + static_cast<int64_t>(t) * in_features;
    float g = 0.f, u = 0.f;
    for (int h = lane; h < in_features; h += 32) {
      const float xv = to_f(xrow[h]);
      g = fmaf(xv, to_f(grow[h]), g);
      u = fmaf(xv, to_f(urow[h]), u);
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) out[static_cast<int64_t>(t) * inter + k] = gelu_mul<T>(g, u);
  }
}

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
cudaError_t launch_group(const T* x, const T* w, T* out, int in_features, int inter, cudaStream_t stream) {
  const dim3 grid((inter + kPairs - 1) / kPairs);
  return launch(gug_gemv_kernel<T, NT>, grid, kThreads, stream, x, w, out, in_features, inter, inter);
}

template <typename T>
cudaError_t dispatch(const void* xp, const void* wp, void* op, int tokens, int in_features, int inter,
                     cudaStream_t stream) {
  const T* x = static_cast<const T*>(xp);
  const T* w = static_cast<const T*>(wp);
  T* out = static_cast<T*>(op);
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  if (in_features % 8 != 0 || !aligned)
    return launch(gug_scalar_kernel<T>, dim3((inter + kScalarWarps - 1) / kScalarWarps), kScalarWarps * 32, stream,
                  x, w, out, tokens, in_features, inter);
  for (int t0 = 0; t0 < tokens; t0 += kMaxGroup) {
    const int nt = min(kMaxGroup, tokens - t0);
    const T* xg = x + static_cast<int64_t>(t0) * in_features;
    T* og = out + static_cast<int64_t>(t0) * inter;
    cudaError_t err;
    switch (nt) {
      case 1: err = launch_group<T, 1>(xg, w, og, in_features, inter, stream); break;
      case 2: err = launch_group<T, 2>(xg, w, og, in_features, inter, stream); break;
      case 3: err = launch_group<T, 3>(xg, w, og, in_features, inter, stream); break;
      default: err = launch_group<T, 4>(xg, w, og, in_features, inter, stream); break;
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace astra_gug

extern "C" cudaError_t astra_gate_up_gelu(const void* x, const void* weight, void* out, int64_t num_tokens,
                                          int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream) {
  using namespace astra_gug;
  if (num_tokens < 0 || in_features < 1 || out_features < 1) return cudaErrorInvalidValue;
  // 2 * out_features weight rows and the grid must index as int
  if (num_tokens > (int64_t(1) << 20) || in_features > (int64_t(1) << 24) || out_features > (int64_t(1) << 23))
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), h = static_cast<int>(in_features), k = static_cast<int>(out_features);
  switch (dtype) {
    case 1: return dispatch<__half>(x, weight, out, t, h, k, stream);
    case 2: return dispatch<__nv_bfloat16>(x, weight, out, t, h, k, stream);
    default: return cudaErrorInvalidValue;
  }
}
