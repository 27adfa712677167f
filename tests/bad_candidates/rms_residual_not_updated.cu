// op: fused_add_rmsnorm
// expect: candidate's residual error
// what: normalizes input + residual but never writes the sum back to residual
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

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) rms_kernel(T* input, T* residual, const T* weight, int64_t h, float eps) {
  T* in = input + static_cast<int64_t>(blockIdx.x) * h;
  T* res = residual + static_cast<int64_t>(blockIdx.x) * h;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += kThreads) {
    const float x = ld(in, j) + ld(res, j);
    ss = ss + x * x;
  }
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss = ss + __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total = total + warp_sums[w];
  const float inv = rsqrtf(total / static_cast<float>(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += kThreads) {
    const float x = ld(in, j) + ld(res, j);
    // BUG: residual is never updated
    st(in, j, x * inv * ld(weight, j));
  }
}

template <typename T>
cudaError_t run(void* input, void* residual, const void* weight, int64_t tokens, int64_t h, double eps,
                cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  rms_kernel<T><<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      static_cast<T*>(input), static_cast<T*>(residual), static_cast<const T*>(weight), h, static_cast<float>(eps));
  return cudaGetLastError();
}

extern "C" cudaError_t astra_fused_add_rmsnorm(void* input, void* residual, const void* weight, int64_t num_tokens,
                                               int64_t hidden, double eps, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 0: return run<float>(input, residual, weight, num_tokens, hidden, eps, stream);
    case 1: return run<__half>(input, residual, weight, num_tokens, hidden, eps, stream);
    case 2: return run<__nv_bfloat16>(input, residual, weight, num_tokens, hidden, eps, stream);
    default: return cudaErrorInvalidValue;
  }
}
