// astra-sglang linear: an unquantized linear at decode sizes, the weight-streaming GEMV of every dense projection
// (qkv_proj, o_proj, gate_up_proj, down_proj) that SGLang runs as F.linear -> cuBLAS:
//   out[t, n] = T( sum_k float(x[t, k]) * float(weight[n, k]) )      fp32 accumulation, one rounding to T
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_linear(const void* x, const void* weight, void* out, int64_t num_tokens,
//           int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream)
// x [tokens, in], weight [out, in], out [tokens, out], all contiguous, dtype 1 fp16, 2 bf16. Launches on `stream`
// only; no allocation, no host sync.
//
// Why: at one decode token a projection is a pure weight stream (16-50 MB per layer), but cuBLAS's Hopper kernels
// tile it into few, long CTAs (often split-K with a second reduction kernel): 1.7-3.0 TB/s on an H200 for the
// 16-50 MB projections of 8B-30B models, against a ~4.3 TB/s copy ceiling (results/2026-11-26-h200/linear/). Here:
//  * A CTA of 8 warps owns kRows = 4 consecutive output rows; its 256 threads sweep the rows together in 4 KB
//    strides (thread i takes 16-byte vector i, i + 256, ... of each row), so every warp load is 512 contiguous bytes
//    and each thread keeps 4 independent 16-byte loads in flight; N / 4 CTAs (512 for N = 2048) keep 4-5 CTAs on
//    every SM and ~80 KB of loads in flight per SM, what HBM3e needs to stream at full rate.
//  * Weights are read with ld.global.nc.L1::no_allocate (used once: they must not evict x from L1); x (a few KB per
//    token, read by every CTA) goes through L1 with __ldg.
//  * Under programmatic dependent launch the first weight vectors are loaded BEFORE griddepcontrol.wait (weights
//    are parameters no kernel before us writes), so their DRAM latency hides behind the previous kernel's tail.
//  * Tokens are template groups of up to kMaxGroup (one fp32 accumulator per row x token); the weight vector is
//    unpacked once per group. More tokens are more groups (re-reading the weights: the adapter takes few tokens).
//    Warp butterflies, then the 8 warps' partial sums per (row, token) through shared memory.
//  * From 3 tokens the FMA work per weight byte outgrows the stream (0.5-0.9x cuBLAS at 8 tokens), so on Hopper
//    3+ tokens take a tensor-core path that keeps the same loads: a warp reads 512 contiguous bytes of each of its 8
//    or 16 rows per 256-wide chunk (ld.global.nc.L1::no_allocate), transposes them through a warp-private swizzled
//    shared buffer, and runs mma.m16n8k16 with A = x (tokens as M, up to 8 live) and B = the rows (N). Inside a chunk
//    the k order is permuted identically for A and B (thread (g, q) takes physical k 8p..8p+7, p = 4j + q), so x and
//    weights both arrive as 16-byte vectors, two mmas each. The warps' partial sums meet in shared memory. In context
//    at 4 tokens: 1.06-1.65x cuBLAS where out_features <= 4096, about cuBLAS's time on wider outputs (0.75-1.03x);
//    the adapter takes 3-4 tokens of the former (kernels/linear/RESULTS.md). Tokens beyond 8 are more groups of 8.
//  * in_features not a multiple of 8 or unaligned pointers: a scalar path (same math, no vectors; correctness only).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, first weights loaded before the wait, trigger right after it
#endif

#ifndef ASTRA_LONG_ROWS
// 1-2-token calls with more inputs than this (the 14336-wide down_proj) take 2 output rows per CTA, not kRows: N / 4
// CTAs of such rows fill 1.1-1.3 waves of an H200 (896 CTAs for 3584 outputs against ~792 resident), N / 2 fill 2.3-2.6.
// In context on 1-2 x 14336 -> 3584 / 4096 (H200, 2026-11-28, both orders): 0.95-1.04x -> 1.02-1.12x over cuBLAS;
// splitting K over a 2- or 4-CTA cluster instead was slower (0.88-1.00x). ~0u: never.
#define ASTRA_LONG_ROWS 12288
#endif
#ifndef ASTRA_LONG_ROWS_1
// 1-token calls with more inputs than this take the 2-row CTAs too: Qwen3-8B's 12288-wide down_proj. Decode step,
// 2-row CTAs on 12288 inputs at 1-2 tokens (H200, 2026-11-28): batch 1 -1.29%, batch 2 +0.54% (slower), so 1 token only.
#define ASTRA_LONG_ROWS_1 12287
#endif

namespace astra_lin {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 4;      // output rows per CTA (tuned on an H200: 2, 4, 8 rows x 1, 2, 4 vectors in flight)
constexpr int kMaxGroup = 8;  // tokens per pass over the weights (both paths)
constexpr int kMmaFrom = 3;   // tokens from which Hopper takes the tensor-core path
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

// Vector path: CTA b owns rows [Rb, Rb + R) for NT tokens (R = kRows, or 2 for long rows); thread i accumulates
// vectors i, i + 256, ... of each row.
template <typename T, int NT, int R = kRows>
__global__ void __launch_bounds__(kThreads) linear_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                          T* __restrict__ out, int in_features, int out_features,
                                                          int out_stride) {
  __shared__ float part[kWarps][R * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = in_features >> 3;
  const int row0 = blockIdx.x * R;
  const uint4* wv4 = reinterpret_cast<const uint4*>(w);
  const uint4* xv4 = reinterpret_cast<const uint4*>(x);
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // rows past the end read the last row again; their sums are not stored
    wrow[r] = wv4 + static_cast<int64_t>(min(row0 + r, out_features - 1)) * nvec;

  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;

  bool waited = !ASTRA_PDL;
  // every thread runs the same number of iterations (the guard is inside), so the barrier below is uniform
  for (int v0 = 0; v0 < nvec; v0 += kThreads) {
    const int v = v0 + threadIdx.x;
    const bool live = v < nvec;
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = live ? load_stream(wrow[r] + v) : make_uint4(0, 0, 0, 0);
    if (!waited) {  // x comes from the previous kernel: wait only now, with the first weights in flight
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
    if (live) {
      float b[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) unpack8<T>(wv[r], b[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float a[8];
        unpack8<T>(__ldg(xv4 + static_cast<int64_t>(t) * nvec + v), a);
#pragma unroll
        for (int r = 0; r < R; ++r)
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
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0) part[warp][r * NT + t] = s;
    }
  __syncthreads();
  if (threadIdx.x < R * NT) {
    const int r = threadIdx.x / NT, t = threadIdx.x % NT;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < kWarps; ++p) s += part[p][threadIdx.x];
    if (row0 + r < out_features) out[static_cast<int64_t>(t) * out_stride + row0 + r] = from_f<T>(s);
  }
}

// Scalar path (in_features % 8 != 0 or unaligned pointers): one warp per output row, every token, k strided by lane.
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32) linear_scalar_kernel(const T* __restrict__ x,
                                                                          const T* __restrict__ w,
                                                                          T* __restrict__ out, int tokens,
                                                                          int in_features, int out_features) {
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kScalarWarps + (threadIdx.x >> 5);
  if (n >= out_features) return;
  const T* wrow = w + static_cast<int64_t>(n) * in_features;
  for (int t = 0; t < tokens; ++t) {
    const T* xrow = x + static_cast<int64_t>(t) * in_features;
    float s = 0.f;
    for (int k = lane; k < in_features; k += 32) s = fmaf(to_f(xrow[k]), to_f(wrow[k]), s);
    s = warp_sum(s);
    if (lane == 0) out[static_cast<int64_t>(t) * out_features + n] = from_f<T>(s);
  }
}

// ---- Tensor-core path (3+ tokens on sm_90): see the header. mma.m16n8k16, fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  // tokens 8..15 of the M = 16 tile are never live (groups of <= 8): their A registers are zero
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  if constexpr (std::is_same<T, __half>::value)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
#else
  __trap();  // the host dispatches here only on sm_90+
#endif
}

// CTA b owns rows [R b, R b + R), R = 8 RT; warp w takes 256-wide chunks w, w + WARPS, ... (U in flight) for up to 8
// tokens. Lane (g, q): token g of A, row g of each 8-row tile of B.
template <typename T, int WARPS, int RT, int U>
__global__ void __launch_bounds__(WARPS * 32) linear_mma_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                T* __restrict__ out, int tokens, int in_features,
                                                                int out_features, int out_stride) {
  constexpr int R = 8 * RT;
  __shared__ __align__(16) uint4 stage[WARPS][R][32];  // a chunk: R rows x 512 bytes, 16-byte slots swizzled
  __shared__ float part[WARPS][RT][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * R;
  const int nvec = in_features >> 3, nchunk = (nvec + 31) >> 5;
  const uint4* wv4 = reinterpret_cast<const uint4*>(w);
  const uint4* xg = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(min(g, tokens - 1)) * nvec;
  const bool live_token = g < tokens;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // rows past the end read the last row again; their sums are not stored
    wrow[r] = wv4 + static_cast<int64_t>(min(row0 + r, out_features - 1)) * nvec;
  float c[RT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;

  bool waited = !ASTRA_PDL;
  for (int c0 = warp * U; c0 < nchunk; c0 += WARPS * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (c0 + u) * 32 + lane;
      const bool ok = c0 + u < nchunk && v < nvec;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = ok ? load_stream(wrow[r] + v) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // x comes from the previous kernel: wait only now, with the first weights in flight
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      __syncwarp();  // the previous chunk's reads of the stage are done
#pragma unroll
      for (int r = 0; r < R; ++r) stage[warp][r][lane ^ ((r & 1) << 2)] = wv[u][r];  // conflict-free both ways
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int p = 4 * j + q;
        const int v = (c0 + u) * 32 + p;
        const bool ok = c0 + u < nchunk && v < nvec;
        const uint4 a = (ok && live_token) ? __ldg(xg + v) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int t = 0; t < RT; ++t) {
          const uint4 b = stage[warp][t * 8 + g][p ^ ((g & 1) << 2)];
          mma_16816<T>(c[t], a.x, a.y, b.x, b.y);
          mma_16816<T>(c[t], a.z, a.w, b.z, b.w);
        }
      }
    }
  }
  if (!waited) {
    pdl_wait();
    pdl_trigger();
  }
  // c[t]: {token g, rows 2q and 2q + 1 of tile t; tokens g + 8: always zero}
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int i = 0; i < 2; ++i) part[warp][t][lane][i] = c[t][i];
  __syncthreads();
  for (int o = threadIdx.x; o < RT * 64; o += WARPS * 32) {
    const int t = o >> 6, l = (o >> 1) & 31, i = o & 1;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < WARPS; ++p) s += part[p][t][l][i];
    const int tok = l >> 2, n = row0 + t * 8 + (l & 3) * 2 + i;
    if (tok < tokens && n < out_features) out[static_cast<int64_t>(tok) * out_stride + n] = from_f<T>(s);
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
cudaError_t launch_group(const T* x, const T* w, T* out, int in_features, int out_features, cudaStream_t stream) {
  if constexpr (NT <= 2) {  // long rows: 2 rows per CTA, twice the CTAs (ASTRA_LONG_ROWS says why)
    if (static_cast<unsigned>(in_features) > static_cast<unsigned>(NT == 1 ? ASTRA_LONG_ROWS_1 : ASTRA_LONG_ROWS))
      return launch(linear_kernel<T, NT, 2>, dim3((out_features + 1) / 2), kThreads, stream, x, w, out, in_features,
                    out_features, out_features);
  }
  const dim3 grid((out_features + kRows - 1) / kRows);
  return launch(linear_kernel<T, NT>, grid, kThreads, stream, x, w, out, in_features, out_features, out_features);
}

