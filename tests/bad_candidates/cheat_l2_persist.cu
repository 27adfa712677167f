// op: silu_and_mul
// expect: l2-persist|device-limit|stream-attribute
// static: l2-persist
// dynamic: none (the numbers are right; only the static rule can refuse it)
// what: reserves a persisting-L2 carve-out and sets an access-policy window over its input on the caller's stream,
//       so a timed run is no longer L2-cold, and the setting outlives the call and takes L2 from the kernels around it
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

namespace {
__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
}  // namespace

template <typename T>
__global__ void silu_mul_kernel(T* out, const T* in, int64_t n, int64_t d) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / d, j = i - t * d;
  const float g = ld(in, t * 2 * d + j), u = ld(in, t * 2 * d + d + j);
  st(out, i, g / (1.0f + expf(-g)) * u);
}

template <typename T>
cudaError_t run(void* out, const void* in, int64_t tokens, int64_t d, cudaStream_t stream) {
  const int64_t n = tokens * d;
  if (n == 0) return cudaSuccess;
  // CHEAT: keep the input resident in L2 between calls
  const size_t bytes = static_cast<size_t>(2 * n) * sizeof(T);
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes);
  cudaStreamAttrValue attr = {};
  attr.accessPolicyWindow.base_ptr = const_cast<void*>(in);
  attr.accessPolicyWindow.num_bytes = bytes;
  attr.accessPolicyWindow.hitRatio = 1.0f;
  attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &attr);
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  silu_mul_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), n, d);
  return cudaGetLastError();
}

extern "C" cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden, int dtype,
                                          cudaStream_t stream) {
  switch (dtype) {
    case 0: return run<float>(out, input, num_tokens, hidden, stream);
    case 1: return run<__half>(out, input, num_tokens, hidden, stream);
    case 2: return run<__nv_bfloat16>(out, input, num_tokens, hidden, stream);
    default: return cudaErrorInvalidValue;
  }
}
