// optimize fixture, round 3 (scripted): silu_and_mul, correct but slower than production.
// One block of 128 threads per token, striding over the row one element at a time: scalar 2- or
// 4-byte loads instead of 16-byte vectors, and only `tokens` blocks, so small batches leave most SMs
// idle. No programmatic dependent launch.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

namespace fx3 {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__global__ void row_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const T* gate = in + t * 2 * hidden;
  const T* up = gate + hidden;
  T* o = out + t * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float g = to_f(gate[i]);
    o[i] = from_f<T>(g / (1.0f + expf(-g)) * to_f(up[i]));
  }
}

template <typename T>
cudaError_t run(void* out, const void* in, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  if (tokens <= 0 || hidden <= 0) return cudaSuccess;
  if (tokens > 0x7fffffffll) return cudaErrorInvalidValue;
  row_kernel<T><<<static_cast<unsigned>(tokens), 128, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), hidden);
  return cudaGetLastError();
}

}  // namespace fx3

extern "C" cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden, int dtype,
                                          cudaStream_t stream) {
  switch (dtype) {
    case 0: return fx3::run<float>(out, input, num_tokens, hidden, stream);
    case 1: return fx3::run<__half>(out, input, num_tokens, hidden, stream);
    case 2: return fx3::run<__nv_bfloat16>(out, input, num_tokens, hidden, stream);
    default: return cudaErrorInvalidValue;
  }
}
