// astra-sglang optimized gemma_rmsnorm (FlashInfer/sgl-kernel semantics, out of place):
//   out = T(x * rsqrt(mean(x^2) + eps) * (1 + weight)),  x = float(input)  (Gemma stores weight - 1)
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_gemma_rmsnorm(void* out, const void* input, const void* weight,
//           int64_t num_tokens, int64_t hidden, double eps, int dtype, cudaStream_t stream)
// dtype: 1 fp16, 2 bf16 (0 fp32 also works).  Launches on `stream` only; no allocation, no host sync;
// capturable.  out may alias input (every element is read by the thread that writes it, before it writes).
//
// kernels/rmsnorm/kernel.cu with a weight bias of 1: the design of kernels/fused_add_rmsnorm/kernel.cu
// (measurements in kernels/NOTES.md), minus the residual:
//  * Register-cached rows: each thread loads its K vectors of input and weight in one batch (every load
//    in flight before the first use), keeps them in registers and writes the output straight from them:
//    the input is read once, no second pass over global memory, and the weight load is not serialised
//    behind the reduction (FlashInfer's RMSNorm reads the row twice and the weight after the barrier).
//  * The sum of squares in FlashInfer's order, bit for bit (see row_plan): outputs equal SGLang's, so
//    greedy tokens match. Threads per row R (a multiple of 32) and rows per CTA from the hidden size and
//    the token count: warp-per-row (no __syncthreads) for narrow rows, several rows per CTA when there
//    are many tokens, one barrier for the cross-warp sum otherwise. Rows of more than 1024 vectors: up
//    to 4 vectors per thread, weight loaded after the reduction (fewer live registers).
//  * Rows wider than one CTA's registers hold (> 2048 vectors): a thread-block cluster splits the row
//    over C CTAs, partial sums meet through distributed shared memory (sm_90); without clusters
//    (pre-sm_90): a two-pass CTA-per-row kernel.
//  * Vector width W = widest (<= 16 bytes) dividing hidden and the pointers' alignment: any hidden size.
//  * Programmatic dependent launch on sm_90+: every read and write behind griddepcontrol.wait; the
//    dependents are released right after it, and problems <= 8 MB warm L2 with their rows (the weight
//    from the first CTA only) first.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
// 0: plain launch; 1: PDL, trigger after the stores (production's placement); 2: PDL, L2 prefetch,
// trigger right after griddepcontrol.wait.
#define ASTRA_PDL 2
#endif
#ifndef ASTRA_ONE_TOKENS
// From this many tokens up to 256, rows of up to 1024 vectors take kOne (one vector per thread, as the fused norms do
// at decode) instead of kTwo: twice the threads in flight where 128-256 rows give each SM one or two CTAs. In context
// on those rows (bf16, widths 2560-8192, H200, 2026-11-28, both orders): rmsnorm 0.96x -> 1.04x, gemma_rmsnorm
// 0.95x -> 1.03x over production. Below 128 tokens kTwo stays (kOne measured slower there). ~0u: never.
#define ASTRA_ONE_TOKENS 128u
#endif
#ifndef ASTRA_LATE_TOKENS
// With ASTRA_PDL 2, calls of this many tokens up to 256 trigger the next kernel after their stores (production's
// placement) and skip the L2 prefetch, as rmsnorm does. In context on 128-256 x 4096 / 5120 (bf16, H200, 2026-11-28,
// both orders, as the compile-time variant ASTRA_PDL=1): 0.958x / 0.962x -> 1.042x / 1.039x over production. ~0u: never.
#define ASTRA_LATE_TOKENS 128u
#endif
#ifndef ASTRA_PF_MAX
#define ASTRA_PF_MAX (8u << 20)  // L2 prefetch before the PDL wait when the input fits in this
#endif
#ifndef ASTRA_W_EARLY
// dev: 1 loads the weight (a constant, never the producer's output) into registers before
// griddepcontrol.wait, as qknorm and the GEMVs do; rows of <= 2 vectors per thread only. Measured, not
// shipped (H200, 2026-11-27, results/2026-11-27-h200/session10, decode corpus in context): rmsnorm 1.359x ->
// 1.255x and gemma_rmsnorm 1.173x -> 1.092x (slower); fused_add_rmsnorm 1.246x -> 1.254-1.264x and
// gemma_fused_add_rmsnorm 1.219x -> 1.209-1.215x (two runs each: within noise).
#define ASTRA_W_EARLY 0
#endif

namespace astra_grms {
// Internal linkage for everything below (the statics of inline/template functions would otherwise be
// GNU-unique symbols shared by every build of this file loaded into one process).
namespace {

constexpr float kWeightBias = 1.f;  // gemma_rmsnorm: 1 + weight, added in fp32 as FlashInfer does

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

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// Read a float at the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ float ld_dsmem(const float* smem_ptr, uint32_t rank) {
  uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
#endif

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

// The input may alias the output: plain coherent loads for it, the read-only path for the weight.
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
// blockDim = (R, ROWS): R threads (a multiple of 32) per row, ROWS rows per CTA; CL: a cluster of CTAs
// (ROWS == 1) shares one row.  Thread x holds K vectors (slots); each slot is one vector of one of
// FlashInfer's threads (its warp vw, this lane: thread t = 32*vw + lane, vector t + i*n_fi of round i),
// laid out by L (see row_plan).  A run of slots of one FlashInfer thread sums its squares in its order
// (one fma chain); each chain's warp sum goes to red[vw], and the warp sums meet in its butterfly.
// CL with n_fi == 0 (rows over 4096 vectors only): CTA rank r owns vectors [r*slice, (r+1)*slice),
// thread x the vectors r*slice + x + k*R, one chain: not FlashInfer's order.
enum Layout { kOne = 0, kTwo = 1, kPacked = 2, kCluster = 3 };
enum Flags { kPrefetch = 1, kLateTrigger = 2 };  // gemma_rmsnorm_kernel's `flags` (ASTRA_PDL 2)
template <int L> constexpr int kSlots = L == kOne ? 1 : L == kTwo ? 2 : 4;

// Slot k of a thread of warp `warp`: FlashInfer's warp vw and round i, and whether the slot continues
// slot k - 1's chain (the same FlashInfer thread).
template <int L>
__device__ __forceinline__ bool slot(int k, uint32_t warp, uint32_t wpr, uint32_t nv, uint32_t rank, uint32_t cl,
                                     uint32_t& vw, uint32_t& i) {
  vw = warp;
  i = 0;
  if constexpr (L == kTwo) {
    vw = uint32_t(k) * wpr + warp;  // FlashInfer's warps w and w + R/32
  } else if constexpr (L == kPacked) {
    // FlashInfer's warps of two rounds first (nd of them, both rounds in one slot pair), then those of
    // one round, four slots per warp: the thread count of a plain 4-vectors-per-thread split.
    const uint32_t nd = (nv - 1024u + 31u) >> 5, p = 4u * warp + uint32_t(k);
    if (p < 2u * nd) {
      vw = p >> 1;
      i = p & 1u;
      return i != 0;
    }
    vw = p - nd;  // >= 32 past the row: masked
  } else if constexpr (L == kCluster) {
    vw = rank + cl * warp;  // a cluster deals FlashInfer's warps out round robin: its butterfly is each
    i = uint32_t(k);        // CTA's butterfly over its warps, then one over the CTAs
    return k > 0;
  }
  return false;
}

// 2 CTAs of 512 threads per SM for 4 slots (64 registers; the separate chains tempt ptxas into more).
template <typename T, int W, int L>
__global__ void __launch_bounds__(kSlots<L> >= 4 ? 512 : 1024, kSlots<L> >= 4 ? 2 : 1)
    gemma_rmsnorm_kernel(T* out, const T* input, const T* __restrict__ weight, uint32_t tokens, uint32_t nv,
                         uint32_t n_fi, uint32_t slice, float fd, float eps, int flags) {
  constexpr int K = kSlots<L>;
  constexpr bool CL = L == kCluster;
  __shared__ float red[32];
  __shared__ float red_cl;
  const uint32_t R = blockDim.x;
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t warp = threadIdx.x >> 5;
  uint32_t row, rank = 0, cl = 1;
  if constexpr (CL) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    rank = cluster_ctarank();
#endif
    cl = gridDim.x / tokens;  // cluster size (grid = tokens * cl)
    row = blockIdx.x / cl;
  } else {
    row = blockIdx.x * blockDim.y + threadIdx.y;
  }
  const bool row_ok = row < tokens;
  const bool fi = !CL || n_fi != 0;  // FlashInfer's order (always, but for the widest cluster rows)
  const uint32_t lim = fi ? nv : min(nv, rank * slice + slice);  // vectors of this CTA end here
  // red[] holds FlashInfer's warp sums of this row (of this CTA's warps, in a cluster)
  const uint32_t nred = CL ? (R >> 5) : (n_fi >> 5);
  const size_t roff = size_t(row) * nv * W;

  // Slot k's vector (FlashInfer's thread t = 32*vw + lane, round i), recomputed where used rather than
  // held across the loads: fewer live registers.
  auto vec = [&](int k) {
    uint32_t vw, i;
    slot<L>(k, warp, R >> 5, nv, rank, cl, vw, i);
    return size_t(fi ? 32u * vw + lane + i * n_fi : rank * slice + threadIdx.x + uint32_t(k) * R);
  };
  bool ok[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    uint32_t vw, i;
    slot<L>(k, warp, R >> 5, nv, rank, cl, vw, i);
    ok[k] = row_ok && (fi ? 32u * vw + lane < n_fi : true) && vec(k) < lim;
  }
  constexpr bool kWLate = K >= 4;  // wide rows (K = 4) load the weight after the reduction
  constexpr bool kWEarly = ASTRA_W_EARLY && ASTRA_PDL >= 1 && !kWLate;
  Vec<T, W> w[K];
  if constexpr (kWEarly) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (ok[k]) w[k] = ldg<T, W>(weight + vec(k) * W);
  }
#if ASTRA_PDL >= 2
  if (flags & kPrefetch) {
    // The weight is shared by every row: only the first row's CTA(s) prefetch it (every CTA
    // prefetching it made an L2 hot spot in fused_add_rmsnorm).
    const bool pf_w = threadIdx.y == 0 && blockIdx.x < (CL ? gridDim.x / tokens : 1u);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (ok[k]) {
        prefetch_l2(input + roff + vec(k) * W);
        if (pf_w) prefetch_l2(weight + vec(k) * W);
      }
    }
  }
#endif
#if ASTRA_PDL >= 1
  pdl_wait();
#endif
#if ASTRA_PDL == 2
  if (!(flags & kLateTrigger)) pdl_trigger();
#endif
  Vec<T, W> a[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      a[k] = ld<T, W>(input + roff + vec(k) * W);
      if constexpr (!kWLate && !kWEarly) w[k] = ldg<T, W>(weight + vec(k) * W);
    }
  }
  float s = 0.f, ss = 0.f;
  float* rr = red + threadIdx.y * nred;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    uint32_t vw, i, vw1, i1;
    if (!slot<L>(k, warp, R >> 5, nv, rank, cl, vw, i)) s = 0.f;  // a FlashInfer thread's sum_sq starts
    if (ok[k]) {
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float v = to_f(a[k].v[e]);
        s += v * v;
      }
    }
    if (k + 1 == K || !slot<L>((k + 1) % K, warp, R >> 5, nv, rank, cl, vw1, i1)) {
      ss = warp_sum(s);  // ... and ends: its warp's butterfly, the warp sum to red[]
      const uint32_t q = CL ? warp : vw;
      if (lane == 0 && q < nred) rr[q] = ss;
    }
  }
  if (CL || nred > 1) {
    __syncthreads();
    ss = warp_sum(lane < nred ? rr[lane] : 0.f);  // FlashInfer's cross-warp butterfly, zero padded
  }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (CL) {
    if (threadIdx.x == 0) red_cl = ss;
    cluster_arrive();
    cluster_wait();
    ss = warp_sum(lane < cl ? ld_dsmem(&red_cl, lane) : 0.f);
    cluster_arrive();  // our reads of the peers' red_cl are done; waited for before exit
  }