// shape -> CTA (measured on an H200, 3-8 tokens): 16-row CTAs where there are >= 200 of them (two per SM: the
// registers), else 8-row CTAs with two chunks in flight per warp (twice the CTAs). Both 8 warps. 16 warps of one chunk
// each on the small grids were as fast chained but slower in context (results/2026-11-27-h200/ §1)
template <typename T>
cudaError_t launch_mma(const T* x, const T* w, T* out, int tokens, int in_features, int out_features,
                       cudaStream_t stream) {
  const int ctas16 = (out_features + 15) / 16;
  if (ctas16 >= 200)
    return launch(linear_mma_kernel<T, 8, 2, 1>, dim3(ctas16), 8 * 32, stream, x, w, out, tokens, in_features,
                  out_features, out_features);
  return launch(linear_mma_kernel<T, 8, 1, 2>, dim3((out_features + 7) / 8), 8 * 32, stream, x, w, out, tokens,
                in_features, out_features, out_features);
}

template <typename T>
cudaError_t dispatch(const void* xp, const void* wp, void* op, int tokens, int in_features, int out_features,
                     cudaStream_t stream) {
  const T* x = static_cast<const T*>(xp);
  const T* w = static_cast<const T*>(wp);
  T* out = static_cast<T*>(op);
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  if (in_features % 8 != 0 || !aligned)
    return launch(linear_scalar_kernel<T>, dim3((out_features + kScalarWarps - 1) / kScalarWarps), kScalarWarps * 32,
                  stream, x, w, out, tokens, in_features, out_features);
  const bool tensor_cores = tokens >= kMmaFrom && device_major() >= 9;
  for (int t0 = 0; t0 < tokens; t0 += kMaxGroup) {
    const int nt = min(kMaxGroup, tokens - t0);
    const T* xg = x + static_cast<int64_t>(t0) * in_features;
    T* og = out + static_cast<int64_t>(t0) * out_features;
    cudaError_t err = cudaErrorInvalidValue;
    if (tensor_cores) {  // every group, the last one too (even a 1-token tail: one path per call)
      err = launch_mma<T>(xg, w, og, nt, in_features, out_features, stream);
      if (err != cudaSuccess) return err;
      continue;
    }
    switch (nt) {
      case 1: err = launch_group<T, 1>(xg, w, og, in_features, out_features, stream); break;
      case 2: err = launch_group<T, 2>(xg, w, og, in_features, out_features, stream); break;
      case 3: err = launch_group<T, 3>(xg, w, og, in_features, out_features, stream); break;
      case 4: err = launch_group<T, 4>(xg, w, og, in_features, out_features, stream); break;
      case 5: err = launch_group<T, 5>(xg, w, og, in_features, out_features, stream); break;
      case 6: err = launch_group<T, 6>(xg, w, og, in_features, out_features, stream); break;
      case 7: err = launch_group<T, 7>(xg, w, og, in_features, out_features, stream); break;
      default: err = launch_group<T, 8>(xg, w, og, in_features, out_features, stream); break;
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace astra_lin

extern "C" cudaError_t astra_linear(const void* x, const void* weight, void* out, int64_t num_tokens,
                                    int64_t in_features, int64_t out_features, int dtype, cudaStream_t stream) {
  using namespace astra_lin;
  if (num_tokens < 0 || in_features < 1 || out_features < 1) return cudaErrorInvalidValue;
  if (num_tokens > (int64_t(1) << 20) || in_features > (int64_t(1) << 24) || out_features > (int64_t(1) << 24))
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), k = static_cast<int>(in_features), n = static_cast<int>(out_features);
  switch (dtype) {
    case 1: return dispatch<__half>(x, weight, out, t, k, n, stream);
    case 2: return dispatch<__nv_bfloat16>(x, weight, out, t, k, n, stream);
    default: return cudaErrorInvalidValue;
  }
}
