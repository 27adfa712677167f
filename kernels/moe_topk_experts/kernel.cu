// astra-sglang moe_topk_experts: a MoE layer's softmax top-k router and its routed experts at decode sizes, from the
// gate's logits to the layer's output, in two launches (kernels/moe_experts' kernels with kernels/moe_router folded in):
//   ids[t], w[t] = the top-k experts of softmax(logits[t]) (descending, ties to the lowest id), w renormalized to 1
//   act[t, k, j] = T( silu(T(g)) * T(u) ),  g = sum_h x[t, h] w13[e, j, h],  u = sum_h x[t, h] w13[e, I + j, h]
//   out[t, h]    = T( s * T( sum_k T( w[t, k] * sum_j act[t, k, j] w2[e, h, j] ) ) )      e = ids[t, k]
// fp32 math, rounded to the model dtype T where SGLang's fused_experts rounds (kernels/moe_experts/kernel.cu says
// where); the routing is moe_router's arithmetic (fp32 softmax, NaN ranked as -1e30, the routed sum divided in IEEE).
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_topk_experts(const void* x, const void* router_logits, const void* w13,
//           const void* w2, void* act, void* out, int64_t num_tokens, int64_t hidden, int64_t inter,
//           int64_t num_experts, int64_t topk, double routed_scaling_factor, int dtype, cudaStream_t stream)
// x [T, H], router_logits [T, E] (the gate's output, dtype T), w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I],
// act [T, K, I] scratch, out [T, H] (not x), all contiguous; dtype 1 fp16, 2 bf16; H and I multiples of 8, pointers
// 16-byte aligned; K <= E <= 128, K <= 16 and K x ceil(I / 256) <= 64 (kernel 2's chunk path), else
// cudaErrorNotSupported. Launches on `stream` only; no allocation, no host sync.
//
// Why: on SGLang's decode chain gate -> router -> experts the router is a launch of its own whose ids kernel 1 must
// wait for: 1.71 us a layer at 1 token with astra's moe_router (H200, results/2026-12-01-h200/session33/ §2). Here
// kernel 1 takes the logits instead: each warp ranks its own slot's expert (rounds 0..r of the router's argmax, one
// warp max of packed ranks a round, no softmax: the logits' order is their softmax's), and kernel 2's first warp
// computes the window's ids before its first w2 loads and the router's weights while they fly, before its PDL wait.
// Measured as a dev variant of moe_experts (same record, §3): -1.0 us a layer at 1 token, bit-identical output; the
// packed ranks and the late weights another 0.1-0.35 us a call (results/2026-12-01-h200/session36/ §3). From 2
// tokens every kernel-1 warp routes every token of its window (+13.8 us at 2): the adapter takes 1 token only. The
// rest (windows of whole tokens, launch shapes by the grid, weights streamed past L1, PDL) is moe_experts' as measured
// there.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launches
#endif

namespace astra_mtx {
namespace {

#ifndef ASTRA_K1_WARPS
#define ASTRA_K1_WARPS 8  // kernel 1: warps (act columns) per CTA
#endif
#ifndef ASTRA_K1_UNROLL
#define ASTRA_K1_UNROLL 0  // kernel 1 at one token a window: vectors a row in flight per lane; 0: by its grid
#endif
#ifndef ASTRA_K2_ROWS
#define ASTRA_K2_ROWS 8  // kernel 2 over 32-vector chunks: output rows a 256-thread CTA
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

constexpr int kWarps1 = ASTRA_K1_WARPS;
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

// The router: both kernels compute moe_router's softmax top-k (renormalized; ties to the lowest id) from the logits
// [T, E], with its arithmetic, so the ids and weights are the router's. E <= 128: one warp a row, 4 values a lane.
constexpr int kRowVals = 4;  // a row's values a lane (expert j * 32 + lane in slot j)

// The router's order of one logit as a 17-bit rank: the logits are the model dtype (16 bits), NaN ranks where the
// router puts it (as -1e30: between the two dtype values around -1e30, which is none of them), -0 as +0. Shifted
// left by 7 with 127 - id below it, one unsigned warp max then picks the largest value and, among equal ones, the
// lowest id: the router's argmax in one reduction (moe_router ranks fp32 keys, then ids, in two).
__host__ __device__ __forceinline__ unsigned order16(unsigned bits) {  // the 16-bit float's order as an unsigned
  return (bits & 0x8000u) ? (~bits & 0xFFFFu) : (bits | 0x8000u);
}
template <typename T> __host__ __device__ __forceinline__ unsigned logit_rank(T x);
template <>
__host__ __device__ __forceinline__ unsigned logit_rank<__nv_bfloat16>(__nv_bfloat16 x) {
  unsigned bits = *reinterpret_cast<const unsigned short*>(&x);
  if (bits == 0x8000u) bits = 0u;
  // -1e30f (bits 0xF149F2CA) truncated toward zero: the bf16 just above -1e30
  if ((bits & 0x7FFFu) > 0x7F80u) return 2u * order16(0xF149u) - 1u;
  return 2u * order16(bits);
}
template <>
__host__ __device__ __forceinline__ unsigned logit_rank<__half>(__half x) {
  unsigned bits = *reinterpret_cast<const unsigned short*>(&x);
  if (bits == 0x8000u) bits = 0u;
  if ((bits & 0x7FFFu) > 0x7C00u) return 2u * order16(0xFBFFu) - 1u;  // below every finite half, above -inf
  return 2u * order16(bits);
}
// -inf's rank: padding past E, and a slot already taken (the router's -INFINITY)
template <typename T> __host__ __device__ __forceinline__ unsigned neg_inf_rank();
template <> __host__ __device__ __forceinline__ unsigned neg_inf_rank<__nv_bfloat16>() { return 2u * order16(0xFF80u); }
template <> __host__ __device__ __forceinline__ unsigned neg_inf_rank<__half>() { return 2u * order16(0xFC00u); }

// lane's packed keys of `row`: (rank << 7) | (127 - id)
template <typename T>
__device__ __forceinline__ void row_keys(const T* row, int experts, unsigned (&k)[kRowVals]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kRowVals; ++j) {
    const int e = j * 32 + lane;
    k[j] = ((e < experts ? logit_rank<T>(row[e]) : neg_inf_rank<T>()) << 7) | static_cast<unsigned>(127 - e);
  }
}

// warp-collective: one round of the router's argmax; the winner's key drops to -inf (keeping its id), as the router's
template <typename T>
__device__ __forceinline__ int argmax_round(unsigned (&k)[kRowVals]) {
  const int lane = threadIdx.x & 31;
  const unsigned top = __reduce_max_sync(kFull, max(max(k[0], k[1]), max(k[2], k[3])));
  const int id = 127 - static_cast<int>(top & 127u);
#pragma unroll
  for (int j = 0; j < kRowVals; ++j)
    if (j * 32 + lane == id) k[j] = (neg_inf_rank<T>() << 7) | (top & 127u);
  return id;
}

// warp-collective, ids only: the expert of rank r in `row`, in rounds 0..r
template <typename T>
__device__ __forceinline__ int route_rank(const T* row, int experts, int r) {
  unsigned k[kRowVals];
  row_keys<T>(row, experts, k);
  int bi = 0;
  for (int q = 0; q <= r; ++q) bi = argmax_round<T>(k);
  return bi;
}

// warp-collective: lane r < topk gets the r-th expert of `row` (0 past topk)
template <typename T>
__device__ __forceinline__ int route_ids(const T* row, int experts, int topk) {
  const int lane = threadIdx.x & 31;
  unsigned k[kRowVals];
  row_keys<T>(row, experts, k);
  int my_id = 0;
  for (int r = 0; r < topk; ++r) {
    const int bi = argmax_round<T>(k);
    if (lane == r) my_id = bi;
  }
  return my_id;
}

// warp-collective: lane r < topk gets the renormalized weight of its expert my_id (route_ids'; 0 past topk): the
// router's fp32 softmax (max, expf), its butterfly sum over the top-k and its IEEE division
template <typename T>
__device__ __forceinline__ float route_weight(const T* row, int experts, int topk, int my_id) {
  constexpr int V = kRowVals;
  const int lane = threadIdx.x & 31;
  float s[V], p[V];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int e = j * 32 + lane;
    s[j] = e < experts ? to_f(row[e]) : -INFINITY;
    m = fmaxf(m, s[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
#pragma unroll
  for (int j = 0; j < V; ++j) p[j] = (j * 32 + lane) < experts ? expf(s[j] - m) : 0.f;
  float w = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {  // p of my_id, from its lane
    const float pj = __shfl_sync(kFull, p[j], my_id & 31);
    if (j == (my_id >> 5)) w = pj;
  }
  if (lane >= topk) w = 0.f;
  float sum = w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  return __fdiv_rn(w, sum > 0.f ? sum : 1.f);  // IEEE division under --use_fast_math, as the router's
}

// warp-collective: lane i < ntok * topk gets slot tok0 * topk + i's expert (-1 past them)
template <typename T>
__device__ __forceinline__ int window_ids(const T* logits, int experts, int topk, int tok0, int ntok) {
  const int lane = threadIdx.x & 31;
  int id = -1;
  for (int tw = 0; tw < ntok; ++tw) {
    const int i1 = route_ids<T>(logits + static_cast<int64_t>(tok0 + tw) * experts, experts, topk);
    const int si = __shfl_sync(kFull, i1, lane % topk);
    if (lane / topk == tw) id = si;
  }
  return id;
}

// warp-collective: lane i < ntok * topk gets the weight of slot tok0 * topk + i, whose expert is id (window_ids'; 0
// past them)
template <typename T>
__device__ __forceinline__ float window_weights(const T* logits, int experts, int topk, int tok0, int ntok, int id) {
  const int lane = threadIdx.x & 31;
  float w = 0.f;
  for (int tw = 0; tw < ntok; ++tw) {
    const int r = tw * topk + lane;  // lane r of this token reads slot tw * topk + r's expert
    const int i1 = __shfl_sync(kFull, id, r < 32 ? r : 0);
    const float w1 = route_weight<T>(logits + static_cast<int64_t>(tok0 + tw) * experts, experts, topk,
                                     lane < topk ? i1 : 0);
    const float sw = __shfl_sync(kFull, w1, lane % topk);
    if (lane / topk == tw) w = sw;
  }
  return w;
}

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
    gate_up_act_kernel(const T* __restrict__ x, const T* __restrict__ w13, const T* __restrict__ logits,
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
    e = route_rank<T>(logits + static_cast<int64_t>(slot / topk) * num_experts, num_experts, slot % topk);
    if (!routed(e, num_experts)) return;  // uniform over the CTA; no barrier below: a warp may leave alone
  } else {  // the window's ids in one read (lane i: slot wb + i), this slot's expert among them
    wb = slot - slot % ws;
    const int l = wb + lane;
    int id = window_ids<T>(logits, num_experts, topk, wb / topk, min(ws, nslots - wb) / topk);
    if (!(lane < ws && l < nslots)) id = -1;
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
__global__ void __launch_bounds__(256) down_chunks_kernel(const T* __restrict__ w2, const T* __restrict__ logits,
                                                          const T* act, T* out,
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
  __shared__ int fold_id[kMaxWindow];
  __shared__ float fold_w[kMaxWindow];
  int fid = -1;  // warp 0: lane i's slot wb + i's expert (the router's ids)
  if (warp == 0) {  // the window's distinct routed experts, in slot order, each with its slots
    fid = window_ids<T>(logits, num_experts, topk, wb / topk, nw / topk);
    const int e = lane < nw ? fid : -1;
    fold_id[lane] = e;
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
  bool waited = !ASTRA_PDL, weighed = warp != 0;
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
    if (!weighed) {  // warp 0: the router's weights while its first w2 vectors load (needed only at the end)
      fold_w[lane] = window_weights<T>(logits, num_experts, topk, wb / topk, nw / topk, fid);
      weighed = true;
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
  if (!weighed) fold_w[lane] = window_weights<T>(logits, num_experts, topk, wb / topk, nw / topk, fid);
  if (!waited) {
    pdl_wait();
    pdl_trigger();
  }
  __syncthreads();
  for (int o = threadIdx.x; o < nw * R; o += 256) {  // (slot, row): its chunks in order, weighted, rounded
    const int sw = o / R, r = o - sw * R;
    float s = 0.f;
    if (routed(fold_id[sw], num_experts)) {
      for (int q = 0; q < cpr; ++q) s += part[sw * cpr + q][r];
      s = rnd<T>(s * fold_w[sw]);
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

template <typename T>
cudaError_t dispatch(const void* x, const void* w13, const void* w2, const T* logits, void* act,
                     void* out, int tokens, int hidden, int inter, int experts, int topk, float scale,
                     cudaStream_t stream) {
  static_assert(ASTRA_K2_ROWS > 0, "kernel 2 is moe_experts' chunk kernel only (no down_sum_kernel here)");
  cudaError_t err;
  const int lanes = (inter / 8 + 31) / 32;  // vectors of a w2 row per lane
  // one warp routes a row; the chunk kernel's bounds
  if (topk > 16 || topk * lanes > kTokenChunks || experts > 128 || topk > experts) return cudaErrorNotSupported;
  // a window: the whole tokens whose shared experts are read once (kernel 2's shared memory bounds it); 1: none
  int wtok = 1;
  if (ASTRA_DEDUP && topk <= kMaxWindow)
    wtok = max(1, min(min(kMaxWindow / topk, kMaxChunks / (topk * lanes)), tokens));
  const dim3 grid1((inter + kWarps1 - 1) / kWarps1, tokens * topk);
  const T* xp = static_cast<const T*>(x);
  const T* wp = static_cast<const T*>(w13);
  T* ap = static_cast<T*>(act);
  if (wtok > 1)  // windows of several tokens: 2 or 4 slots a sweep, 8 vectors a row in flight
    err = launch(wtok == 2 ? gate_up_act_kernel<T, 2, 8, 1> : gate_up_act_kernel<T, 4, 8, 1>, grid1, kWarps1 * 32,
                 stream, xp, wp, logits, ap, hidden, inter, experts, topk, tokens * topk, wtok * topk);
  else {
    // one slot a sweep, its launch shape by the grid (session 30's sweep): a grid that fits two 8-vector CTAs an SM
    // keeps them; one that fits six 2-vector CTAs an SM (40 registers) runs in that one wave; larger grids take
    // 4-vector CTAs, four an SM
    const int64_t ctas = static_cast<int64_t>(grid1.x) * grid1.y, sms = device_facts().sms;
    auto k1 = ASTRA_K1_UNROLL > 0 ? gate_up_act_kernel<T, 1, (ASTRA_K1_UNROLL > 0 ? ASTRA_K1_UNROLL : 8), ASTRA_K1_MINB>
              : ctas <= 2 * sms   ? gate_up_act_kernel<T, 1, 8, 1>
              : ctas <= 6 * sms   ? gate_up_act_kernel<T, 1, 2, 6>
                                  : gate_up_act_kernel<T, 1, 4, 4>;
    err = launch(k1, grid1, kWarps1 * 32, stream, xp, wp, logits, ap, hidden, inter, experts, topk, tokens * topk, 1);
  }
  if (err != cudaSuccess) return err;
  constexpr int r = ASTRA_K2_ROWS;
  return launch(down_chunks_kernel<T, r, ASTRA_K2_GROUP>, dim3((hidden + r - 1) / r, (tokens + wtok - 1) / wtok), 256,
                stream, static_cast<const T*>(w2), logits, static_cast<const T*>(act), static_cast<T*>(out), tokens,
                hidden, inter, experts, topk, wtok * topk, scale);
}

}  // namespace
}  // namespace astra_mtx

extern "C" cudaError_t astra_moe_topk_experts(const void* x, const void* router_logits, const void* w13,
                                              const void* w2, void* act, void* out, int64_t num_tokens, int64_t hidden,
                                              int64_t inter, int64_t num_experts, int64_t topk,
                                              double routed_scaling_factor, int dtype, cudaStream_t stream) {
  using namespace astra_mtx;
  if (num_tokens < 0 || hidden < 8 || inter < 8 || num_experts < 1 || topk < 1) return cudaErrorInvalidValue;
  if (hidden % 8 || inter % 8) return cudaErrorInvalidValue;  // 16-byte vectors only (the adapter declines others)
  if (hidden > (int64_t(1) << 20) || inter > (int64_t(1) << 20) || num_experts > (int64_t(1) << 20) || topk > 64)
    return cudaErrorInvalidValue;
  if (num_tokens * topk > 65535) return cudaErrorInvalidValue;  // grid y (a decode op: the adapter takes 1 token)
  const uintptr_t align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w13) |
                          reinterpret_cast<uintptr_t>(w2) | reinterpret_cast<uintptr_t>(act);
  if (align % 16) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), h = static_cast<int>(hidden), i = static_cast<int>(inter);
  const int e = static_cast<int>(num_experts), k = static_cast<int>(topk);
  const float s = static_cast<float>(routed_scaling_factor);
  switch (dtype) {
    case 1: return dispatch<__half>(x, w13, w2, static_cast<const __half*>(router_logits), act, out, t, h, i, e, k, s,
                                    stream);
    case 2: return dispatch<__nv_bfloat16>(x, w13, w2, static_cast<const __nv_bfloat16*>(router_logits), act, out, t,
                                           h, i, e, k, s, stream);
    default: return cudaErrorInvalidValue;
  }
}
