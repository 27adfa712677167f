// Sandbox (git-ignored): decode GEMV for 1..16 tokens on tensor cores, weights loaded as the FMA kernel loads them
// (a warp reads 512 contiguous bytes of one row per instruction, ld.global.nc.L1::no_allocate), transposed through a
// warp-private swizzled shared buffer, then mma.m16n8k16 with A = x (tokens as M), B = 8 weight rows (N).
// The k order inside an mma is permuted consistently for A and B: thread (g, q) takes physical k 8p..8p+7 with
// p = 4j + q of the 256-wide chunk, so x and weights both come as 16-byte vectors (two mmas per vector).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace {
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// MT: 1 (tokens <= 8) or 2 (<= 16); RT: 8-row tiles per CTA; U: 256-wide chunks in flight per warp
template <int MT, int WARPS, int RT, int U, bool PDL>
__global__ void __launch_bounds__(WARPS * 32) gemv_tx(const __nv_bfloat16* __restrict__ x,
                                                      const __nv_bfloat16* __restrict__ w,
                                                      __nv_bfloat16* __restrict__ out, int T, int K, int N) {
  constexpr int R = 8 * RT;
  __shared__ __align__(16) uint4 stage[WARPS][R][32];
  __shared__ float red[WARPS][RT][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * R;
  const int K8 = K >> 3, nchunk = (K8 + 31) >> 5;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* xa_p = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g) * K8;
  const uint4* xb_p = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g + 8) * K8;
  const bool ta = g < T, tb = MT == 2 && g + 8 < T;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = wv + static_cast<int64_t>(min(n0 + r, N - 1)) * K8;
  float c[RT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
  bool waited = !PDL;
  for (int c0 = warp * U; c0 < nchunk; c0 += WARPS * U) {
    uint4 v[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int vec = (c0 + u) * 32 + lane;
      const bool ok = c0 + u < nchunk && vec < K8;
#pragma unroll
      for (int r = 0; r < R; ++r) v[u][r] = ok ? ld_stream(wrow[r] + vec) : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {
      asm volatile("griddepcontrol.wait;" ::: "memory");
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      __syncwarp();
#pragma unroll
      for (int r = 0; r < R; ++r) stage[warp][r][lane ^ ((r & 1) << 2)] = v[u][r];
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int p = 4 * j + q;
        const int vec = (c0 + u) * 32 + p;
        const bool ok = c0 + u < nchunk && vec < K8;
        const uint4 xa = (ok && ta) ? __ldg(xa_p + vec) : make_uint4(0, 0, 0, 0);
        const uint4 xb = (ok && tb) ? __ldg(xb_p + vec) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int t = 0; t < RT; ++t) {
          const uint4 b = stage[warp][t * 8 + g][p ^ ((g & 1) << 2)];
          mma(c[t], xa.x, xb.x, xa.y, xb.y, b.x, b.y);
          mma(c[t], xa.z, xb.z, xa.w, xb.w, b.z, b.w);
        }
      }
    }
  }
  if (!waited) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][t][lane][i] = c[t][i];
  __syncthreads();
  for (int o = threadIdx.x; o < RT * 128; o += WARPS * 32) {
    const int t = o >> 7, l = (o >> 2) & 31, i = o & 3;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < WARPS; ++p) s += red[p][t][l][i];
    const int tok = (l >> 2) + (i >= 2 ? 8 : 0), n = n0 + t * 8 + (l & 3) * 2 + (i & 1);
    if (tok < T && n < N) out[static_cast<int64_t>(tok) * N + n] = __float2bfloat16_rn(s);
  }
}

template <int MT, int WARPS, int RT, int U>
cudaError_t go(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + 8 * RT - 1) / (8 * RT));
  cfg.blockDim = dim3(WARPS * 32);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, gemv_tx<MT, WARPS, RT, U, true>, (const __nv_bfloat16*)x, (const __nv_bfloat16*)w,
                            (__nv_bfloat16*)o, T, K, N);
}
template <int WARPS, int RT, int U>
cudaError_t go_t(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  return T > 8 ? go<2, WARPS, RT, U>(x, w, o, T, K, N, s) : go<1, WARPS, RT, U>(x, w, o, T, K, N, s);
}
}  // namespace

