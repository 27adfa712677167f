// astra-sglang moe_router: SGLang's softmax top-k router (fused_topk -> _router_triton_kernel, softmax scoring).
//   topk_ids[t, :]     = the topk experts of scores[t, :] by descending fp32 logit, ties to the LOWEST expert id
//   topk_weights[t, :] = exp(s - max) / sum_all exp(s - max)   at those experts (fp32);
//                        renormalize: exp(s - max) / sum over the chosen  (1 as divisor when that sum is 0)
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_router(const void* scores, void* topk_weights, void* topk_ids,
//           int64_t num_tokens, int64_t num_experts, int64_t topk, int renormalize, int dtype, cudaStream_t stream)
// scores [tokens, experts] contiguous, dtype 0 fp32, 1 fp16, 2 bf16; topk_weights fp32 [tokens, topk], topk_ids
// int32 [tokens, topk]; experts <= 1024, topk <= 32. Launches on `stream` only; no allocation, no host sync, no
// bias buffer (SGLang's softmax path adds a zero bias: the per-call torch.zeros fill it makes is not needed).
//
// Design (not yet timed on a GPU: kernels/moe_router/RESULTS.md):
//  * One warp per token. Lane l holds experts l, l + 32, ... (V = 1..32 values, a power of 2 >= experts / 32):
//    coalesced loads of the row, the whole row in registers.
//  * Softmax in fp32: warp max, p = expf(s - max) (precise expf, IEEE division), warp sum for the unnormalized
//    weights.
//  * topk rounds of a warp argmax on (value, id): larger value wins, equal values the lower id, exactly SGLang's
//    `min(where(is_max, n, N + 1))`, as two __reduce_max_sync on order-preserving integer keys (value, then
//    0xFFFF - id among the lanes holding the maximum) instead of a 5-step shuffle tree of pairs; the winner leaves the race as -inf, as in the Triton kernel (so a row with
//    fewer finite logits than topk repeats the lowest -inf id, as production does). NaN logits rank as -1e30.
//    Slot r's weight and id stay in lane r's registers; each lane writes its own slot.
//  * Programmatic dependent launch on sm_90+ (house style, kernels/fused_add_rmsnorm): every read and write sits
//    behind griddepcontrol.wait; the dependents are released right after it.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, trigger right after the wait
#endif

namespace astra_moer {
namespace {

constexpr int kWarpsPerBlock = 4;
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

constexpr int kIdBase = 0xFFFF;  // ids (and padded lane ids) stay below 1024: kIdBase - id > 0

// An unsigned key with the order of the float (-0 and +0 equal: canonicalized by the caller; no NaN here).
__device__ __forceinline__ unsigned ordered_key(float f) {
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
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

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) moe_router_kernel(const T* __restrict__ scores,
                                                                          float* __restrict__ weights,
                                                                          int32_t* __restrict__ ids, int64_t tokens,
                                                                          int experts, int topk, int renormalize) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  if (row >= tokens) return;
  const T* src = scores + row * experts;

  float s[V];  // logits (-inf past the row) for the softmax
  float v[V];  // ranking values: logits, NaN as -1e30, -inf once taken
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int e = j * 32 + lane;
    s[j] = e < experts ? to_f(src[e]) : -INFINITY;
  }
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    v[j] = (s[j] == s[j]) ? s[j] : -1e30f;  // NaN ranks as -1e30 (SGLang's kernel)
    if (v[j] == 0.f) v[j] = 0.f;              // -0 == +0: equal keys, the lower id wins
    m = fmaxf(m, s[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  float p[V];
  float total = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    p[j] = (j * 32 + lane) < experts ? expf(s[j] - m) : 0.f;
    total += p[j];
  }

  float my_w = 0.f;
  int my_id = 0;
  for (int r = 0; r < topk; ++r) {
    // this lane's best: ids rise with j, so a strict > keeps the lowest id among equals
    float bv = v[0];
    int bi = lane;
#pragma unroll
    for (int j = 1; j < V; ++j) {
      if (v[j] > bv) {
        bv = v[j];
        bi = j * 32 + lane;
      }
    }
    // the warp's best (value, then lowest id): two integer max reductions on order-preserving keys
    const unsigned key = ordered_key(bv);
    const unsigned top = warp_max(key);
    bi = kIdBase - static_cast<int>(warp_max(key == top ? static_cast<unsigned>(kIdBase - bi) : 0u));
    float w = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j * 32 + lane == bi) {
        w = p[j];
        v[j] = -INFINITY;
      }
    }
    w = __shfl_sync(kFull, w, bi & 31);
    if (lane == r) {
      my_w = w;
      my_id = bi;
    }
  }
  // warp sums: the chosen weights (lanes >= topk hold 0) and the whole row's exponentials
  float routed = lane < topk ? my_w : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    routed += __shfl_xor_sync(kFull, routed, o);
    total += __shfl_xor_sync(kFull, total, o);
  }
  if (lane < topk) {
    const float den = renormalize ? (routed > 0.f ? routed : 1.f) : total;
    weights[row * topk + lane] = my_w / den;
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

template <typename T, int V>
cudaError_t launch(const void* scores, void* weights, void* ids, int64_t tokens, int experts, int topk,
                   int renormalize, cudaStream_t stream) {
  const int wpb = tokens < kWarpsPerBlock ? static_cast<int>(tokens) : kWarpsPerBlock;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((tokens + wpb - 1) / wpb));
  cfg.blockDim = dim3(32 * wpb);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (ASTRA_PDL && device_info().major >= 9) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, moe_router_kernel<T, V>, static_cast<const T*>(scores),
                            static_cast<float*>(weights), static_cast<int32_t*>(ids), tokens, experts, topk,
                            renormalize);
}

