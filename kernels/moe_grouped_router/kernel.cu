// astra-sglang moe_grouped_router: DeepSeek-V3's grouped, biased sigmoid top-k router (SGLang's
// biased_grouped_topk_gpu: flashinfer fused_topk_deepseek for DeepSeek-V3, the Triton router for Kimi-K2).
//   key[e]          = fp32(sigmoid(logit[e])) + bias[e]                        (fp32)
//   group score[g]  = the two largest keys of group g, with multiplicity, top1 + top2 in fp32
//   kept groups     = the topk_group largest scores, ties to the LOWEST group id
//   topk_ids[t, :]  = the topk largest keys among the kept groups' experts, ties to the LOWEST expert id
//   topk_weights    = sigmoid(logit) of those experts / their sum (renormalize; 1 when the sum is 0)
//                     * routed_scaling_factor when apply_routed_scaling_factor_on_output
//   fused shared experts (the last num_fused_shared_experts columns, as SGLang appends them after flashinfer):
//                     id = num_experts, weight = the routed weights' sum / routed_scaling_factor (SGLang 0.5.17), or
//                     fp32(shared_weight) when shared_weight >= 0 (0.5.23's constant fused_shared_expert_weight)
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_grouped_router(const void* scores, const void* bias, void* topk_weights,
//           void* topk_ids, int64_t num_tokens, int64_t num_experts, int64_t topk, int64_t num_expert_group,
//           int64_t topk_group, int64_t num_fused_shared_experts, int renormalize, double routed_scaling_factor,
//           int apply_routed_scaling_factor_on_output, double shared_weight, int dtype, cudaStream_t stream)
// scores [tokens, experts] contiguous, dtype 0 fp32, 1 fp16, 2 bf16; bias fp32 [experts]; topk_weights fp32
// [tokens, topk], topk_ids int32 [tokens, topk] (topk counts the shared columns). experts <= 1024, divisible by
// num_expert_group <= 32, at most 32 experts a group when num_expert_group > 1; 1 <= topk_group <= num_expert_group;
// routed = topk - num_fused_shared_experts: 1 <= routed <= topk_group * experts / num_expert_group, topk <= 32;
// routed_scaling_factor > 0 when num_fused_shared_experts > 0.
// Launches on `stream` only; no allocation, no host sync.
//
// Design (2.8-3.0 us a call chained on the H200; the first design, a warp per token with serial argmax rounds,
// took 17.5 us: RESULTS.md):
//  * One CTA per token. Its experts are cut into segments of LANES lanes (LANES = 1..32, a power of 2): a segment is
//    a group when num_expert_group > 1 (LANES >= experts per group, the spare lanes idle), else 32 consecutive
//    experts. Thread (segment s, lane l) holds one expert: no serial rounds over the row anywhere.
//  * The bias is loaded before the PDL wait (a parameter, not the previous kernel's output).
//  * The sigmoid is computed in double and rounded to fp32 (correctly rounded but for ~2^-29 of inputs): the
//    ranking keys are then the ones an exact reference computes, whatever fp32 sigmoid production uses.
//  * Each lane's rank inside its segment, on (key, lowest id), by LANES shuffles; the lane stores its expert in slot
//    (s, rank) of a shared table: each segment's experts in descending order.
//  * Groups: score = slot 0 + slot 1 (the top two with multiplicity; -inf for one expert a group); warp 0 ranks
//    the scores (ties: lowest group id) and keeps the topk_group best as a bitmask.
//  * Only the first min(routed, LANES) slots of a kept segment can be among the routed top-k: those candidates
//    (32 for DeepSeek-V3) rank themselves against each other from shared memory; the winners land in their slot.
//  * Warp 0 renormalizes (a warp sum), scales when asked, appends the fused shared-expert columns as SGLang does
//    after flashinfer (id = num_experts, weight = the routed weights' sum / routed_scaling_factor) and stores.
//  * Programmatic dependent launch on sm_90+ (house style).
//
// The warp router, ASTRA_ROUTER_WARP (default 1: calls without a fused shared column; the CTA kernel above takes the
// rest, and every shape the warp router does not take). The same results bit for bit (ids, weights, ties, NaN, -0,
// the shared columns). In context on the H200 the CTA kernel lost to production where no shared column follows
// (0.749x over DeepSeek-V3's and Kimi-K2's rows) and the warp router won (1.346x, min 1.081x; RESULTS.md); with a
// shared column the CTA kernel is the one timed (2.9-4.2x), so it keeps those calls unless ASTRA_ROUTER_WARP_SHARED
// (dev) is 1. ASTRA_ROUTER_WARP=0: the CTA kernel for every call.
//  * Takes: routed <= 8; grouped: experts <= 256, V = the least of 1, 2, 4, 8 with 32 V >= experts, V dividing the
//    experts a group and GL = experts a group / V a power of 2 (DeepSeek-V3: V = 8, GL = 4); one group: experts
//    <= 384, V = the least of 1, 2, 4, 8, 12 with 32 V >= experts, experts % V == 0 (Kimi-K2: V = 12).
//  * =1: one CTA a token, one thread an expert for the sigmoid as above (a lane's double exp and division each
//    branch to a slow path, so nvcc runs V of them in a row: several a lane would cost V times the latency), keys
//    and sigmoids to shared memory, ONE __syncthreads, then warp 0 alone, in registers: lane l holds experts
//    l*V .. l*V+V-1, a group spans GL lanes.
//    =2: one warp a token (4 a CTA), no shared memory, no barrier: each lane computes its V sigmoids itself.
//  * ASTRA_ROUTER_WARP_TOKENS=N (default 1024; 0: off): under =1, calls of N tokens or more run the =2 kernel, with
//    or without a fused shared column. =1's 384-thread CTA leaves 5 selecting warps an SM, =2 has 64: at 1k-16k
//    tokens =1 lost to production (Kimi-K2 0.46-0.76x in context), =2 won every prefill row (1.04-2.99x; DeepSeek-V3
//    with the shared column 2.99x at 4k), while at 256 tokens =1 is the faster of the two (Kimi-K2 1.42-1.69x against
//    1.08-1.13x). At 512 tokens Kimi-K2 lost either way (0.87x / 0.98x), so the adapter leaves one-group calls of
//    257-1023 tokens to SGLang (H200, 2026-12-01, RESULTS.md).
//  * Selection on values only (fmaxf / fminf, no ids): each lane sorts its keys (Batcher, 19 exchanges for 8), then
//    bitonic top-8 merges with the xor partners 1 .. GL/2 give every lane its group's 8 best keys with multiplicity
//    (the group score is the first two); groups are ranked by shuffles (ties: the lowest group); a dropped group's
//    list and keys become -inf; merges with the xor partners GL .. 16 give every lane v[0..7], the 8 best keys of
//    the kept groups.
//  * Ids: when v[0] > .. > v[routed-1], slot r's expert is the lowest-id kept expert whose key is v[r] (a ballot per
//    slot: the lowest lane, then its lowest index): a key above the last is unique, the last one's ties go to the
//    lowest id. Otherwise (equal chosen keys) routed rounds of an exact warp argmax on (key, lowest id).
//  * The renormalizing sum adds the routed weights in the CTA kernel's butterfly order (lanes past 8 add +0):
//    ((0+4)+(2+6))+((1+5)+(3+7)); the shared columns take its 32-lane butterfly as is. Emulated lane by lane in
//    tests/test_op_moe_grouped_router.py (test_warp_variant_*), against the reference and the CTA kernel's weights.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, trigger right after the wait; 2 (dev): PDL, trigger after the stores
#endif

#ifndef ASTRA_ROUTER_WARP
#define ASTRA_ROUTER_WARP 1  // 0: the CTA kernel; 1: the warp router where the shape allows; 2 (dev): a warp a token
#endif

#ifndef ASTRA_ROUTER_WARP_SHARED
#define ASTRA_ROUTER_WARP_SHARED 0  // 1 (dev): the warp router also for calls with a fused shared column (untimed)
#endif

#ifndef ASTRA_ROUTER_WARP_TOKENS
#define ASTRA_ROUTER_WARP_TOKENS 1024  // from N tokens on, one warp a token (the =2 kernel), shared or not
#endif

namespace astra_moegr {
namespace {

constexpr int kMaxThreads = 1024;  // 32 segments x 32 lanes
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

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float sigmoid_rn(float x) {
  return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(x))));
}

