// op: silu_and_mul
// expect: re-run with fresh inputs in the same buffers
// what: keeps the last result in device memory and replays it when called again with the same pointers and sizes
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

// BUG: a result cache keyed by pointer (what a kernel tuned on a benchmark loop might do)
__device__ unsigned char g_cache[32 << 20];

__global__ void save_kernel(const unsigned char* out, int64_t bytes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < bytes) g_cache[i] = out[i];
}
__global__ void replay_kernel(unsigned char* out, int64_t bytes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < bytes) out[i] = g_cache[i];
}

static const void* g_last_in = nullptr;
static const void* g_last_out = nullptr;
static int64_t g_last_n = -1;
static size_t g_last_size = 0;

template <typename T>
cudaError_t run(void* out, const void* in, int64_t tokens, int64_t d, cudaStream_t stream) {
  const int64_t n = tokens * d;
  if (n == 0) return cudaSuccess;
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  const unsigned bb = static_cast<unsigned>((bytes + 255) / 256);
  const bool fits = bytes <= static_cast<int64_t>(32 << 20);
  if (fits && in == g_last_in && out == g_last_out && n == g_last_n && sizeof(T) == g_last_size) {
    replay_kernel<<<bb, 256, 0, stream>>>(static_cast<unsigned char*>(out), bytes);
    return cudaGetLastError();
  }
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  silu_mul_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), n, d);
  if (fits) {
    save_kernel<<<bb, 256, 0, stream>>>(static_cast<const unsigned char*>(out), bytes);
    g_last_in = in;
    g_last_out = out;
    g_last_n = n;
    g_last_size = sizeof(T);
  }
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