template <typename T>
cudaError_t dispatch(const void* scores, void* weights, void* ids, int64_t tokens, int experts, int topk,
                     int renormalize, cudaStream_t stream) {
  if (experts <= 32) return launch<T, 1>(scores, weights, ids, tokens, experts, topk, renormalize, stream);
  if (experts <= 64) return launch<T, 2>(scores, weights, ids, tokens, experts, topk, renormalize, stream);
  if (experts <= 128) return launch<T, 4>(scores, weights, ids, tokens, experts, topk, renormalize, stream);
  if (experts <= 256) return launch<T, 8>(scores, weights, ids, tokens, experts, topk, renormalize, stream);
  if (experts <= 512) return launch<T, 16>(scores, weights, ids, tokens, experts, topk, renormalize, stream);
  return launch<T, 32>(scores, weights, ids, tokens, experts, topk, renormalize, stream);
}

}  // namespace
}  // namespace astra_moer

extern "C" cudaError_t astra_moe_router(const void* scores, void* topk_weights, void* topk_ids, int64_t num_tokens,
                                        int64_t num_experts, int64_t topk, int renormalize, int dtype,
                                        cudaStream_t stream) {
  using namespace astra_moer;
  if (num_tokens < 0 || num_experts < 1 || num_experts > 1024 || topk < 1 || topk > 32) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  if (num_tokens > (int64_t(1) << 40)) return cudaErrorInvalidValue;
  const int e = static_cast<int>(num_experts), k = static_cast<int>(topk), rn = renormalize ? 1 : 0;
  switch (dtype) {
    case 0: return dispatch<float>(scores, topk_weights, topk_ids, num_tokens, e, k, rn, stream);
    case 1: return dispatch<__half>(scores, topk_weights, topk_ids, num_tokens, e, k, rn, stream);
    case 2: return dispatch<__nv_bfloat16>(scores, topk_weights, topk_ids, num_tokens, e, k, rn, stream);
    default: return cudaErrorInvalidValue;
  }
}
