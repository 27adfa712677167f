// astra-sglang moe_grouped_router: DeepSeek-V3's grouped, biased sigmoid top-k router (SGLang's
// biased_grouped_topk_gpu: flashinfer fused_topk_deepseek for DeepSeek-V3, the Triton router for Kimi-K2).
//   key[e]          = fp32(sigmoid(logit[e])) + bias[e]                        (fp32)
//   group score[g]  = the two largest keys of group g, with multiplicity, top1 + top2 in fp32
//   kept groups     = the topk_group largest scores, ties to the LOWEST group id
//   topk_ids[t, :]  = the topk largest keys among the kept groups' experts, ties to the LOWEST expert id
//   topk_weights    = sigmoid(logit) of those experts / their sum (renormalize; 1 when the sum is 0)
//                     * routed_scaling_factor when apply_routed_scaling_factor_on_output
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_grouped_router(const void* scores, const void* bias, void* topk_weights,
//           void* topk_ids, int64_t num_tokens, int64_t num_experts, int64_t topk, int64_t num_expert_group,
//           int64_t topk_group, int renormalize, double routed_scaling_factor,
//           int apply_routed_scaling_factor_on_output, int dtype, cudaStream_t stream)
// scores [tokens, experts] contiguous, dtype 0 fp32, 1 fp16, 2 bf16; bias fp32 [experts]; topk_weights fp32
// [tokens, topk], topk_ids int32 [tokens, topk]. experts <= 1024, divisible by num_expert_group <= 32;
// 1 <= topk_group <= num_expert_group; 1 <= topk <= min(32, topk_group * experts / num_expert_group).
// Launches on `stream` only; no allocation, no host sync.
//
// Design (not yet timed on a GPU: kernels/moe_grouped_router/RESULTS.md):
//  * One warp per token. Lane l holds experts l, l + 32, ... (V = 1..32 values, a power of 2 >= experts / 32):
//    coalesced loads of the row and of the bias, the whole row in registers.
//  * The sigmoid is computed in double and rounded to fp32 (correctly rounded but for ~2^-29 of inputs): the
//    ranking keys are then the ones an exact reference computes, whatever fp32 sigmoid production uses.
//  * Group scores: per group, each lane's top-2 of its experts in the group, then three warp max reductions on
//    order-preserving integer keys: the maximum, the lowest lane holding it, the maximum once that lane offers its
//    second value instead (a tied maximum counts twice, as flashinfer's kernel). Lane g keeps group g's score.
//  * topk_group rounds of a warp argmax over the group lanes (value, then the lowest id) build a kept-group mask;
//    the other groups' keys become -inf.
//  * topk rounds of a warp argmax on (key, lowest id), as kernels/moe_router; slot r's weight and id stay in lane
//    r; a warp sum renormalizes. NaN keys rank as -1e30 (the Triton router's rule; outside the contract).
//  * Programmatic dependent launch on sm_90+ (house style): every read and write sits behind
//    griddepcontrol.wait; the dependents are released right after it.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, trigger right after the wait
#endif

namespace astra_moegr {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kIdBase = 0xFFFF;  // ids stay below 1024: kIdBase - id > 0

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

// An unsigned key with the order of the float (callers canonicalize -0 to +0 and remove NaN).
__device__ __forceinline__ unsigned ordered_key(float f) {
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
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

// The lowest lane / id among those whose key equals `top`.
__device__ __forceinline__ int lowest_at(unsigned key, unsigned top, int id) {
  return kIdBase - static_cast<int>(warp_max(key == top ? static_cast<unsigned>(kIdBase - id) : 0u));
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float sigmoid_rn(float x) {
  return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(x))));
}

template <typename T, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    moe_grouped_router_kernel(const T* __restrict__ scores, const float* __restrict__ bias,
                              float* __restrict__ weights, int32_t* __restrict__ ids, int64_t tokens, int experts,
                              int topk, int groups, int topk_group, int renormalize, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  if (row >= tokens) return;
  const T* src = scores + row * experts;

  float sg[V];   // unbiased sigmoid: the weights
  float key[V];  // ranking keys: sigmoid + bias, -inf past the row
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int e = j * 32 + lane;
    if (e < experts) {
      sg[j] = sigmoid_rn(to_f(src[e]));
      float k = sg[j] + bias[e];
      k = (k == k) ? k : -1e30f;  // NaN ranks as -1e30
      key[j] = (k == 0.f) ? 0.f : k;  // -0 == +0: equal keys, the lower id wins
    } else {
      sg[j] = 0.f;
      key[j] = -INFINITY;
    }
  }

  if (groups > 1) {
    const int epg = experts / groups;
    float my_gs = -INFINITY;
    for (int g = 0; g < groups; ++g) {
      float a1 = -INFINITY, a2 = -INFINITY;  // this lane's top-2 in group g, with multiplicity
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int e = j * 32 + lane;
        if (e < experts && e / epg == g) {
          const float v = key[j];
          if (v > a1) {
            a2 = a1;
            a1 = v;
          } else if (v > a2) {
            a2 = v;
          }
        }
      }
      const unsigned k1 = ordered_key(a1);
      const unsigned top1 = warp_max(k1);
      const int first = lowest_at(k1, top1, lane);
      const unsigned top2 = warp_max(lane == first ? ordered_key(a2) : k1);
      const float gs = key_value(top1) + key_value(top2);
      if (lane == g) my_gs = gs;
    }
    unsigned kept = 0u;
    bool taken = false;
    for (int r = 0; r < topk_group; ++r) {
      const unsigned k = (lane < groups && !taken) ? ordered_key(my_gs) : 0u;  // any group's key is > 0
      const int gid = lowest_at(k, warp_max(k), lane);
      kept |= 1u << gid;
      if (lane == gid) taken = true;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int e = j * 32 + lane;
      if (e < experts && !((kept >> (e / epg)) & 1u)) key[j] = -INFINITY;
    }
  }

  float my_w = 0.f;
  int my_id = 0;
  for (int r = 0; r < topk; ++r) {
    // this lane's best: ids rise with j, so a strict > keeps the lowest id among equals
    float bv = key[0];
    int bi = lane;
#pragma unroll
    for (int j = 1; j < V; ++j) {
      if (key[j] > bv) {
        bv = key[j];
        bi = j * 32 + lane;
      }
    }
    const unsigned k = ordered_key(bv);
    bi = lowest_at(k, warp_max(k), bi);
    float w = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j * 32 + lane == bi) {
        w = sg[j];
        key[j] = -INFINITY;
      }
    }
    w = __shfl_sync(kFull, w, bi & 31);
    if (lane == r) {
      my_w = w;
      my_id = bi;
    }
  }
  float routed = lane < topk ? my_w : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) routed += __shfl_xor_sync(kFull, routed, o);
  if (lane < topk) {
    const float den = renormalize ? (routed > 0.f ? routed : 1.f) : 1.f;
    weights[row * topk + lane] = my_w / den * scale;
    ids[row * topk + lane] = my_id;
  }
}