// (ka, ia) ranks before (kb, ib): the larger key, then the lower id
__device__ __forceinline__ bool before(float ka, int ia, float kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

template <typename T, int LANES>
__global__ void __launch_bounds__(kMaxThreads)
    moe_grouped_router_kernel(const T* __restrict__ scores, const float* __restrict__ bias,
                              float* __restrict__ weights, int32_t* __restrict__ ids, int experts, int topk,
                              int routed, int groups, int topk_group, int nseg, int seg_experts, int renormalize,
                              float scale, float shared_div) {
  __shared__ float s_key[kMaxThreads];  // slot (segment, rank): each segment's experts in descending order
  __shared__ float s_sg[kMaxThreads];
  __shared__ int s_id[kMaxThreads];
  __shared__ float s_sel_w[32];  // the routed top-k, by rank
  __shared__ int s_sel_id[32];
  __shared__ unsigned s_kept;

  const int tid = threadIdx.x, lane = tid & 31;
  const int seg = tid / LANES, sl = tid % LANES;
  const int e = seg * seg_experts + sl;
  const bool valid = seg < nseg && sl < seg_experts && e < experts;
  const int64_t row = blockIdx.x;
  const float b = valid ? bias[e] : 0.f;
  if (ASTRA_PDL) {
    pdl_wait();
    if (ASTRA_PDL == 1) pdl_trigger();
  }
  float sg = 0.f, key = -INFINITY;
  if (valid) {
    sg = sigmoid_rn(to_f(scores[row * experts + e]));
    float k = sg + b;
    k = (k == k) ? k : -1e30f;      // NaN ranks as -1e30 (the Triton router's rule; outside the contract)
    key = (k == 0.f) ? 0.f : k;     // -0 == +0: equal keys, the lower id wins
  }
  const int id = valid ? e : 0x7fffffff;
  int rank = 0;
#pragma unroll
  for (int j = 0; j < LANES; ++j) {
    const float kj = __shfl_sync(kFull, key, j, LANES);
    rank += before(kj, seg * seg_experts + j, key, seg * seg_experts + sl) ? 1 : 0;
  }
  // rank is a permutation of the segment's lanes (idle lanes, -inf, rank last): slots never collide
  s_key[seg * LANES + rank] = key;
  s_sg[seg * LANES + rank] = sg;
  s_id[seg * LANES + rank] = id;
  __syncthreads();

  unsigned kept = nseg >= 32 ? kFull : ((1u << nseg) - 1u);
  if (groups > 1) {
    if (tid < 32) {
      const float gs = lane < groups
          ? s_key[lane * LANES] + (seg_experts >= 2 ? s_key[lane * LANES + 1] : -INFINITY)
          : -INFINITY;
      int grank = 0;
      for (int j = 0; j < groups; ++j) grank += before(__shfl_sync(kFull, gs, j), j, gs, lane) ? 1 : 0;
      const unsigned m = __ballot_sync(kFull, lane < groups && grank < topk_group);
      if (lane == 0) s_kept = m;
    }
    __syncthreads();
    kept = s_kept;
  }

  // candidates: the first kc slots of every kept segment, in compact order
  const int kc = routed < LANES ? routed : LANES;
  const int ncand = __popc(kept) * kc;
  if (tid < ncand) {
    const int mine = (__fns(kept, 0, tid / kc + 1)) * LANES + tid % kc;
    const float mk = s_key[mine];
    const int mi = s_id[mine];
    if (mk != -INFINITY) {  // an idle lane's slot: never a candidate
      int grank = 0;
      for (unsigned m = kept; m; m &= m - 1u) {
        const int base = (__ffs(m) - 1) * LANES;
        for (int r = 0; r < kc; ++r) grank += before(s_key[base + r], s_id[base + r], mk, mi) ? 1 : 0;
      }
      if (grank < routed) {
        s_sel_w[grank] = s_sg[mine];
        s_sel_id[grank] = mi;
      }
    }
  }
  __syncthreads();

  if (tid < 32) {
    const bool is_routed = lane < routed;
    const float w = is_routed ? s_sel_w[lane] : 0.f;
    float sum = w;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
    const float den = renormalize ? (sum > 0.f ? sum : 1.f) : 1.f;
    const float fw = w / den * scale;
    float fsum = fw;  // SGLang: topk_weights[:, :routed].sum(-1) / routed_scaling_factor
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) fsum += __shfl_xor_sync(kFull, fsum, o);
    if (lane < topk) {
      weights[row * topk + lane] = is_routed ? fw : shared_div > 0.f ? fsum / shared_div : -shared_div;
      ids[row * topk + lane] = is_routed ? s_sel_id[lane] : experts;
    }
  }
  if (ASTRA_PDL == 2) pdl_trigger();
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

struct Args {
  const void* scores;
  const float* bias;
  float* weights;
  int32_t* ids;
  int64_t tokens;
  int experts, topk, routed, groups, topk_group, nseg, seg_experts, renormalize;
  // shared_div > 0: the shared columns' weight is the routed sum / shared_div; <= 0: it is -shared_div (a constant)
  float scale, shared_div;
};

template <typename T, int LANES>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  const int used = a.nseg * LANES;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.tokens));
  cfg.blockDim = dim3(static_cast<unsigned>((used + 31) / 32 * 32));  // whole warps: the shuffles are full-mask
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (ASTRA_PDL && device_major() >= 9) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, moe_grouped_router_kernel<T, LANES>, static_cast<const T*>(a.scores), a.bias,
                            a.weights, a.ids, a.experts, a.topk, a.routed, a.groups, a.topk_group, a.nseg,
                            a.seg_experts, a.renormalize, a.scale, a.shared_div);
}

