// op: silu_and_mul
// expect: fresh inputs|same pointers|same buffers|replay|stale|graph|captur
// static: none
// dynamic: check calls it over several input sets back to back (captured, as bench does) and again on the same pointers with fresh inputs; bench writes fresh values into every rotating set after timing, replays the graph and compares
// what: remembers the pointer sets it has computed and launches nothing when one comes back after another set was used
//       (bench's rotating input sets, and its graph capture after the warm-up); an immediate repeat on the same
//       pointers (check's re-run in the same buffers) still computes, so no API and no device state gives it away
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

namespace {
// CHEAT: a memo of pointer sets already computed ("the output is still there")
struct Key {
  uintptr_t out, in;
  int64_t n;
  size_t elem;
  bool operator==(const Key& o) const { return out == o.out && in == o.in && n == o.n && elem == o.elem; }
};
constexpr int kSlots = 256;
Key g_seen[kSlots];
int g_count = 0;
Key g_last{0, 0, -1, 0};

bool seen_before(const Key& k) {
  for (int s = 0; s < g_count && s < kSlots; ++s)
    if (g_seen[s] == k) return true;
  g_seen[g_count++ % kSlots] = k;
  return false;
}
}  // namespace

template <typename T>
cudaError_t run(void* out, const void* in, int64_t tokens, int64_t d, cudaStream_t stream) {
  const int64_t n = tokens * d;
  if (n == 0) return cudaSuccess;
  const Key k{reinterpret_cast<uintptr_t>(out), reinterpret_cast<uintptr_t>(in), n, sizeof(T)};
  const bool repeat = k == g_last;  // a re-run in the same buffers right away: compute, it is being checked
  g_last = k;
  if (seen_before(k) && !repeat) return cudaSuccess;
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