extern "C" cudaError_t tune_tx(const void* x, const void* w, void* o, int T, int K, int N, int warps, int rt, int u,
                               cudaStream_t s) {
  if (T < 1 || T > 16 || K % 8) return cudaErrorInvalidValue;
#define C(W, R, U) if (warps == W && rt == R && u == U) return go_t<W, R, U>(x, w, o, T, K, N, s);
  C(4, 1, 1) C(4, 1, 2) C(4, 2, 1) C(8, 1, 1) C(8, 1, 2) C(8, 2, 1) C(16, 1, 1) C(2, 1, 2) C(2, 2, 2)
#undef C
  return cudaErrorInvalidValue;
}

// ---- variant: the weights land in the warp-private stage by cp.async (no registers), S stages per warp
namespace {
__device__ __forceinline__ void cp16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
template <int MT, int WARPS, int RT, int S>
__global__ void __launch_bounds__(WARPS * 32) gemv_cpa(const __nv_bfloat16* __restrict__ x,
                                                       const __nv_bfloat16* __restrict__ w,
                                                       __nv_bfloat16* __restrict__ out, int T, int K, int N) {
  constexpr int R = 8 * RT;
  extern __shared__ __align__(16) uint4 dyn[];
  __shared__ float red[WARPS][RT][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  uint4* my = dyn + warp * S * R * 32;
  const int n0 = blockIdx.x * R;
  const int K8 = K >> 3, nchunk = (K8 + 31) >> 5;
  const int nmine = warp < nchunk ? (nchunk - warp + WARPS - 1) / WARPS : 0;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* xa_p = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g) * K8;
  const uint4* xb_p = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(g + 8) * K8;
  const bool ta = g < T, tb = MT == 2 && g + 8 < T;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = wv + static_cast<int64_t>(min(n0 + r, N - 1)) * K8;
  auto issue = [&](int i) {
    if (i < nmine) {
      const int vec = (warp + i * WARPS) * 32 + lane;
      const bool ok = vec < K8;
      uint4* dst = my + (i % S) * R * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) cp16(dst + r * 32 + (lane ^ ((r & 1) << 2)), wrow[r] + (ok ? vec : 0), ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  float c[RT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
  for (int i = 0; i < nmine; ++i) {
    issue(i + S - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
    __syncwarp();
    const uint4* buf = my + (i % S) * R * 32;
    const int cbase = (warp + i * WARPS) * 32;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int p = 4 * j + q;
      const int vec = cbase + p;
      const bool ok = vec < K8;
      const uint4 xa = (ok && ta) ? __ldg(xa_p + vec) : make_uint4(0, 0, 0, 0);
      const uint4 xb = (ok && tb) ? __ldg(xb_p + vec) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int t = 0; t < RT; ++t) {
        const uint4 b = buf[(t * 8 + g) * 32 + (p ^ ((g & 1) << 2))];
        mma(c[t], xa.x, xb.x, xa.y, xb.y, b.x, b.y);
        mma(c[t], xa.z, xb.z, xa.w, xb.w, b.z, b.w);
      }
    }
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
  for (int t = 0; t < RT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][t][lane][i] = c[t][i];
  __syncthreads();
  for (int o = threadIdx.x; o < RT * 128; o += WARPS * 32) {
    const int t = o >> 7, l = (o >> 2) & 31, i = o & 3;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < WARPS; ++p) s += red[p][t][l][i];
    const int tok = (l >> 2) + (i >= 2 ? 8 : 0), n = n0 + t * 8 + (l & 3) * 2 + (i & 1);
    if (tok < T && n < N) out[static_cast<int64_t>(tok) * N + n] = __float2bfloat16_rn(s);
  }
}
template <int MT, int WARPS, int RT, int S>
cudaError_t go_cpa(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  const int smem = WARPS * S * 8 * RT * 512;
  auto kern = gemv_cpa<MT, WARPS, RT, S>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + 8 * RT - 1) / (8 * RT));
  cfg.blockDim = dim3(WARPS * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, (const __nv_bfloat16*)x, (const __nv_bfloat16*)w, (__nv_bfloat16*)o, T, K, N);
}
template <int WARPS, int RT, int S>
cudaError_t go_cpa_t(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  return T > 8 ? go_cpa<2, WARPS, RT, S>(x, w, o, T, K, N, s) : go_cpa<1, WARPS, RT, S>(x, w, o, T, K, N, s);
}
}  // namespace