template <typename T>
cudaError_t dispatch(const Args& a, cudaStream_t stream) {
  if (a.groups == 1) return launch<T, 32>(a, stream);  // segments of 32 experts
  if (a.seg_experts <= 1) return launch<T, 1>(a, stream);
  if (a.seg_experts <= 2) return launch<T, 2>(a, stream);
  if (a.seg_experts <= 4) return launch<T, 4>(a, stream);
  if (a.seg_experts <= 8) return launch<T, 8>(a, stream);
  if (a.seg_experts <= 16) return launch<T, 16>(a, stream);
  return launch<T, 32>(a, stream);
}

#if ASTRA_ROUTER_WARP
// ---------------------------------------------------------------------------------------------- the warp router
namespace wr {

constexpr int kL = 8;              // each lane's sorted list: the 8 best keys (routed <= 8)
constexpr int kWarpsPerCta = 4;    // ASTRA_ROUTER_WARP=2: one token a warp
constexpr int kMaxWarpExperts = 384;  // ASTRA_ROUTER_WARP=1: one thread an expert

__device__ __forceinline__ void cx(float& a, float& b) {  // a, b <- max, min (keys carry no NaN)
  const float hi = fmaxf(a, b);
  b = fminf(a, b);
  a = hi;
}

// Batcher's odd-even merge sorts, descending (the tests read the exchanges from this source)
__device__ __forceinline__ void sort4(float& x0, float& x1, float& x2, float& x3) {
  cx(x0, x1); cx(x2, x3);
  cx(x0, x2); cx(x1, x3);
  cx(x1, x2);
}

__device__ __forceinline__ void sort8(float (&x)[kL]) {
  cx(x[0], x[1]); cx(x[2], x[3]); cx(x[4], x[5]); cx(x[6], x[7]);
  cx(x[0], x[2]); cx(x[1], x[3]); cx(x[4], x[6]); cx(x[5], x[7]);
  cx(x[1], x[2]); cx(x[5], x[6]);
  cx(x[0], x[4]); cx(x[1], x[5]); cx(x[2], x[6]); cx(x[3], x[7]);
  cx(x[2], x[4]); cx(x[3], x[5]);
  cx(x[1], x[2]); cx(x[3], x[4]); cx(x[5], x[6]);
}

// c[i] = max(a[i], b[7 - i]) of two descending lists holds the 8 best of both, bitonic: sort it
__device__ __forceinline__ void merge_top(float (&a)[kL], const float (&b)[kL]) {
#pragma unroll
  for (int i = 0; i < kL; ++i) a[i] = fmaxf(a[i], b[kL - 1 - i]);
#pragma unroll
  for (int s = kL / 2; s > 0; s >>= 1) {
#pragma unroll
    for (int i = 0; i < kL; ++i)
      if ((i & s) == 0) cx(a[i], a[i + s]);
  }
}

__device__ __forceinline__ void merge_xor(float (&list)[kL], int o) {
  float p[kL];
#pragma unroll
  for (int i = 0; i < kL; ++i) p[i] = __shfl_xor_sync(kFull, list[i], o);
  merge_top(list, p);
}

// this lane's keys, sorted, as a list of kL (padded with -inf)
template <int V>
__device__ __forceinline__ void lane_list(const float (&k)[V], float (&list)[kL]) {
  static_assert(V == 1 || V == 2 || V == 4 || V == 8 || V == 12, "V");
#pragma unroll
  for (int i = 0; i < kL; ++i) list[i] = i < V ? k[i] : -INFINITY;
  if constexpr (V == 2) {
    cx(list[0], list[1]);
  } else if constexpr (V == 4) {
    sort4(list[0], list[1], list[2], list[3]);
  } else if constexpr (V >= 8) {
    sort8(list);
  }
  if constexpr (V == 12) {
    float b[kL];
#pragma unroll
    for (int i = 0; i < kL; ++i) b[i] = i < 4 ? k[8 + i] : -INFINITY;
    sort4(b[0], b[1], b[2], b[3]);
    merge_top(list, b);
  }
}

// an unsigned key with the order of the float (no NaN; -0 is +0 by then)
__device__ __forceinline__ unsigned ordered(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned warp_max(unsigned x) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  return __reduce_max_sync(kFull, x);
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(kFull, x, o));
  return x;
#endif
}

