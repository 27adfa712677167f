// The tuning sandbox behind kernels/linear/kernel.cu (2026-11-26, H200; tables in results/2026-11-26-h200/linear/tuning/):
// decode GEMV out[t, n] = sum_k x[t, k] * w[n, k], bf16, fp32 accumulation, in two designs:
//  * gemv<NT, RB, U>: FMA, a CTA of 256 threads owns RB rows, each thread U 16-byte vectors per row in flight (the
//    shipped kernel is RB = 4, U = 1);
//  * gemv_mma<MT, WARPS, U, CONTIG>: mma.sync m16n8k16 with the tokens as M (padded to 16) and 8 weight rows as N,
//    WARPS warps splitting K (lost to the FMA design at 1-2 tokens; won at 4-8 tokens on some widths only).
// Run: python3 kernels/dev/linear_tune/gemv_tune.py TxKxN,... (torch only; builds this file with nvcc).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
constexpr int kThreads = 256;
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) { float2 p = __bfloat1622float2(e[i]); f[2*i] = p.x; f[2*i+1] = p.y; }
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int NT, int RB, int U>
__global__ void __launch_bounds__(kThreads) gemv(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                                 __nv_bfloat16* __restrict__ out, int K, int N) {
  __shared__ float red[kThreads / 32][RB * NT];
  const int K8 = K >> 3, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint4* w4 = reinterpret_cast<const uint4*>(w);
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  const int nblocks = (N + RB - 1) / RB;
  for (int rb = blockIdx.x; rb < nblocks; rb += gridDim.x) {
    const int row0 = rb * RB;
    float acc[RB][NT];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    for (int c0 = threadIdx.x; c0 < K8; c0 += kThreads * U) {
      uint4 wv[RB][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + kThreads * u;
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          const int row = min(row0 + r, N - 1);
          wv[r][u] = c < K8 ? ld_stream(w4 + (int64_t)row * K8 + c) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + kThreads * u;
        if (c < K8) {
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            float a[8];
            unpack8(__ldg(x4 + (int64_t)t * K8 + c), a);
#pragma unroll
            for (int r = 0; r < RB; ++r) {
              float b[8];
              unpack8(wv[r][u], b);
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(a[j], b[j], acc[r][t]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float v = warp_sum(acc[r][t]);
        if (lane == 0) red[warp][r * NT + t] = v;
      }
    __syncthreads();
    if (threadIdx.x < RB * NT) {
      const int r = threadIdx.x / NT, t = threadIdx.x % NT;
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < kThreads / 32; ++q) s += red[q][threadIdx.x];
      if (row0 + r < N) out[(int64_t)t * N + row0 + r] = __float2bfloat16_rn(s);
    }
    __syncthreads();
  }
}
template <int NT, int RB, int U>
static cudaError_t go(const void* x, const void* w, void* o, int K, int N, int grid, cudaStream_t s) {
  int nb = (N + RB - 1) / RB;
  if (grid <= 0 || grid > nb) grid = nb;
  gemv<NT, RB, U><<<grid, kThreads, 0, s>>>((const __nv_bfloat16*)x, (const __nv_bfloat16*)w, (__nv_bfloat16*)o, K, N);
  return cudaGetLastError();
}
template <int NT>
static cudaError_t by_cfg(const void* x, const void* w, void* o, int K, int N, int rb, int u, int grid, cudaStream_t s) {
#define C(R, UU) if (rb == R && u == UU) return go<NT, R, UU>(x, w, o, K, N, grid, s);
  C(1, 2) C(1, 4) C(1, 8) C(2, 1) C(2, 2) C(2, 4) C(4, 1) C(4, 2) C(4, 4) C(8, 1) C(8, 2)
#undef C
  return cudaErrorInvalidValue;
}
extern "C" cudaError_t tune_gemv(const void* x, const void* w, void* o, int T, int K, int N, int rb, int u, int grid,
                                 cudaStream_t s) {
  switch (T) {
    case 1: return by_cfg<1>(x, w, o, K, N, rb, u, grid, s);
    case 2: return by_cfg<2>(x, w, o, K, N, rb, u, grid, s);
    case 4: return by_cfg<4>(x, w, o, K, N, rb, u, grid, s);
    case 8: return by_cfg<8>(x, w, o, K, N, rb, u, grid, s);
  }
  return cudaErrorInvalidValue;
}

// ---- tensor-core variant: A = x (tokens as M, padded to 16), B = W^T (8 weight rows as N), m16n8k16
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <int MT, int WARPS, int U, bool CONTIG>
__global__ void __launch_bounds__(WARPS * 32) gemv_mma(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                                       __nv_bfloat16* __restrict__ out, int T, int K, int N) {
  __shared__ float red[WARPS][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int K8 = K >> 3, nchunks = (K + 31) >> 5;
  const int n0 = blockIdx.x * 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(w) + (int64_t)min(n0 + g, N - 1) * K8;
  const uint4* xa_p = reinterpret_cast<const uint4*>(x) + (int64_t)g * K8;
  const uint4* xb_p = reinterpret_cast<const uint4*>(x) + (int64_t)(g + 8) * K8;
  const bool ta = g < T, tb = MT == 2 && g + 8 < T;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int j0 = CONTIG ? warp * U : warp; j0 < nchunks; j0 += WARPS * U) {
    uint4 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (CONTIG ? j0 + u : j0 + WARPS * u) * 4 + q;
      wv[u] = v < K8 ? ld_stream(wrow + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = (CONTIG ? j0 + u : j0 + WARPS * u) * 4 + q;
      const bool ok = v < K8;
      const uint4 xa = (ok && ta) ? __ldg(xa_p + v) : make_uint4(0, 0, 0, 0);
      const uint4 xb = (ok && tb) ? __ldg(xb_p + v) : make_uint4(0, 0, 0, 0);
      mma_bf16(c, xa.x, xb.x, xa.y, xb.y, wv[u].x, wv[u].y);
      mma_bf16(c, xa.z, xb.z, xa.w, xb.w, wv[u].z, wv[u].w);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][lane][i] = c[i];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int l = threadIdx.x >> 2, i = threadIdx.x & 3;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < WARPS; ++p) s += red[p][l][i];
    const int tok = (l >> 2) + (i >= 2 ? 8 : 0), n = n0 + (l & 3) * 2 + (i & 1);
    if (tok < T && n < N) out[(int64_t)tok * N + n] = __float2bfloat16_rn(s);
  }
}
template <int MT, int WARPS, int U>
static cudaError_t gom(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  if (U >= 100) { gemv_mma<MT, WARPS, U % 100, true><<<(N + 7) / 8, WARPS * 32, 0, s>>>((const __nv_bfloat16*)x, (const __nv_bfloat16*)w, (__nv_bfloat16*)o, T, K, N); return cudaGetLastError(); }
  gemv_mma<MT, WARPS, U, false><<<(N + 7) / 8, WARPS * 32, 0, s>>>((const __nv_bfloat16*)x, (const __nv_bfloat16*)w, (__nv_bfloat16*)o, T, K, N);
  return cudaGetLastError();
}
template <int MT>
static cudaError_t mcfg(const void* x, const void* w, void* o, int T, int K, int N, int wp, int u, cudaStream_t s) {
#define C(WW, UU) if (wp == WW && u == UU) return gom<MT, WW, UU>(x, w, o, T, K, N, s);
  C(4, 8) C(8, 2) C(8, 8) C(16, 8) C(4, 104) C(4, 108) C(8, 102) C(8, 104) C(8, 108) C(16, 102) C(16, 104) C(16, 108)
#undef C
  return cudaErrorInvalidValue;
}
extern "C" cudaError_t tune_mma(const void* x, const void* w, void* o, int T, int K, int N, int wp, int u, cudaStream_t s) {
  return T <= 8 ? mcfg<1>(x, w, o, T, K, N, wp, u, s) : mcfg<2>(x, w, o, T, K, N, wp, u, s);
}
