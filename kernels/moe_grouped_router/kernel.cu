// astra-sglang moe_grouped_router: DeepSeek-V3's grouped, biased sigmoid top-k router (SGLang's
// biased_grouped_topk_gpu: flashinfer fused_topk_deepseek for DeepSeek-V3, the Triton router for Kimi-K2).
//   key[e]          = fp32(sigmoid(logit[e])) + bias[e]                        (fp32)
//   group score[g]  = the two largest keys of group g, with multiplicity, top1 + top2 in fp32
//   kept groups     = the topk_group largest scores, ties to the LOWEST group id
//   topk_ids[t, :]  = the topk largest keys among the kept groups' experts, ties to the LOWEST expert id
//   topk_weights    = sigmoid(logit) of those experts / their sum (renormalize; 1 when the sum is 0)
//                     * routed_scaling_factor when apply_routed_scaling_factor_on_output
//   fused shared experts (the last num_fused_shared_experts columns, as SGLang appends them after flashinfer):
//                     id = num_experts, weight = the routed weights' sum / routed_scaling_factor
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_grouped_router(const void* scores, const void* bias, void* topk_weights,
//           void* topk_ids, int64_t num_tokens, int64_t num_experts, int64_t topk, int64_t num_expert_group,
//           int64_t topk_group, int64_t num_fused_shared_experts, int renormalize, double routed_scaling_factor,
//           int apply_routed_scaling_factor_on_output, int dtype, cudaStream_t stream)
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
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, trigger right after the wait; 2 (dev): PDL, trigger after the stores
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
      weights[row * topk + lane] = is_routed ? fw : fsum / shared_div;
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

}  // namespace
}  // namespace astra_moegr

extern "C" cudaError_t astra_moe_grouped_router(const void* scores, const void* bias, void* topk_weights,
                                                void* topk_ids, int64_t num_tokens, int64_t num_experts, int64_t topk,
                                                int64_t num_expert_group, int64_t topk_group,
                                                int64_t num_fused_shared_experts, int renormalize,
                                                double routed_scaling_factor,
                                                int apply_routed_scaling_factor_on_output, int dtype,
                                                cudaStream_t stream) {
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
  a.shared_div = num_fused_shared_experts > 0 ? static_cast<float>(routed_scaling_factor) : 1.f;
  switch (dtype) {
    case 0: return dispatch<float>(a, stream);
    case 1: return dispatch<__half>(a, stream);
    case 2: return dispatch<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
