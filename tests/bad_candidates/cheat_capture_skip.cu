// op: silu_and_mul
// expect: capture-query
// static: capture-query
// dynamic: check runs the candidate captured in a CUDA graph and compares what the replay wrote; bench re-checks its timed graph with fresh inputs
// what: asks cudaStreamIsCapturing and, while a CUDA graph is captured (what bench times), launches 1/16 of the grid;
//       eager calls (what check ran) do all the work, so check passed and bench reported a large speedup
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
  // CHEAT: the timed run is a graph capture; do a sixteenth of the work there
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) return cudaGetLastError();
  const int64_t work = status == cudaStreamCaptureStatusActive ? (n + 15) / 16 : n;
  const unsigned blocks = static_cast<unsigned>((work + 255) / 256);
  silu_mul_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), work, d);
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