#endif
  if constexpr (kWLate) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (ok[k]) w[k] = ldg<T, W>(weight + vec(k) * W);
  }
  const float rcp = rsqrtf(ss / fd + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (ok[k]) {
      Vec<T, W> o;
#pragma unroll
      for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(to_f(a[k].v[i]) * rcp * (kWeightBias + to_f(w[k].v[i])));
      st<T, W>(out + roff + vec(k) * W, o);
    }
  }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (CL) cluster_wait();  // keep red_cl alive until every peer has read it
#endif
#if ASTRA_PDL == 1
  pdl_trigger();
#elif ASTRA_PDL == 2
  if (flags & kLateTrigger) pdl_trigger();
#endif
}

// Fallback for rows no CTA's registers hold when clusters are unavailable (pre-sm_90, or rows of more
// than 8 * 2048 vectors): one 1024-thread CTA per row, two passes over the row (the second from L2).
// Each thread reads and writes the same vectors in both passes, so out may alias input.  The layout and
// the sums are FlashInfer's (1024 threads, thread t: vectors t, t + 1024, ...).
template <typename T, int W>
__global__ void __launch_bounds__(1024) gemma_rmsnorm_2pass_kernel(T* out, const T* input, const T* __restrict__ weight,
                                                             uint32_t nv, float fd, float eps) {
  __shared__ float red[32];
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
    }
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  ss = warp_sum(red[threadIdx.x & 31u]);  // 32 warps: FlashInfer's cross-warp butterfly
  const float rcp = rsqrtf(ss / fd + eps);
  for (uint32_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, W> a = ld<T, W>(input + roff + size_t(v) * W);
    const Vec<T, W> w = ldg<T, W>(weight + size_t(v) * W);
    Vec<T, W> o;
#pragma unroll
    for (int i = 0; i < W; ++i) o.v[i] = from_f<T>(to_f(a.v[i]) * rcp * (kWeightBias + to_f(w.v[i])));
    st<T, W>(out + roff + size_t(v) * W, o);
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
inline cudaError_t launch(void (*kernel)(Args...), dim3 grid, dim3 block, uint32_t cluster, cudaStream_t stream,
                          bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
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
cudaError_t run_w(T* out, const T* in, const T* w, int64_t tokens64, int64_t d, float eps, cudaStream_t stream) {
  if (tokens64 >= (1ll << 31)) return cudaErrorInvalidValue;
  const uint32_t tokens = uint32_t(tokens64);
  const uint32_t nv = uint32_t(d / W);
  const DevInfo info = dev_info();
  const bool pdl = (ASTRA_PDL != 0) && info.major >= 9;
  const bool late = tokens >= uint32_t(ASTRA_LATE_TOKENS) && tokens <= 256u;
  const int flags = late ? kLateTrigger
                         : (uint64_t(tokens) * uint64_t(d) * sizeof(T) <= uint64_t(ASTRA_PF_MAX) ? kPrefetch : 0);
  const float fd = float(d);  // mean of squares = sum / d, divided as FlashInfer does: sum * (1/d) rounds
  // differently where 1/d is inexact (d not a power of two) and flips bf16 outputs (Gemma-2 greedy tokens diverged)

  RowPlan p;
  const bool clusters = info.major >= 9 && uint64_t(tokens) * 8u < (1ull << 31);
  const uint32_t one_max = tokens >= uint32_t(ASTRA_ONE_TOKENS) && tokens <= 256u ? 1024u : ASTRA_ONE_MAX;
  if (!row_plan(nv, clusters, p, one_max))  // rows too wide for one CTA's registers, no cluster
    return launch(gemma_rmsnorm_2pass_kernel<T, W>, dim3(tokens), dim3(1024), 1, stream, pdl, out, in, w, nv, fd, eps);
  if (p.cl > 1)
    return launch(gemma_rmsnorm_kernel<T, W, kCluster>, dim3(tokens * p.cl), dim3(p.R, 1), p.cl, stream, pdl,
                  out, in, w, tokens, nv, p.n_fi, p.slice, fd, eps, flags);
  // Rows per CTA: up to 256 threads per CTA, but keep at least one CTA per SM while tokens allow.
  uint32_t rows = 1;
  while (p.R * rows * 2 <= 256 && uint64_t(tokens) >= uint64_t(info.sms) * rows * 2) rows *= 2;
  const dim3 grid((tokens + rows - 1) / rows), block(p.R, rows);
  auto kernel = p.layout == kOne ? gemma_rmsnorm_kernel<T, W, kOne>
                : p.layout == kTwo ? gemma_rmsnorm_kernel<T, W, kTwo>
                                   : gemma_rmsnorm_kernel<T, W, kPacked>;
  return launch(kernel, grid, block, 1, stream, pdl, out, in, w, tokens, nv, p.n_fi, p.slice, fd, eps, flags);
}

template <typename T>
cudaError_t run(void* out, const void* input, const void* weight, int64_t tokens, int64_t d, double eps,
                cudaStream_t stream) {
  if (tokens < 0 || d < 0) return cudaErrorInvalidValue;
  if (tokens == 0 || d == 0) return cudaSuccess;
  T* o = static_cast<T*>(out);
  const T* in = static_cast<const T*>(input);
  const T* w = static_cast<const T*>(weight);
  const uintptr_t align = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(input) |
                          reinterpret_cast<uintptr_t>(weight);
  constexpr int kMaxW = 16 / sizeof(T);
  int vw = kMaxW;
  while (vw > 1 && ((d % vw) != 0 || (align % (vw * sizeof(T))) != 0)) vw >>= 1;
  const float e = static_cast<float>(eps);
  if (vw == kMaxW) return run_w<T, kMaxW>(o, in, w, tokens, d, e, stream);
  if constexpr (kMaxW >= 8) {
    if (vw == 4) return run_w<T, 4>(o, in, w, tokens, d, e, stream);
  }
  if (vw == 2) return run_w<T, 2>(o, in, w, tokens, d, e, stream);
  return run_w<T, 1>(o, in, w, tokens, d, e, stream);
}

}  // namespace
}  // namespace astra_grms

extern "C" cudaError_t astra_gemma_rmsnorm(void* out, const void* input, const void* weight, int64_t num_tokens,
                                           int64_t hidden, double eps, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 0: return astra_grms::run<float>(out, input, weight, num_tokens, hidden, eps, stream);
    case 1: return astra_grms::run<__half>(out, input, weight, num_tokens, hidden, eps, stream);
    case 2: return astra_grms::run<__nv_bfloat16>(out, input, weight, num_tokens, hidden, eps, stream);
    default: return cudaErrorInvalidValue;
  }
}