struct DeviceInfo {
  int major = 0;
};

DeviceInfo device_info() {
  static int cached_dev = -1;
  static DeviceInfo info;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DeviceInfo{};
  if (dev != cached_dev) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    info.major = major;
    cached_dev = dev;
  }
  return info;
}

struct Args {
  const void* scores;
  const float* bias;
  float* weights;
  int32_t* ids;
  int64_t tokens;
  int experts, topk, groups, topk_group, renormalize;
  float scale;
};

template <typename T, int V>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  const int wpb = a.tokens < kWarpsPerBlock ? static_cast<int>(a.tokens) : kWarpsPerBlock;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((a.tokens + wpb - 1) / wpb));
  cfg.blockDim = dim3(32 * wpb);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (ASTRA_PDL && device_info().major >= 9) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, moe_grouped_router_kernel<T, V>, static_cast<const T*>(a.scores), a.bias,
                            a.weights, a.ids, a.tokens, a.experts, a.topk, a.groups, a.topk_group, a.renormalize,
                            a.scale);
}

template <typename T>
cudaError_t dispatch(const Args& a, cudaStream_t stream) {
  if (a.experts <= 32) return launch<T, 1>(a, stream);
  if (a.experts <= 64) return launch<T, 2>(a, stream);
  if (a.experts <= 128) return launch<T, 4>(a, stream);
  if (a.experts <= 256) return launch<T, 8>(a, stream);
  if (a.experts <= 512) return launch<T, 16>(a, stream);
  return launch<T, 32>(a, stream);
}

}  // namespace
}  // namespace astra_moegr

extern "C" cudaError_t astra_moe_grouped_router(const void* scores, const void* bias, void* topk_weights,
                                                void* topk_ids, int64_t num_tokens, int64_t num_experts, int64_t topk,
                                                int64_t num_expert_group, int64_t topk_group, int renormalize,
                                                double routed_scaling_factor,
                                                int apply_routed_scaling_factor_on_output, int dtype,
                                                cudaStream_t stream) {
  using namespace astra_moegr;
  if (num_tokens < 0 || num_tokens > (int64_t(1) << 40)) return cudaErrorInvalidValue;
  if (num_experts < 1 || num_experts > 1024) return cudaErrorInvalidValue;
  if (num_expert_group < 1 || num_expert_group > 32 || num_experts % num_expert_group) return cudaErrorInvalidValue;
  if (topk_group < 1 || topk_group > num_expert_group) return cudaErrorInvalidValue;
  if (topk < 1 || topk > 32 || topk > topk_group * (num_experts / num_expert_group)) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  Args a;
  a.scores = scores;
  a.bias = static_cast<const float*>(bias);
  a.weights = static_cast<float*>(topk_weights);
  a.ids = static_cast<int32_t*>(topk_ids);
  a.tokens = num_tokens;
  a.experts = static_cast<int>(num_experts);
  a.topk = static_cast<int>(topk);
  a.groups = static_cast<int>(num_expert_group);
  a.topk_group = static_cast<int>(topk_group);
  a.renormalize = renormalize ? 1 : 0;
  a.scale = apply_routed_scaling_factor_on_output ? static_cast<float>(routed_scaling_factor) : 1.f;
  switch (dtype) {
    case 0: return dispatch<float>(a, stream);
    case 1: return dispatch<__half>(a, stream);
    case 2: return dispatch<__nv_bfloat16>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
