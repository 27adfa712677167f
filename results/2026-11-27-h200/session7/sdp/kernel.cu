// astra-sglang silu_down_proj: a dense MLP's SiLU-and-mul and down projection at decode sizes, in one launch:
//   act[t, k] = T( silu(gate_up[t, k]) * gate_up[t, I + k] )          fp32 math, rounded to T as SGLang writes it
//   out[t, n] = T( sum_k float(act[t, k]) * float(weight[n, k]) )     fp32 accumulation, one rounding to T
// where SGLang runs its silu_and_mul kernel and then the down projection's GEMM (cuBLAS, or astra's linear).
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_silu_down_proj(const void* gate_up, const void* weight, void* out,
//           int64_t num_tokens, int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream)
// gate_up [tokens, 2 * in], weight [out, in], out [tokens, out], all contiguous, dtype 1 fp16, 2 bf16. Launches on
// `stream` only; no allocation, no host sync.
//
// Why: at 1-2 tokens down_proj is a weight stream (kernels/linear/kernel.cu's FMA path, whose memory pattern this
// keeps), and the activation before it is a separate ~1.5 us launch per layer whose output only this GEMV reads.
// Here the GEMV reads gate and up where linear reads x and makes the activation as it loads them:
//  * A CTA of 8 warps owns kRows consecutive output rows; its 256 threads sweep them in 4 KB strides (thread i takes
//    16-byte vector i, i + 256, ... of each row): 512-byte warp loads, weights streamed past L1
//    (ld.global.nc.L1::no_allocate), first weight vectors issued before the PDL wait (weights are parameters).
//  * For each token, vector v of the gate half and of the up half go through L1 (__ldg; every CTA reads them), and
//    the 8 activations are made in registers: silu(g) = g / (1 + e^-g) with the fast exp and division of SGLang's
//    --use_fast_math JIT build on sm_90, times up, rounded to T, as production's silu_and_mul stores them. Every CTA
//    recomputes the activation of the whole row (N / kRows times in all): 2 MUFU ops per element, off the memory
//    path at 1-2 tokens. kRows trades that recompute against CTAs in flight (ASTRA_SDP_ROWS to try 8 on a GPU).
//  * Tokens are template groups of up to kMaxGroup; more tokens are more groups (the adapter takes 1-2).
//  * in_features not a multiple of 8 or unaligned pointers: a scalar path (same math, no vectors; correctness only).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, first weights loaded before the wait, trigger right after it
#endif
#ifndef ASTRA_SDP_ROWS
#define ASTRA_SDP_ROWS 4  // output rows per CTA: linear's tuned value (H200); not yet tuned for this op
#endif

namespace astra_sdp {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = ASTRA_SDP_ROWS;
constexpr int kMaxGroup = 4;  // tokens per pass over the weights
constexpr int kScalarWarps = 4;
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

// silu(g) * u rounded to T, back as float: the value production's silu_and_mul stores and its GEMM reads.
// g -> -inf: the denominator overflows to inf and silu is -0 (no NaN), as in production.
template <typename T>
__device__ __forceinline__ float act(float g, float u) {
  return to_f(from_f<T>(__fdividef(g, 1.0f + __expf(-g)) * u));
}

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f(e[i]);
}

template <typename T>
__device__ __forceinline__ void act8(const uint4& gv, const uint4& uv, float (&a)[8]) {
  const T* g = reinterpret_cast<const T*>(&gv);
  const T* u = reinterpret_cast<const T*>(&uv);
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = act<T>(to_f(g[i]), to_f(u[i]));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Vector path: CTA b owns rows [kRows b, kRows b + kRows) for NT tokens; thread i accumulates vectors i, i + 256, ...
// of each row. gate_up row t: gate vectors [0, nvec), up vectors [nvec, 2 nvec).
template <typename T, int NT>
__global__ void __launch_bounds__(kThreads) sdp_gemv_kernel(const T* __restrict__ gate_up, const T* __restrict__ w,
                                                            T* __restrict__ out, int in_features, int out_features,
                                                            int out_stride) {
  __shared__ float part[kWarps][kRows * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = in_features >> 3;
  const int row0 = blockIdx.x * kRows;
  const uint4* wv4 = reinterpret_cast<const uint4*>(w);
  const uint4* gu4 = reinterpret_cast<const uint4*>(gate_up);
  const uint4* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // rows past the end read the last row again; their sums are not stored
    wrow[r] = wv4 + static_cast<int64_t>(min(row0 + r, out_features - 1)) * nvec;

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
    if (!waited) {  // gate_up comes from the previous kernel: wait only now, with the first weights in flight
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
    if (live) {
      float b[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) unpack8<T>(wv[r], b[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const uint4* row = gu4 + static_cast<int64_t>(t) * 2 * nvec;
        float a[8];
        act8<T>(__ldg(row + v), __ldg(row + nvec + v), a);
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
    if (row0 + r < out_features) out[static_cast<int64_t>(t) * out_stride + row0 + r] = from_f<T>(s);
  }
}

// Scalar path (in_features % 8 != 0 or unaligned pointers): one warp per output row, every token, k strided by lane.
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32) sdp_scalar_kernel(const T* __restrict__ gate_up,
                                                                       const T* __restrict__ w, T* __restrict__ out,
                                                                       int tokens, int in_features,
                                                                       int out_features) {
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kScalarWarps + (threadIdx.x >> 5);
  if (n >= out_features) return;
  const T* wrow = w + static_cast<int64_t>(n) * in_features;
  for (int t = 0; t < tokens; ++t) {
    const T* g = gate_up + static_cast<int64_t>(t) * 2 * in_features;
    const T* u = g + in_features;
    float s = 0.f;
    for (int k = lane; k < in_features; k += 32) s = fmaf(act<T>(to_f(g[k]), to_f(u[k])), to_f(wrow[k]), s);
    s = warp_sum(s);
    if (lane == 0) out[static_cast<int64_t>(t) * out_features + n] = from_f<T>(s);
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
cudaError_t launch_group(const T* gu, const T* w, T* out, int in_features, int out_features, cudaStream_t stream) {
  const dim3 grid((out_features + kRows - 1) / kRows);
  return launch(sdp_gemv_kernel<T, NT>, grid, kThreads, stream, gu, w, out, in_features, out_features, out_features);
}

template <typename T>
cudaError_t dispatch(const void* gp, const void* wp, void* op, int tokens, int in_features, int out_features,
                     cudaStream_t stream) {
  const T* gu = static_cast<const T*>(gp);
  const T* w = static_cast<const T*>(wp);
  T* out = static_cast<T*>(op);
  const bool aligned = (reinterpret_cast<uintptr_t>(gu) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  if (in_features % 8 != 0 || !aligned)
    return launch(sdp_scalar_kernel<T>, dim3((out_features + kScalarWarps - 1) / kScalarWarps), kScalarWarps * 32,
                  stream, gu, w, out, tokens, in_features, out_features);
  for (int t0 = 0; t0 < tokens; t0 += kMaxGroup) {
    const int nt = min(kMaxGroup, tokens - t0);
    const T* gg = gu + static_cast<int64_t>(t0) * 2 * in_features;
    T* og = out + static_cast<int64_t>(t0) * out_features;
    cudaError_t err;
    switch (nt) {
      case 1: err = launch_group<T, 1>(gg, w, og, in_features, out_features, stream); break;
      case 2: err = launch_group<T, 2>(gg, w, og, in_features, out_features, stream); break;
      case 3: err = launch_group<T, 3>(gg, w, og, in_features, out_features, stream); break;
      default: err = launch_group<T, 4>(gg, w, og, in_features, out_features, stream); break;
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace astra_sdp

extern "C" cudaError_t astra_silu_down_proj(const void* gate_up, const void* weight, void* out, int64_t num_tokens,
                                            int64_t in_features, int64_t out_features, int dtype,
                                            cudaStream_t stream) {
  using namespace astra_sdp;
  if (num_tokens < 0 || in_features < 1 || out_features < 1) return cudaErrorInvalidValue;
  // 2 * in_features elements per gate_up row must index as int
  if (num_tokens > (int64_t(1) << 20) || in_features > (int64_t(1) << 23) || out_features > (int64_t(1) << 24))
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), k = static_cast<int>(in_features), n = static_cast<int>(out_features);
  switch (dtype) {
    case 1: return dispatch<__half>(gate_up, weight, out, t, k, n, stream);
    case 2: return dispatch<__nv_bfloat16>(gate_up, weight, out, t, k, n, stream);
    default: return cudaErrorInvalidValue;
  }
}
