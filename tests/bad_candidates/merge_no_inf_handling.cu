// op: merge_state
// expect: inf_lse: candidate's (v_out|s_out)
// what: treats +inf lse as a real value: NaN (inf - inf) where an empty partial must give the other side
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cmath>

namespace {
__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
}  // namespace

template <typename T>
__global__ void merge_kernel(const T* va, const float* sa_, const T* vb, const float* sb_, T* vo, float* so,
                             int64_t rows, int64_t d) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * d) return;
  const int64_t row = i / d;
  float sa = sa_[row], sb = sb_[row];
  // BUG: no mapping of infinite lse
  const float m = fmaxf(sa, sb);
  const float pa = expf(sa - m), pb = expf(sb - m);
  const float se = pa + pb;
  st(vo, i, ld(va, i) * (pa / se) + ld(vb, i) * (pb / se));
  if (i % d == 0 && so != nullptr) so[row] = logf(se) + m;
}

template <typename T>
cudaError_t run(const void* va, const void* sa, const void* vb, const void* sb, void* vo, void* so, int64_t rows,
                int64_t d, cudaStream_t stream) {
  const int64_t n = rows * d;
  if (n == 0) return cudaSuccess;
  merge_kernel<T><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<const T*>(va), static_cast<const float*>(sa), static_cast<const T*>(vb), static_cast<const float*>(sb),
      static_cast<T*>(vo), static_cast<float*>(so), rows, d);
  return cudaGetLastError();
}

extern "C" cudaError_t astra_merge_state(const void* v_a, const void* s_a, const void* v_b, const void* s_b,
                                         void* v_out, void* s_out, int64_t num_tokens, int64_t num_heads,
                                         int64_t head_dim, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case 0: return run<float>(v_a, s_a, v_b, s_b, v_out, s_out, num_tokens * num_heads, head_dim, stream);
    case 1: return run<__half>(v_a, s_a, v_b, s_b, v_out, s_out, num_tokens * num_heads, head_dim, stream);
    case 2: return run<__nv_bfloat16>(v_a, s_a, v_b, s_b, v_out, s_out, num_tokens * num_heads, head_dim, stream);
    default: return cudaErrorInvalidValue;
  }
}