// V elements of T from p (aligned to the widest chunk that divides V * sizeof(T): the dispatch checks the base)
template <int BYTES>
__host__ __device__ constexpr int chunk_bytes() {
  return BYTES % 16 == 0 ? 16 : BYTES % 8 == 0 ? 8 : BYTES % 4 == 0 ? 4 : 2;
}

template <typename T>
__device__ __forceinline__ float from_bits(unsigned short h) {  // T: __half or __nv_bfloat16
  T t;
  memcpy(&t, &h, sizeof(h));
  return to_f(t);
}

template <typename T, int V>
__device__ __forceinline__ void load_row(const T* __restrict__ p, float (&out)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  constexpr int kChunk = chunk_bytes<kBytes>();
  if constexpr (kChunk < 4) {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_f(p[i]);
  } else {
    unsigned w[kBytes / 4];
    if constexpr (kChunk == 16) {
#pragma unroll
      for (int i = 0; i < kBytes / 16; ++i) {
        const uint4 q = reinterpret_cast<const uint4*>(p)[i];
        w[4 * i] = q.x;
        w[4 * i + 1] = q.y;
        w[4 * i + 2] = q.z;
        w[4 * i + 3] = q.w;
      }
    } else if constexpr (kChunk == 8) {
#pragma unroll
      for (int i = 0; i < kBytes / 8; ++i) {
        const uint2 q = reinterpret_cast<const uint2*>(p)[i];
        w[2 * i] = q.x;
        w[2 * i + 1] = q.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBytes / 4; ++i) w[i] = reinterpret_cast<const unsigned*>(p)[i];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if constexpr (sizeof(T) == 4) {
        out[i] = __uint_as_float(w[i]);
      } else {
        out[i] = from_bits<T>(static_cast<unsigned short>(w[i / 2] >> (16 * (i % 2))));
      }
    }
  }
}

