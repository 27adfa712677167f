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
// dense GEMV reads 4.2. Here, as in kernels/linear (weights with ld.global.nc.L1::no_allocate, activations through L1,
// fp32 sums), in the shapes launch-shape sweeps picked (results/2026-11-30-h200/session29/ and session30/, the
// macros below). Tokens are taken in windows of whole tokens (at most 32 slots, kernel 2's shared memory permitting):
// an expert several tokens of a window route to is read once for all of them (ASTRA_DEDUP).
//  * kernel 1 (gate_up + SiLU-and-mul): a CTA of ASTRA_K1_WARPS warps owns that many act columns of one (token,
//    expert) slot; warp w reads the gate row and the up row of its column (H / 8 16-byte vectors each, lane-strided,
//    U vectors of each row in flight per lane) and dots them with the x of every slot of its window routed to the same
//    expert (a later such slot's CTAs leave at once); butterflies; lane 0 rounds g and u, applies silu, rounds again.
//    One token a window: U and the CTAs an SM by the grid (8 vectors where two CTAs an SM hold the grid, 2 vectors at
//    six an SM where those hold it, 4 vectors at four an SM beyond). ASTRA_K1_COLS > 0 takes linear's CTA instead (256
//    threads sweeping 2 x COLS rows together; no window): as fast at Qwen3-30B-A3B's shape, faster at Qwen3-235B's
//    tp8, and over the check's tolerance once (2.01x production's error on one bf16 case, with 2-row chunks).
//  * kernel 2 (down + router weights + top-k sum): 256 threads own ASTRA_K2_ROWS output rows of a window's tokens;
//    work is cut into 32-vector chunks of one distinct routed expert's w2 rows (all ROWS rows of w2[e] are contiguous),
//    each dotted with the act of every slot routed to that expert; warp w takes chunks w, w + 8, ... ASTRA_K2_GROUP at
//    a time with every load issued before any FMA; per (slot, chunk, row) sums meet in shared memory, then each (slot,
//    row) gets its router weight and rounding, then each token's top-k sum in expert order. Shapes with more than 64
//    chunks a token (K x ceil(I / 256)) take a warp per output row of one token instead (down_sum_kernel).
//  * Programmatic dependent launch: kernel 1 waits before anything (its expert ids come from the router) and triggers
//    at once; kernel 2 starts under kernel 1, reads its ids (written before kernel 1 passed its wait) and its first w2
//    vectors, and only then waits for act.
// Measured (H200, 2026-11-30, RESULTS.md): 1.32x SGLang's fused_experts chained at 1 token (Qwen3-30B-A3B), 1.08x at
// 2; the decode step -9.86% at batch 1 and -0.60% at batch 2, so the adapter takes 2 tokens. At 4 tokens 0.96x (0.81x
// where the 4 tokens share their experts: SGLang's tensor-core GEMMs take them for the price of one).
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
#define ASTRA_K1_UNROLL 0  // kernel 1 at one token a window: vectors a row in flight per lane; 0: by its grid
#endif
#ifndef ASTRA_K2_WARPS
#define ASTRA_K2_WARPS 8  // down_sum_kernel: warps (output rows) per CTA
#endif
#ifndef ASTRA_K1_COLS
#define ASTRA_K1_COLS 0  // > 0: kernel 1 as linear's CTA, this many act columns a 256-thread CTA; 0: a warp a column
#endif
#ifndef ASTRA_K1_ITERS
#define ASTRA_K1_ITERS 1  // that kernel's 256-vector sweeps of a row issued before any FMA
#endif
#ifndef ASTRA_K2_ROWS
#define ASTRA_K2_ROWS 8  // kernel 2 over 32-vector chunks: output rows a 256-thread CTA; 0: down_sum_kernel
#endif
#ifndef ASTRA_K2_GROUP
#define ASTRA_K2_GROUP 2  // that kernel's chunks a warp issues before any FMA (x ASTRA_K2_ROWS loads a lane)
#endif
#ifndef ASTRA_DEDUP
#define ASTRA_DEDUP 1  // an expert several tokens share is read once (0: once per token)
#endif
#ifndef ASTRA_K1_MINB
#define ASTRA_K1_MINB 1  // with ASTRA_K1_UNROLL > 0: kernel 1's CTAs an SM the compiler must fit (launch bounds)
#endif
#ifndef ASTRA_K2_LOADS
#define ASTRA_K2_LOADS 12  // down_sum_kernel: w2 vectors in flight per lane (experts x vectors); 24 was slower
#endif

