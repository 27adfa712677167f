// astra-sglang moe_experts: a MoE layer's routed experts at decode sizes (the gate_up GEMM, SiLU-and-mul, the down
// GEMM with the router weights, the top-k sum) as two weight-streaming GEMV launches:
//   act[t, k, j] = T( silu(T(g)) * T(u) ),  g = sum_h x[t, h] w13[e, j, h],  u = sum_h x[t, h] w13[e, I + j, h]
//   out[t, h]    = T( s * T( sum_k T( w[t, k] * sum_j act[t, k, j] w2[e, h, j] ) ) )      e = topk_ids[t, k]
// fp32 math, rounded to the model dtype T where SGLang's fused_experts rounds (its two Triton GEMMs' outputs, the
// activation's, the top-k sum's; s is routed_scaling_factor, its product rounded again only when s != 1).
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_experts(const void* x, const void* w13, const void* w2,
//           const void* topk_weights, const void* topk_ids, void* act, void* out, int64_t num_tokens,
//           int64_t hidden, int64_t inter, int64_t num_experts, int64_t topk, double routed_scaling_factor,
//           int dtype, cudaStream_t stream)
// x [T, H], w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], topk_weights [T, K] fp32, topk_ids [T, K] int32,
// act [T, K, I] scratch, out [T, H] (may be x itself: SGLang's in-place call), all contiguous; dtype 1 fp16, 2 bf16;
// H and I multiples of 8, pointers 16-byte aligned. An id outside [0, E) (-1: another rank's expert under expert
// parallelism) contributes nothing, as SGLang's filtered kernels write zeros for it. Launches on `stream` only; no
// allocation, no host sync.
//
// Why: at 1-2 tokens SGLang's fused_experts aligns the ids into 16-row blocks (moe_align_block_size), runs a Triton
// tensor-core GEMM per routed expert block (mostly padding rows), the activation, the down GEMM, then a compiled sum:
// five launches, and the expert weights stream at ~3.4 TB/s (Qwen3-30B-A3B on an H200, kernels/NOTES.md 00a) where a
// dense GEMV reads 4.2. Here, as in kernels/linear:
//  * kernel 1: a CTA of ASTRA_K1_WARPS warps owns that many act columns of one (token, expert) slot; warp w reads the
//    gate row and the up row of its column (H / 8 16-byte vectors each, lane-strided, ASTRA_K1_UNROLL vectors of each
//    row in flight per lane) with ld.global.nc.L1::no_allocate, x through L1; butterflies; lane 0 rounds g and u,
//    applies silu, rounds again.
//  * kernel 2: a CTA of ASTRA_K2_WARPS warps owns that many output rows of one token; warp w takes its row of KG
//    routed experts' w2 at a time (I / 8 vectors each, lane-strided), ~ASTRA_K2_LOADS loads a lane issued before any
//    FMA, act through L1; lane 0 weights each expert's sum, rounds it, adds.
//  * Programmatic dependent launch: kernel 1 waits before anything (its expert ids come from the router) and triggers
//    at once; kernel 2 starts under kernel 1, reads its ids (written before kernel 1 passed its wait) and its first w2
//    vectors, and only then waits for act.
// Measured (H200, 2026-11-30, RESULTS.md): 1.11x SGLang's fused_experts at 1 token chained, 0.96x at 2 (experts two
// tokens share are read once per token), so the adapter takes 1 token. ~2.6 TB/s: kernel 1 cannot prefetch before its
// wait, and the macros' sweep (results/2026-11-30-h200/session29/moe_sweep.py) found kernel 2's occupancy the lever.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launches
#endif

namespace astra_moex {
namespace {

#ifndef ASTRA_K1_WARPS
#define ASTRA_K1_WARPS 8  // kernel 1: warps (act columns) per CTA
#endif
#ifndef ASTRA_K1_UNROLL
#define ASTRA_K1_UNROLL 8  // kernel 1: vectors of each of the two rows in flight per lane
#endif
#ifndef ASTRA_K2_WARPS
#define ASTRA_K2_WARPS 8  // kernel 2: warps (output rows) per CTA
#endif
#ifndef ASTRA_K2_LOADS
#define ASTRA_K2_LOADS 12  // kernel 2: w2 vectors in flight per lane (experts x vectors of a row); 24 was slower (sweep)
#endif

constexpr int kWarps1 = ASTRA_K1_WARPS;
constexpr int kWarps2 = ASTRA_K2_WARPS;
constexpr int kUnroll = ASTRA_K1_UNROLL;
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
template <typename T> __device__ __forceinline__ float rnd(float x) { return to_f(from_f<T>(x)); }

template <typename T>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  const T* p = reinterpret_cast<const T*>(&a);
  const T* q = reinterpret_cast<const T*>(&b);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(to_f(p[i]), to_f(q[i]), acc);
  return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// grid (ceil(I / W1), T * K): warp w -> act column blockIdx.x * W1 + w of slot blockIdx.y
template <typename T>
__global__ void __launch_bounds__(kWarps1 * 32) gate_up_act_kernel(const T* __restrict__ x, const T* __restrict__ w13,
                                                                   const int* __restrict__ ids, T* __restrict__ act,
                                                                   int hidden, int inter, int num_experts, int topk) {
  if (ASTRA_PDL) {  // the expert id comes from the router: nothing to prefetch
    pdl_wait();
    pdl_trigger();
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = blockIdx.y, j = blockIdx.x * kWarps1 + warp;
  const int e = ids[slot];
  if (e < 0 || e >= num_experts || j >= inter) return;  // no barrier below: a warp may leave alone
  const int nvec = hidden >> 3;
  const uint4* xv = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(slot / topk) * nvec;
  const uint4* gv = reinterpret_cast<const uint4*>(w13) + (static_cast<int64_t>(e) * 2 * inter + j) * nvec;
  const uint4* uv = gv + static_cast<int64_t>(inter) * nvec;
  float g = 0.f, u = 0.f;
  for (int v0 = lane; v0 < nvec; v0 += 32 * kUnroll) {
    uint4 gw[kUnroll], uw[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int v = v0 + 32 * i;
      gw[i] = v < nvec ? load_stream(gv + v) : make_uint4(0, 0, 0, 0);
      uw[i] = v < nvec ? load_stream(uv + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int v = v0 + 32 * i;
      if (v < nvec) {
        const uint4 a = __ldg(xv + v);
        g = dot8<T>(a, gw[i], g);
        u = dot8<T>(a, uw[i], u);
      }
    }
  }
  g = warp_sum(g);
  u = warp_sum(u);
  if (lane == 0) {
    const float gr = rnd<T>(g), ur = rnd<T>(u);  // the gate_up GEMM's output, as SGLang stores it
    act[static_cast<int64_t>(slot) * inter + j] = from_f<T>(gr / (1.f + __expf(-gr)) * ur);
  }
}

// grid (ceil(H / W2), T): warp w -> output row blockIdx.x * W2 + w of token blockIdx.y. The warp takes its row of KG
// routed experts at a time, VPL vectors of each per lane, all KG x VPL loads issued before any FMA (a w2 row is short:
// I / 8 vectors, 96 for I = 768, so a lane's whole share of a row is a few vectors).
template <typename T, int VPL, int KG>
__global__ void __launch_bounds__(kWarps2 * 32) down_sum_kernel(const T* __restrict__ w2, const float* __restrict__ wts,
                                                                const int* __restrict__ ids, const T* act, T* out,
                                                                int hidden, int inter, int num_experts, int topk,
                                                                float scale) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = blockIdx.y, h = min(blockIdx.x * kWarps2 + warp, hidden - 1);  // a row past the end redoes the last
  const bool live_row = blockIdx.x * kWarps2 + warp < hidden;
  const int nvec = inter >> 3;
  const uint4* w2v = reinterpret_cast<const uint4*>(w2);
  const int* tid = ids + static_cast<int64_t>(t) * topk;
  // the ids (the router's, complete before kernel 1 passed its wait) and the first w2 vectors are read before the
  // wait; act (kernel 1's) only after it
  bool waited = !ASTRA_PDL;
  float total = 0.f;
  for (int k0 = 0; k0 < topk; k0 += KG) {
    const uint4* row[KG];
#pragma unroll
    for (int i = 0; i < KG; ++i) {
      const int e = k0 + i < topk ? tid[k0 + i] : -1;
      row[i] = (e >= 0 && e < num_experts) ? w2v + (static_cast<int64_t>(e) * hidden + h) * nvec : nullptr;
    }
    float acc[KG];
#pragma unroll
    for (int i = 0; i < KG; ++i) acc[i] = 0.f;
    for (int c0 = lane; c0 < nvec; c0 += 32 * VPL) {
      uint4 wv[KG][VPL];
#pragma unroll
      for (int i = 0; i < KG; ++i)
#pragma unroll
        for (int q = 0; q < VPL; ++q) {
          const int v = c0 + 32 * q;
          wv[i][q] = (row[i] && v < nvec) ? load_stream(row[i] + v) : make_uint4(0, 0, 0, 0);
        }
      if (!waited) {
        pdl_wait();
        pdl_trigger();
        waited = true;
      }
#pragma unroll
      for (int i = 0; i < KG; ++i) {
        const uint4* av = reinterpret_cast<const uint4*>(act) + (static_cast<int64_t>(t) * topk + k0 + i) * nvec;
#pragma unroll
        for (int q = 0; q < VPL; ++q) {
          const int v = c0 + 32 * q;
          if (row[i] && v < nvec) acc[i] = dot8<T>(av[v], wv[i][q], acc[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < KG; ++i) {
      const float s = warp_sum(acc[i]);
      // the down GEMM's output: the router weight applied in fp32, then rounded (SGLang's intermediate_cache3)
      if (row[i]) total += rnd<T>(s * wts[static_cast<int64_t>(t) * topk + k0 + i]);
    }
  }
  if (!waited) {  // a lane past every row's vectors (I < 256) or no expert: still wait before the dependents start
    pdl_wait();
    pdl_trigger();
  }
  if (lane == 0 && live_row) {
    float y = rnd<T>(total);  // the top-k sum, as SGLang stores it
    if (scale != 1.f) y = y * scale;  // then scaled in place (out.mul_)
    out[static_cast<int64_t>(t) * hidden + h] = from_f<T>(y);
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

// the down kernel for rows of `nvec` vectors: VPL vectors of each of KG experts per lane, ~ASTRA_K2_LOADS in flight
template <typename T, int VPL>
cudaError_t launch_down(dim3 grid, cudaStream_t stream, const T* w2, const float* wts, const int* ids, const T* act,
                        T* out, int hidden, int inter, int experts, int topk, float scale) {
  constexpr int kg = ASTRA_K2_LOADS / VPL < 1 ? 1 : (ASTRA_K2_LOADS / VPL > 8 ? 8 : ASTRA_K2_LOADS / VPL);
  return launch(down_sum_kernel<T, VPL, kg>, grid, kWarps2 * 32, stream, w2, wts, ids, act, out, hidden, inter,
                experts, topk, scale);
}

template <typename T>
cudaError_t dispatch(const void* x, const void* w13, const void* w2, const float* wts, const int* ids, void* act,
                     void* out, int tokens, int hidden, int inter, int experts, int topk, float scale,
                     cudaStream_t stream) {
  cudaError_t err = launch(gate_up_act_kernel<T>, dim3((inter + kWarps1 - 1) / kWarps1, tokens * topk), kWarps1 * 32,
                           stream, static_cast<const T*>(x), static_cast<const T*>(w13), ids, static_cast<T*>(act),
                           hidden, inter, experts, topk);
  if (err != cudaSuccess) return err;
  const dim3 grid((hidden + kWarps2 - 1) / kWarps2, tokens);
  const T* w = static_cast<const T*>(w2);
  const T* a = static_cast<const T*>(act);
  T* o = static_cast<T*>(out);
  const int lanes = (inter / 8 + 31) / 32;  // vectors of a w2 row per lane
  switch (lanes) {
    case 1: return launch_down<T, 1>(grid, stream, w, wts, ids, a, o, hidden, inter, experts, topk, scale);
    case 2: return launch_down<T, 2>(grid, stream, w, wts, ids, a, o, hidden, inter, experts, topk, scale);
    case 3: return launch_down<T, 3>(grid, stream, w, wts, ids, a, o, hidden, inter, experts, topk, scale);
    case 4: return launch_down<T, 4>(grid, stream, w, wts, ids, a, o, hidden, inter, experts, topk, scale);
    case 5: case 6: return launch_down<T, 6>(grid, stream, w, wts, ids, a, o, hidden, inter, experts, topk, scale);
    default: return launch_down<T, 8>(grid, stream, w, wts, ids, a, o, hidden, inter, experts, topk, scale);
  }
}

}  // namespace
}  // namespace astra_moex

extern "C" cudaError_t astra_moe_experts(const void* x, const void* w13, const void* w2, const void* topk_weights,
                                         const void* topk_ids, void* act, void* out, int64_t num_tokens,
                                         int64_t hidden, int64_t inter, int64_t num_experts, int64_t topk,
                                         double routed_scaling_factor, int dtype, cudaStream_t stream) {
  using namespace astra_moex;
  if (num_tokens < 0 || hidden < 8 || inter < 8 || num_experts < 1 || topk < 1) return cudaErrorInvalidValue;
  if (hidden % 8 || inter % 8) return cudaErrorInvalidValue;  // 16-byte vectors only (the adapter declines others)
  if (hidden > (int64_t(1) << 20) || inter > (int64_t(1) << 20) || num_experts > (int64_t(1) << 20) || topk > 64)
    return cudaErrorInvalidValue;
  if (num_tokens * topk > 65535) return cudaErrorInvalidValue;  // grid y (a decode op: the adapter takes few tokens)
  const uintptr_t align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w13) |
                          reinterpret_cast<uintptr_t>(w2) | reinterpret_cast<uintptr_t>(act);
  if (align % 16) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), h = static_cast<int>(hidden), i = static_cast<int>(inter);
  const int e = static_cast<int>(num_experts), k = static_cast<int>(topk);
  const float s = static_cast<float>(routed_scaling_factor);
  const float* wts = static_cast<const float*>(topk_weights);
  const int* ids = static_cast<const int*>(topk_ids);
  switch (dtype) {
    case 1: return dispatch<__half>(x, w13, w2, wts, ids, act, out, t, h, i, e, k, s, stream);
    case 2: return dispatch<__nv_bfloat16>(x, w13, w2, wts, ids, act, out, t, h, i, e, k, s, stream);
    default: return cudaErrorInvalidValue;
  }
}