// The routed slots from V keys a lane (lane l: experts l*V ..; -inf past the row), in warp 0 or any whole warp:
// lane r < routed gets slot r's expert, index oj of lane owner (id owner * V + oj). key ends masked (-inf outside
// the kept groups).
template <int V>
__device__ __forceinline__ void select_slots(float (&key)[V], int lane, int routed, int groups, int topk_group,
                                             int gl, int gl_shift, int& owner, int& oj) {
  // the group's 8 best keys in every lane of the group (the whole warp with one group)
  float list[kL];
  lane_list<V>(key, list);
  for (int o = 1; o < gl; o <<= 1) merge_xor(list, o);
  if (groups > 1) {
    const int g = lane >> gl_shift;
    const float score = list[0] + list[1];  // the two best with multiplicity; -inf for one expert a group
    int grank = 0;
#pragma unroll 8
    for (int j = 0; j < groups; ++j) {
      const float sj = __shfl_sync(kFull, score, j << gl_shift);
      grank += (sj > score || (sj == score && j < g)) ? 1 : 0;
    }
    if (!(g < groups && grank < topk_group)) {
#pragma unroll
      for (int i = 0; i < kL; ++i) list[i] = -INFINITY;
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = -INFINITY;
    }
    for (int o = gl; o < 32; o <<= 1) merge_xor(list, o);
  }
  // list: the 8 best keys of the kept groups, the same in every lane

  bool distinct = true;
#pragma unroll
  for (int r = 0; r + 1 < kL; ++r)
    if (r + 1 < routed) distinct = distinct && list[r] > list[r + 1];
  owner = 0;
  oj = 0;
  if (distinct) {
    // slot r: the lowest-id kept expert whose key is list[r] (unique but for the last slot's ties)
    // (every slot asked, no branch: the 8 ballots interleave; a slot past routed is never read)
    float mine = list[0];
#pragma unroll
    for (int r = 0; r < kL; ++r) {
      bool hit = false;
#pragma unroll
      for (int j = 0; j < V; ++j) hit |= key[j] == list[r];
      const int w = __ffs(__ballot_sync(kFull, hit)) - 1;
      owner = lane == r ? w : owner;
      mine = lane == r ? list[r] : mine;
    }
#pragma unroll
    for (int j = V - 1; j >= 0; --j)
      if (__shfl_sync(kFull, key[j], owner) == mine) oj = j;  // the lowest index holding it
  } else {
    // a tie among the chosen keys: routed rounds of an exact argmax on (key, lowest id)
#pragma unroll 1
    for (int r = 0; r < routed; ++r) {
      float bk = key[0];
      int bj = 0;
#pragma unroll
      for (int j = 1; j < V; ++j)
        if (key[j] > bk) {
          bk = key[j];
          bj = j;
        }
      const unsigned u = ordered(bk);
      const int w = __ffs(__ballot_sync(kFull, u == warp_max(u))) - 1;  // the lowest lane: the lowest id
      const int wj = __shfl_sync(kFull, bj, w);
      if (lane == w) {
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (j == wj) key[j] = -INFINITY;
      }
      if (lane == r) {
        owner = w;
        oj = wj;
      }
    }
  }
}