extern "C" cudaError_t tune_cpa(const void* x, const void* w, void* o, int T, int K, int N, int warps, int rt, int st,
                                cudaStream_t s) {
  if (T < 1 || T > 16 || K % 8) return cudaErrorInvalidValue;
#define C(W, R, S) if (warps == W && rt == R && st == S) return go_cpa_t<W, R, S>(x, w, o, T, K, N, s);
  C(4, 1, 2) C(4, 1, 3) C(4, 1, 4) C(4, 2, 2) C(4, 2, 3) C(8, 1, 2) C(8, 1, 3) C(8, 2, 2) C(16, 1, 2) C(2, 1, 4) C(2, 2, 3)
#undef C
  return cudaErrorInvalidValue;
}

// ---- variant ws: KS warps split one 8-row group's chunks; each warp streams its chunks through an S-deep cp.async
// pipeline in its own stage buffers (no CTA barrier in the loop); CTA = W warps = W / KS row groups
namespace {
template <int W, int KS, int S>
__global__ void __launch_bounds__(W * 32) gemv_ws(const __nv_bfloat16* __restrict__ x,
                                                  const __nv_bfloat16* __restrict__ w,
                                                  __nv_bfloat16* __restrict__ out, int T, int K, int N) {
  constexpr int G = W / KS;
  extern __shared__ __align__(16) uint4 dyn[];
  __shared__ float red[W][32][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int grp = warp / KS, split = warp % KS;
  uint4* my = dyn + warp * S * 8 * 32;
  const int n0 = (blockIdx.x * G + grp) * 8;
  const int K8 = K >> 3, nchunk = (K8 + 31) >> 5;
  const int nmine = split < nchunk ? (nchunk - split + KS - 1) / KS : 0;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* xa_p = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(min(g, T - 1)) * K8;
  const bool ta = g < T;
  const uint4* wrow[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) wrow[r] = wv + static_cast<int64_t>(min(n0 + r, N - 1)) * K8;
  auto issue = [&](int i) {
    if (i < nmine) {
      const int vec = (split + i * KS) * 32 + lane;
      const bool ok = vec < K8;
      uint4* dst = my + (i % S) * 8 * 32;
#pragma unroll
      for (int r = 0; r < 8; ++r) cp16(dst + r * 32 + (lane ^ ((r & 1) << 2)), wrow[r] + (ok ? vec : 0), ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < nmine; ++i) {
    issue(i + S - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
    __syncwarp();
    const uint4* buf = my + (i % S) * 8 * 32;
    const int cbase = (split + i * KS) * 32;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int p = 4 * j + q;
      const int vec = cbase + p;
      const uint4 a = (vec < K8 && ta) ? __ldg(xa_p + vec) : make_uint4(0, 0, 0, 0);
      const uint4 b = buf[g * 32 + (p ^ ((g & 1) << 2))];
      mma(c, a.x, 0u, a.y, 0u, b.x, b.y);
      mma(c, a.z, 0u, a.w, 0u, b.z, b.w);
    }
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (KS == 1) {
    if (g < T) {
      const int n = n0 + 2 * q;
      if (n < N) out[static_cast<int64_t>(g) * N + n] = __float2bfloat16_rn(c[0]);
      if (n + 1 < N) out[static_cast<int64_t>(g) * N + n + 1] = __float2bfloat16_rn(c[1]);
    }
    return;
  }
  red[warp][lane][0] = c[0];
  red[warp][lane][1] = c[1];
  __syncthreads();
  if (split == 0) {
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int p = 0; p < KS; ++p) { s0 += red[warp + p][lane][0]; s1 += red[warp + p][lane][1]; }
    if (g < T) {
      const int n = n0 + 2 * q;
      if (n < N) out[static_cast<int64_t>(g) * N + n] = __float2bfloat16_rn(s0);
      if (n + 1 < N) out[static_cast<int64_t>(g) * N + n + 1] = __float2bfloat16_rn(s1);
    }
  }
}
template <int W, int KS, int S>
cudaError_t go_ws(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  const int smem = W * S * 8 * 512;
  auto kern = gemv_ws<W, KS, S>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  constexpr int rows = 8 * (W / KS);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + rows - 1) / rows);
  cfg.blockDim = dim3(W * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, (const __nv_bfloat16*)x, (const __nv_bfloat16*)w, (__nv_bfloat16*)o, T, K, N);
}
}  // namespace

extern "C" cudaError_t tune_ws(const void* x, const void* w, void* o, int T, int K, int N, int warps, int ks, int st,
                               cudaStream_t s) {
  if (T < 1 || T > 8 || K % 8) return cudaErrorInvalidValue;
#define C(W, KS, S) if (warps == W && ks == KS && st == S) return go_ws<W, KS, S>(x, w, o, T, K, N, s);
  C(4, 1, 4) C(4, 1, 6) C(4, 2, 4) C(4, 2, 6) C(8, 2, 4) C(4, 4, 4) C(8, 4, 3) C(8, 4, 4) C(2, 1, 8) C(8, 1, 3)
  C(2, 2, 6) C(4, 4, 6) C(8, 8, 3)
#undef C
  return cudaErrorInvalidValue;
}

// ---- variant pf: the register transpose (gemv_tx) with the next chunk's weights loaded before this chunk's
// transpose and mmas (a one-deep software pipeline per warp), so a warp always has a chunk's loads in flight
namespace {
template <int W, int RT>
__global__ void __launch_bounds__(W * 32) gemv_pf(const __nv_bfloat16* __restrict__ x,
                                                  const __nv_bfloat16* __restrict__ w,
                                                  __nv_bfloat16* __restrict__ out, int T, int K, int N) {
  constexpr int R = 8 * RT;
  __shared__ __align__(16) uint4 stage[W][R][32];
  __shared__ float red[W][RT][32][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * R;
  const int K8 = K >> 3, nchunk = (K8 + 31) >> 5;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* xa_p = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(min(g, T - 1)) * K8;
  const bool ta = g < T;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = wv + static_cast<int64_t>(min(n0 + r, N - 1)) * K8;
  float c[RT][4];
#pragma unroll
  for (int t = 0; t < RT; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
  uint4 nxt[R];
  auto load = [&](int chunk) {
    const int vec = chunk * 32 + lane;
    const bool ok = chunk < nchunk && vec < K8;
#pragma unroll
    for (int r = 0; r < R; ++r) nxt[r] = ok ? ld_stream(wrow[r] + vec) : make_uint4(0, 0, 0, 0);
  };
  load(warp);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int ch = warp; ch < nchunk; ch += W) {
    uint4 cur[R];
#pragma unroll
    for (int r = 0; r < R; ++r) cur[r] = nxt[r];
    if (ch + W < nchunk) load(ch + W);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; ++r) stage[warp][r][lane ^ ((r & 1) << 2)] = cur[r];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int p = 4 * j + q;
      const int vec = ch * 32 + p;
      const uint4 a = (vec < K8 && ta) ? __ldg(xa_p + vec) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int t = 0; t < RT; ++t) {
        const uint4 b = stage[warp][t * 8 + g][p ^ ((g & 1) << 2)];
        mma(c[t], a.x, 0u, a.y, 0u, b.x, b.y);
        mma(c[t], a.z, 0u, a.w, 0u, b.z, b.w);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < RT; ++t) {
    red[warp][t][lane][0] = c[t][0];
    red[warp][t][lane][1] = c[t][1];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < RT * 64; o += W * 32) {
    const int t = o >> 6, l = (o >> 1) & 31, i = o & 1;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < W; ++p) s += red[p][t][l][i];
    const int tok = l >> 2, n = n0 + t * 8 + (l & 3) * 2 + i;
    if (tok < T && n < N) out[static_cast<int64_t>(tok) * N + n] = __float2bfloat16_rn(s);
  }
}
template <int W, int RT>
cudaError_t go_pf(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + 8 * RT - 1) / (8 * RT));
  cfg.blockDim = dim3(W * 32);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, gemv_pf<W, RT>, (const __nv_bfloat16*)x, (const __nv_bfloat16*)w,
                            (__nv_bfloat16*)o, T, K, N);
}
}  // namespace

extern "C" cudaError_t tune_pf(const void* x, const void* w, void* o, int T, int K, int N, int warps, int rt,
                               cudaStream_t s) {
  if (T < 1 || T > 8 || K % 8) return cudaErrorInvalidValue;
#define C(W, R) if (warps == W && rt == R) return go_pf<W, R>(x, w, o, T, K, N, s);
  C(2, 1) C(2, 2) C(4, 1) C(4, 2) C(8, 1) C(8, 2)
#undef C
  return cudaErrorInvalidValue;
}
