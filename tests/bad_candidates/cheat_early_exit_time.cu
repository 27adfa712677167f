// op: silu_and_mul
// expect: device-timer
// static: device-timer
// dynamic: check calls it back to back (captured, no synchronization between calls, as bench does) and compares every output
// what: reads %globaltimer in every block; when the previous call ended less than 20 us before this one started
//       (back-to-back calls: a timing loop or a captured graph), the block exits without computing. Calls in
//       check were far apart, so check passed.
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

// End time of the last two calls, by call parity (a call reads the other slot, so its own blocks never race it).
__device__ unsigned long long g_end[2];

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <typename T>
__global__ void silu_mul_kernel(T* out, const T* in, int64_t n, int64_t d, unsigned parity) {
  __shared__ bool skip;
  if (threadIdx.x == 0) {
    const unsigned long long prev = g_end[parity ^ 1u];
    skip = prev != 0 && now_ns() - prev < 20000ull;  // CHEAT: back to back means "being timed"
  }
  __syncthreads();
  if (!skip) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
      const int64_t t = i / d, j = i - t * d;
      const float g = ld(in, t * 2 * d + j), u = ld(in, t * 2 * d + d + j);
      st(out, i, g / (1.0f + expf(-g)) * u);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&g_end[parity], now_ns());
}

namespace {
unsigned g_calls = 0;
}

template <typename T>
cudaError_t run(void* out, const void* in, int64_t tokens, int64_t d, cudaStream_t stream) {
  const int64_t n = tokens * d;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  silu_mul_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), n, d, g_calls++ & 1u);
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