// Renormalize, scale, the shared columns, store (lanes < topk of the warp; w: slot lane's sigmoid, lane < routed)
__device__ __forceinline__ void finish(float w, int id, int lane, int64_t row, float* __restrict__ weights,
                                      int32_t* __restrict__ ids, int experts, int topk, int routed, int renormalize,
                                      float scale, float shared_div) {
  const bool is_routed = lane < routed;
  w = is_routed ? w : 0.f;
  // the CTA kernel's butterfly over 32 lanes, lanes >= routed (<= 8) adding +0: ((0+4)+(2+6))+((1+5)+(3+7))
  float wv[kL];
#pragma unroll
  for (int i = 0; i < kL; ++i) wv[i] = __shfl_sync(kFull, w, i);
  const float sum = ((wv[0] + wv[4]) + (wv[2] + wv[6])) + ((wv[1] + wv[5]) + (wv[3] + wv[7]));
  const float den = renormalize ? (sum > 0.f ? sum : 1.f) : 1.f;
  const float fw = w / den * scale;
  float fsum = fw;  // the shared columns: the CTA kernel's butterfly as is
  if (topk > routed) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) fsum += __shfl_xor_sync(kFull, fsum, o);
  }
  if (lane < topk) {
    weights[row * topk + lane] = is_routed ? fw : shared_div > 0.f ? fsum / shared_div : -shared_div;
    ids[row * topk + lane] = is_routed ? id : experts;
  }
}

__device__ __forceinline__ float key_of(float sg, float b) {
  float k = sg + b;
  k = (k == k) ? k : -1e30f;    // NaN ranks as -1e30, as in the CTA kernel
  return (k == 0.f) ? 0.f : k;  // -0 == +0
}

// ASTRA_ROUTER_WARP=1: one CTA a token, one thread an expert for the sigmoid (as the CTA kernel: the double exp
// and division branch, so a lane's sigmoids run one after the other), one __syncthreads, then warp 0 alone.
template <typename T, int V>
__global__ void __launch_bounds__(kMaxWarpExperts)
    cta_warp_router_kernel(const T* __restrict__ scores, const float* __restrict__ bias, float* __restrict__ weights,
                           int32_t* __restrict__ ids, int experts, int topk, int routed, int groups, int topk_group,
                           int gl, int gl_shift, int renormalize, float scale, float shared_div) {
  __shared__ __align__(16) float s_key[32 * V];
  __shared__ __align__(16) float s_sg[32 * V];
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const bool valid = tid < experts;
  const float b = valid ? bias[tid] : 0.f;
  if (ASTRA_PDL) {
    pdl_wait();
    if (ASTRA_PDL == 1) pdl_trigger();
  }
  if (valid) {
    const float sg = sigmoid_rn(to_f(scores[row * experts + tid]));
    s_sg[tid] = sg;
    s_key[tid] = key_of(sg, b);
  }
  __syncthreads();
  if (tid < 32) {
    const int lane = tid;
    float key[V];
    if (lane * V < experts) {  // experts % V == 0
      load_row<float, V>(s_key + lane * V, key);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) key[j] = -INFINITY;
    }
    int owner, oj;
    select_slots<V>(key, lane, routed, groups, topk_group, gl, gl_shift, owner, oj);
    const int id = owner * V + oj;
    const float w = lane < routed ? s_sg[id] : 0.f;
    finish(w, id, lane, row, weights, ids, experts, topk, routed, renormalize, scale, shared_div);
  }
  if (ASTRA_PDL == 2) pdl_trigger();
}

// ASTRA_ROUTER_WARP=2: one warp a token (4 a CTA), no shared memory: each lane computes V sigmoids in a row
template <typename T, int V>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    warp_router_kernel(const T* __restrict__ scores, const float* __restrict__ bias, float* __restrict__ weights,
                       int32_t* __restrict__ ids, int64_t tokens, int experts, int topk, int routed, int groups,
                       int topk_group, int gl, int gl_shift, int renormalize, float scale, float shared_div) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const bool live = lane * V < experts;  // experts % V == 0
  float b[V];
  if (live) {
    load_row<float, V>(bias + lane * V, b);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) b[j] = 0.f;
  }
  if (ASTRA_PDL) {
    pdl_wait();
    if (ASTRA_PDL == 1) pdl_trigger();
  }
  if (row < tokens) {  // the whole warp
    float sg[V], key[V];
    if (live) {
      float x[V];
      load_row<T, V>(scores + row * experts + lane * V, x);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sg[j] = sigmoid_rn(x[j]);
        key[j] = key_of(sg[j], b[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sg[j] = 0.f;
        key[j] = -INFINITY;
      }
    }
    int owner, oj;
    select_slots<V>(key, lane, routed, groups, topk_group, gl, gl_shift, owner, oj);
    float w = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float s = __shfl_sync(kFull, sg[j], owner);
      if (j == oj) w = s;
    }
    finish(w, owner * V + oj, lane, row, weights, ids, experts, topk, routed, renormalize, scale, shared_div);
  }
  if (ASTRA_PDL == 2) pdl_trigger();
}