constexpr int kWarps1 = ASTRA_K1_WARPS;
constexpr int kWarps2 = ASTRA_K2_WARPS;
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

// an id this rank computes (-1: an expert another rank holds under expert parallelism; SGLang writes zeros for it)
__device__ __forceinline__ bool routed(int e, int num_experts) { return e >= 0 && e < num_experts; }

// act from the gate_up GEMV's fp32 sums: g and u rounded as SGLang's GEMM stores them, silu(g) * u rounded again
template <typename T>
__device__ __forceinline__ T silu_mul_rounded(float g, float u) {
  const float gr = rnd<T>(g), ur = rnd<T>(u);
  return from_f<T>(gr / (1.f + __expf(-gr)) * ur);
}

// out from the fp32 sum of the top-k rounded expert outputs: rounded as SGLang's sum stores it, then scaled in place
// (out.mul_) where the factor is not 1
template <typename T>
__device__ __forceinline__ T topk_sum_out(float total, float scale) {
  float y = rnd<T>(total);
  if (scale != 1.f) y = y * scale;
  return from_f<T>(y);
}

// grid (ceil(I / W1), T * K): warp w -> act column blockIdx.x * W1 + w of slot blockIdx.y and of every later slot of its
// window routed to the same expert (the CTAs of such a later slot leave at once), MS slots a sweep of the two rows.
template <typename T, int MS, int kUnroll, int kMinBlocks>
__global__ void __launch_bounds__(kWarps1 * 32, kMinBlocks)
    gate_up_act_kernel(const T* __restrict__ x, const T* __restrict__ w13, const int* __restrict__ ids,
                       T* __restrict__ act, int hidden, int inter, int num_experts, int topk, int nslots, int ws) {
  if (ASTRA_PDL) {  // the expert id comes from the router: nothing to prefetch
    pdl_wait();
    pdl_trigger();
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = blockIdx.y, j = blockIdx.x * kWarps1 + warp;
  int e, wb = slot;
  unsigned mask = 1u;  // the slots this CTA computes: bit i is slot wb + i
  if constexpr (MS == 1) {  // its own slot alone (ws 1)
    e = ids[slot];
    if (!routed(e, num_experts)) return;  // uniform over the CTA; no barrier below: a warp may leave alone
  } else {  // the window's ids in one read (lane i: slot wb + i), this slot's expert among them
    wb = slot - slot % ws;
    const int l = wb + lane;
    const int id = lane < ws && l < nslots ? ids[l] : -1;
    e = __shfl_sync(kFull, id, slot - wb);
    if (!routed(e, num_experts)) return;
    mask = __ballot_sync(kFull, lane < ws && l < nslots && id == e);
    if (__ffs(mask) - 1 != slot - wb) return;  // an earlier slot of the window computes this one
  }
  if (j >= inter) return;
  const int nvec = hidden >> 3;
  const uint4* gv = reinterpret_cast<const uint4*>(w13) + (static_cast<int64_t>(e) * 2 * inter + j) * nvec;
  const uint4* uv = gv + static_cast<int64_t>(inter) * nvec;
  while (mask) {  // MS of the expert's slots a sweep: the first MS set bits
    int sl[MS];
    const uint4* xv[MS];
#pragma unroll
    for (int q = 0; q < MS; ++q) {
      sl[q] = mask ? wb + __ffs(mask) - 1 : -1;
      mask &= mask - 1;
      xv[q] = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>((sl[q] < 0 ? slot : sl[q]) / topk) * nvec;
    }
    float g[MS], u[MS];
#pragma unroll
    for (int q = 0; q < MS; ++q) g[q] = u[q] = 0.f;
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
#pragma unroll
          for (int q = 0; q < MS; ++q) {
            if (sl[q] < 0) break;  // warp-uniform
            const uint4 a = __ldg(xv[q] + v);
            g[q] = dot8<T>(a, gw[i], g[q]);
            u[q] = dot8<T>(a, uw[i], u[q]);
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < MS; ++q) {
      if (sl[q] < 0) break;
      const float gs = warp_sum(g[q]), us = warp_sum(u[q]);
      if (lane == 0) act[static_cast<int64_t>(sl[q]) * inter + j] = silu_mul_rounded<T>(gs, us);
    }
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
      row[i] = routed(e, num_experts) ? w2v + (static_cast<int64_t>(e) * hidden + h) * nvec : nullptr;
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
  if (lane == 0 && live_row) out[static_cast<int64_t>(t) * hidden + h] = topk_sum_out<T>(total, scale);
}


// kernel 1 as linear's CTA: grid (ceil(I / C), T * K), 256 threads own C act columns (the C gate rows and the C up
// rows) of one slot and sweep the rows together, thread i taking vectors i, i + 256, ...; partial sums meet in shared
// memory.
template <typename T, int C, int IT>
__global__ void __launch_bounds__(256) gate_up_rows_kernel(const T* __restrict__ x, const T* __restrict__ w13,
                                                           const int* __restrict__ ids, T* __restrict__ act,
                                                           int hidden, int inter, int num_experts, int topk) {
  __shared__ float part[8][2 * C];
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = blockIdx.y, j0 = blockIdx.x * C;
  const int e = ids[slot];
  if (!routed(e, num_experts)) return;  // uniform over the CTA: no thread reaches the barrier
  const int nvec = hidden >> 3;
  const uint4* xv = reinterpret_cast<const uint4*>(x) + static_cast<int64_t>(slot / topk) * nvec;
  const uint4* base = reinterpret_cast<const uint4*>(w13) + static_cast<int64_t>(e) * 2 * inter * nvec;
  const uint4* row[2 * C];
#pragma unroll
  for (int c = 0; c < C; ++c) {  // columns past the end read the last one again; not stored
    const int j = min(j0 + c, inter - 1);
    row[c] = base + static_cast<int64_t>(j) * nvec;
    row[C + c] = base + static_cast<int64_t>(inter + j) * nvec;
  }
  float acc[2 * C];
#pragma unroll
  for (int r = 0; r < 2 * C; ++r) acc[r] = 0.f;
  for (int v0 = threadIdx.x; v0 < nvec; v0 += 256 * IT) {
    uint4 wv[IT][2 * C];
#pragma unroll
    for (int i = 0; i < IT; ++i)
#pragma unroll
      for (int r = 0; r < 2 * C; ++r) {
        const int v = v0 + 256 * i;
        wv[i][r] = v < nvec ? load_stream(row[r] + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int i = 0; i < IT; ++i) {
      const int v = v0 + 256 * i;
      if (v < nvec) {
        const uint4 a = __ldg(xv + v);
#pragma unroll
        for (int r = 0; r < 2 * C; ++r) acc[r] = dot8<T>(a, wv[i][r], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2 * C; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0) part[warp][r] = s;
  }
  __syncthreads();
  if (threadIdx.x < C && j0 + threadIdx.x < inter) {
    float g = 0.f, u = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      g += part[w][threadIdx.x];
      u += part[w][C + threadIdx.x];
    }
    act[static_cast<int64_t>(slot) * inter + j0 + threadIdx.x] = silu_mul_rounded<T>(g, u);
  }
}

constexpr int kTokenChunks = 64;  // the chunk kernel takes shapes of at most this many chunks a token (K x ceil(I / 256))
constexpr int kMaxChunks = 256;   // its shared partial sums: a window's slots x ceil(I / 256) chunks
constexpr int kMaxWindow = 32;   // slots a window (whole tokens): one warp's match of their ids

// kernel 2 over 32-vector chunks: grid (ceil(H / R), windows), 256 threads own R output rows of a window's tokens
// (slots [wb, wb + ws)). A chunk is 32 consecutive vectors of one distinct routed expert's w2 rows (chunk c: the
// window's expert c / cpr, vectors 32 (c % cpr) + lane), read for the R rows at once (R consecutive rows of w2[e] are
// contiguous) and multiplied by the act of every slot of the window routed to that expert (an expert two tokens share
// is read once); warp w takes chunks w, w + 8, ..., G at a time with all G x R loads issued before any FMA. Per (slot,
// chunk, row) sums meet in shared memory; then per (slot, row) the router weight and the rounding, then each token's
// top-k sum, in expert order.
template <typename T, int R, int G>
__global__ void __launch_bounds__(256) down_chunks_kernel(const T* __restrict__ w2, const float* __restrict__ wts,
                                                          const int* __restrict__ ids, const T* act, T* out,
                                                          int tokens, int hidden, int inter, int num_experts, int topk,
                                                          int ws, float scale) {
  __shared__ float part[kMaxChunks][R];
  __shared__ float ysum[kMaxWindow][R];
  __shared__ int lead_e[kMaxWindow];
  __shared__ unsigned lead_mask[kMaxWindow];
  __shared__ int nlead;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wb = blockIdx.y * ws, h0 = blockIdx.x * R;
  const int nw = min(ws, tokens * topk - wb);  // this window's slots
  const int nvec = inter >> 3, cpr = (nvec + 31) >> 5;
  const uint4* w2v = reinterpret_cast<const uint4*>(w2);
  if (warp == 0) {  // the window's distinct routed experts, in slot order, each with its slots (the router's ids)
    const int e = lane < nw ? ids[wb + lane] : -1;
    const bool ok = lane < nw && routed(e, num_experts);
    const unsigned same = __match_any_sync(kFull, ok ? e : -2 - lane);
    const bool lead = ok && __ffs(same) - 1 == lane;
    const unsigned leads = __ballot_sync(kFull, lead);
    if (lead) {
      const int li = __popc(leads & ((1u << lane) - 1u));
      lead_e[li] = e;
      lead_mask[li] = same;
    }
    if (lane == 0) nlead = __popc(leads);
  }
  __syncthreads();
  const int nch = nlead * cpr;
  bool waited = !ASTRA_PDL;
  for (int c0 = warp; c0 < nch; c0 += 8 * G) {
    uint4 wv[G][R];
    const uint4* wrow[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int c = c0 + 8 * g;
      const int li = c / cpr, v = (c - li * cpr) * 32 + lane;
      wrow[g] = (c < nch && v < nvec) ? w2v + static_cast<int64_t>(lead_e[li]) * hidden * nvec + v : nullptr;
#pragma unroll
      for (int r = 0; r < R; ++r)  // rows past the end read the last row again; not stored
        wv[g][r] = wrow[g] ? load_stream(wrow[g] + static_cast<int64_t>(min(h0 + r, hidden - 1)) * nvec)
                           : make_uint4(0, 0, 0, 0);
    }
    if (!waited) {  // the ids and the first w2 vectors before the wait; act (kernel 1's) after it
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int c = c0 + 8 * g;
      if (c >= nch) break;  // warp-uniform
      const int li = c / cpr, q = c - li * cpr, v = q * 32 + lane;
      for (unsigned m = lead_mask[li]; m; m &= m - 1) {  // every slot of the window routed to this expert
        const int sw = __ffs(m) - 1;
        uint4 a = make_uint4(0, 0, 0, 0);
        if (wrow[g]) a = reinterpret_cast<const uint4*>(act)[static_cast<int64_t>(wb + sw) * nvec + v];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float s = warp_sum(wrow[g] ? dot8<T>(a, wv[g][r], 0.f) : 0.f);
          if (lane == 0) part[sw * cpr + q][r] = s;
        }
      }
    }
  }
  if (!waited) {
    pdl_wait();
    pdl_trigger();
  }
  __syncthreads();
  for (int o = threadIdx.x; o < nw * R; o += 256) {  // (slot, row): its chunks in order, weighted, rounded
    const int sw = o / R, r = o - sw * R;
    float s = 0.f;
    if (routed(ids[wb + sw], num_experts)) {
      for (int q = 0; q < cpr; ++q) s += part[sw * cpr + q][r];
      s = rnd<T>(s * wts[wb + sw]);
    }
    ysum[sw][r] = s;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < (nw / topk) * R; o += 256) {  // (token, row): the top-k sum in expert order
    const int tw = o / R, r = o - tw * R;
    if (h0 + r >= hidden) continue;
    float total = 0.f;
    for (int k = 0; k < topk; ++k) total += ysum[tw * topk + k][r];
    out[static_cast<int64_t>(wb / topk + tw) * hidden + h0 + r] = topk_sum_out<T>(total, scale);
  }
}

struct DeviceFacts {
  int major = 0, sms = 0;
};

DeviceFacts device_facts() {  // the current device's, cached
  static int cached_dev = -1;
  static DeviceFacts facts;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DeviceFacts{};
  if (dev != cached_dev) {
    cudaDeviceGetAttribute(&facts.major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, dev);
    cached_dev = dev;
  }
  return facts;
}

int device_major() { return device_facts().major; }

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
  cudaError_t err;
  const int lanes = (inter / 8 + 31) / 32;  // vectors of a w2 row per lane
  const bool chunks = ASTRA_K2_ROWS > 0 && topk <= 16 && topk * lanes <= kTokenChunks;
  // a window: the whole tokens whose shared experts are read once (kernel 2's shared memory bounds it); 1: none
  int wtok = 1;
  if (ASTRA_DEDUP && topk <= kMaxWindow) {
    wtok = kMaxWindow / topk;
    if (chunks) wtok = min(wtok, kMaxChunks / (topk * lanes));
    wtok = max(1, min(wtok, tokens));
  }
  const dim3 grid1((inter + kWarps1 - 1) / kWarps1, tokens * topk);
  const T* xp = static_cast<const T*>(x);
  const T* wp = static_cast<const T*>(w13);
  T* ap = static_cast<T*>(act);
  constexpr int cols = ASTRA_K1_COLS > 0 ? ASTRA_K1_COLS : 1;
  if constexpr (ASTRA_K1_COLS > 0)
    err = launch(gate_up_rows_kernel<T, cols, ASTRA_K1_ITERS>, dim3((inter + cols - 1) / cols, tokens * topk), 256,
                 stream, xp, wp, ids, ap, hidden, inter, experts, topk);
  else if (wtok > 1)  // windows of several tokens: 2 or 4 slots a sweep, 8 vectors a row in flight
    err = launch(wtok == 2 ? gate_up_act_kernel<T, 2, 8, 1> : gate_up_act_kernel<T, 4, 8, 1>, grid1, kWarps1 * 32,
                 stream, xp, wp, ids, ap, hidden, inter, experts, topk, tokens * topk, wtok * topk);
  else {
    // one slot a sweep, its launch shape by the grid (session 30's sweep): a grid that fits two 8-vector CTAs an SM
    // keeps them; one that fits six 2-vector CTAs an SM (40 registers) runs in that one wave; larger grids take
    // 4-vector CTAs, four an SM
    const int64_t ctas = static_cast<int64_t>(grid1.x) * grid1.y, sms = device_facts().sms;
    auto k1 = ASTRA_K1_UNROLL > 0 ? gate_up_act_kernel<T, 1, (ASTRA_K1_UNROLL > 0 ? ASTRA_K1_UNROLL : 8), ASTRA_K1_MINB>
              : ctas <= 2 * sms   ? gate_up_act_kernel<T, 1, 8, 1>
              : ctas <= 6 * sms   ? gate_up_act_kernel<T, 1, 2, 6>
                                  : gate_up_act_kernel<T, 1, 4, 4>;
    err = launch(k1, grid1, kWarps1 * 32, stream, xp, wp, ids, ap, hidden, inter, experts, topk, tokens * topk, 1);
  }
  if (err != cudaSuccess) return err;
  const dim3 grid((hidden + kWarps2 - 1) / kWarps2, tokens);
  const T* w = static_cast<const T*>(w2);
  const T* a = static_cast<const T*>(act);
  T* o = static_cast<T*>(out);
  if (chunks) {
    constexpr int r = ASTRA_K2_ROWS > 0 ? ASTRA_K2_ROWS : 1;
    return launch(down_chunks_kernel<T, r, ASTRA_K2_GROUP>, dim3((hidden + r - 1) / r, (tokens + wtok - 1) / wtok), 256,
                  stream, w, wts, ids, a, o, tokens, hidden, inter, experts, topk, wtok * topk, scale);
  }
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