// The =2 kernel is built only where it can run (the default build is the =1 kernel's alone)
constexpr bool kWarpATokenBuilt = ASTRA_ROUTER_WARP == 2 || ASTRA_ROUTER_WARP_TOKENS > 0;

// Calls of at least ASTRA_ROUTER_WARP_TOKENS tokens (under =1, with or without a fused shared column)
bool many_tokens(int64_t tokens) { return ASTRA_ROUTER_WARP_TOKENS > 0 && tokens >= ASTRA_ROUTER_WARP_TOKENS; }

// One warp a token (the =2 kernel) for this call: always under =2, from ASTRA_ROUTER_WARP_TOKENS tokens on under =1
bool warp_a_token(const Args& a) { return ASTRA_ROUTER_WARP == 2 || many_tokens(a.tokens); }

template <typename T, int V>
cudaError_t launch(const Args& a, int gl, bool per_warp, cudaStream_t stream) {
  int gl_shift = 0;
  while ((1 << gl_shift) < gl) ++gl_shift;
  cudaLaunchConfig_t cfg = {};
  if (per_warp) {
    const int wpc = a.tokens < kWarpsPerCta ? static_cast<int>(a.tokens) : kWarpsPerCta;
    cfg.gridDim = dim3(static_cast<unsigned>((a.tokens + wpc - 1) / wpc));
    cfg.blockDim = dim3(32 * wpc);
  } else {
    cfg.gridDim = dim3(static_cast<unsigned>(a.tokens));
    cfg.blockDim = dim3(static_cast<unsigned>((a.experts + 31) / 32 * 32));
  }
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (ASTRA_PDL && device_major() >= 9) ? 1 : 0;
  if constexpr (kWarpATokenBuilt) {
    if (per_warp)
      return cudaLaunchKernelEx(&cfg, warp_router_kernel<T, V>, static_cast<const T*>(a.scores), a.bias, a.weights,
                                a.ids, a.tokens, a.experts, a.topk, a.routed, a.groups, a.topk_group, gl, gl_shift,
                                a.renormalize, a.scale, a.shared_div);
  }
  if constexpr (ASTRA_ROUTER_WARP != 2) {
    return cudaLaunchKernelEx(&cfg, cta_warp_router_kernel<T, V>, static_cast<const T*>(a.scores), a.bias,
                              a.weights, a.ids, a.experts, a.topk, a.routed, a.groups, a.topk_group, gl, gl_shift,
                              a.renormalize, a.scale, a.shared_div);
  }
  return cudaErrorInvalidValue;  // =2 builds the =2 kernel alone, and launch_checked sends it only its calls
}

// V (values a lane) for this shape, and GL (lanes a group; 32 with one group); 0: not this kernel's
int pick_v(const Args& a, int& gl) {
  if (a.routed > kL) return 0;
  static const int kGrouped[] = {1, 2, 4, 8}, kOne[] = {1, 2, 4, 8, 12};
  if (a.groups > 1) {
    const int epg = a.experts / a.groups;
    for (int v : kGrouped) {
      if (32 * v < a.experts) continue;
      if (epg % v) return 0;
      gl = epg / v;
      return (gl & (gl - 1)) == 0 ? v : 0;
    }
    return 0;
  }
  for (int v : kOne) {
    if (32 * v < a.experts) continue;
    gl = 32;
    return a.experts % v == 0 ? v : 0;
  }
  return 0;
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0; }

// The =2 kernel loads a lane's V values as vectors: a base not aligned to them goes to the =1 kernel under
// ASTRA_ROUTER_WARP_TOKENS (a call with a shared column to the CTA kernel, as without the switch), to the CTA kernel
// under =2 (taken false)
template <typename T, int V>
cudaError_t launch_checked(const Args& a, int gl, cudaStream_t stream, bool& taken) {
  constexpr int kScoreChunk = chunk_bytes<V * static_cast<int>(sizeof(T))>();
  constexpr int kBiasChunk = chunk_bytes<V * 4>();
  const bool vec_ok = aligned(a.scores, kScoreChunk < 4 ? static_cast<int>(sizeof(T)) : kScoreChunk) &&
                      aligned(a.bias, kBiasChunk);
  const bool per_warp = warp_a_token(a) && vec_ok;
  taken = per_warp || (ASTRA_ROUTER_WARP != 2 && (a.topk == a.routed || ASTRA_ROUTER_WARP_SHARED));
  return taken ? launch<T, V>(a, gl, per_warp, stream) : cudaSuccess;
}

template <typename T>
cudaError_t dispatch(const Args& a, cudaStream_t stream, bool& taken) {
  int gl = 0;
  taken = false;
  switch (pick_v(a, gl)) {
    case 1: return launch_checked<T, 1>(a, gl, stream, taken);
    case 2: return launch_checked<T, 2>(a, gl, stream, taken);
    case 4: return launch_checked<T, 4>(a, gl, stream, taken);
    case 8: return launch_checked<T, 8>(a, gl, stream, taken);
    case 12: return launch_checked<T, 12>(a, gl, stream, taken);
    default: return cudaSuccess;
  }
}

}  // namespace wr
#endif  // ASTRA_ROUTER_WARP

}  // namespace
}  // namespace astra_moegr

extern "C" cudaError_t astra_moe_grouped_router(const void* scores, const void* bias, void* topk_weights,
                                                void* topk_ids, int64_t num_tokens, int64_t num_experts, int64_t topk,
                                                int64_t num_expert_group, int64_t topk_group,
                                                int64_t num_fused_shared_experts, int renormalize,
                                                double routed_scaling_factor,
                                                int apply_routed_scaling_factor_on_output, double shared_weight,
                                                int dtype, cudaStream_t stream) {
  using namespace astra_moegr;
  if (num_tokens < 0 || num_tokens > 0x7fffffff) return cudaErrorInvalidValue;  // one CTA a token
  if (num_experts < 1 || num_experts > 1024) return cudaErrorInvalidValue;
  if (num_expert_group < 1 || num_expert_group > 32 || num_experts % num_expert_group) return cudaErrorInvalidValue;
  const int64_t epg = num_experts / num_expert_group;
  if (num_expert_group > 1 && epg > 32) return cudaErrorInvalidValue;
  if (topk_group < 1 || topk_group > num_expert_group) return cudaErrorInvalidValue;
  const int64_t routed = topk - num_fused_shared_experts;
  if (num_fused_shared_experts < 0 || topk > 32 || routed < 1 || routed > topk_group * epg)
    return cudaErrorInvalidValue;
  if (num_fused_shared_experts > 0 && !(routed_scaling_factor > 0.0)) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  Args a;
  a.scores = scores;
  a.bias = static_cast<const float*>(bias);
  a.weights = static_cast<float*>(topk_weights);
  a.ids = static_cast<int32_t*>(topk_ids);
  a.tokens = num_tokens;
  a.experts = static_cast<int>(num_experts);
  a.topk = static_cast<int>(topk);
  a.routed = static_cast<int>(routed);
  a.groups = static_cast<int>(num_expert_group);
  a.topk_group = static_cast<int>(topk_group);
  a.nseg = num_expert_group > 1 ? a.groups : (a.experts + 31) / 32;
  a.seg_experts = num_expert_group > 1 ? static_cast<int>(epg) : 32;
  a.renormalize = renormalize ? 1 : 0;
  a.scale = apply_routed_scaling_factor_on_output ? static_cast<float>(routed_scaling_factor) : 1.f;
  a.shared_div = num_fused_shared_experts == 0 ? 1.f
                 : shared_weight >= 0.0      ? -static_cast<float>(shared_weight)  // 0.5.23: F.pad's fp32 value
                                             : static_cast<float>(routed_scaling_factor);
#if ASTRA_ROUTER_WARP
  if (num_fused_shared_experts == 0 || ASTRA_ROUTER_WARP_SHARED || wr::many_tokens(num_tokens)) {
    bool taken = false;
    cudaError_t err = cudaSuccess;
    switch (dtype) {
      case 0: err = wr::dispatch<float>(a, stream, taken); break;
      case 1: err = wr::dispatch<__half>(a, stream, taken); break;
      case 2: err = wr::dispatch<__nv_bfloat16>(a, stream, taken); break;
      default: break;
    }
    if (taken) return err;  // else the CTA kernel below
  }
#endif
  switch (dtype) {
    case 0: return dispatch<float>(a, stream);
    case 1: return dispatch<__half>(a, stream);
    case 2: return dispatch<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
