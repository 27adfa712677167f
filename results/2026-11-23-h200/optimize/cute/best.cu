// optimize fixture: a CuTe-based silu_and_mul candidate, out[t, i] = silu(x[t, i]) * x[t, d + i].
//
// The rows are CuTe tensors over global memory (shape [tokens, d], row stride 2d for the input);
// each thread takes one V-element slice of a row (V = the widest vector <= 16 bytes that divides d
// and the pointers' alignment), copies gate and up into register fragments with a vectorizing copy,
// computes in fp32 and copies the result back. Written to measure what a CuTe candidate costs to
// compile cold (headers: CUTLASS/CuTe as flashinfer-python ships them) and to run it through check
// and bench; not a tuned kernel.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

#include <cute/tensor.hpp>

namespace cute_fx {
using namespace cute;

constexpr int kThreads = 256;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) silu_mul(T* __restrict__ out, const T* __restrict__ in, int hidden,
                                                     int vecs_per_row, int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / vecs_per_row;
  const int col = static_cast<int>(i - row * vecs_per_row) * V;
  // [tokens, d] views: the input's gate half, its up half (offset d) and the output
  Tensor gate = make_tensor(make_gmem_ptr(in + row * 2 * hidden + col), make_layout(Int<V>{}));
  Tensor up = make_tensor(make_gmem_ptr(in + row * 2 * hidden + hidden + col), make_layout(Int<V>{}));
  Tensor dst = make_tensor(make_gmem_ptr(out + row * hidden + col), make_layout(Int<V>{}));
  Tensor rg = make_tensor<T>(Int<V>{});
  Tensor ru = make_tensor<T>(Int<V>{});
  Tensor ro = make_tensor<T>(Int<V>{});
  constexpr int kBits = 8 * sizeof(T) * V < 128 ? 8 * sizeof(T) * V : 128;  // float x 8 is two 16-byte moves
  using Vec = AutoVectorizingCopyWithAssumedAlignment<kBits>;
  copy(Vec{}, gate, rg);
  copy(Vec{}, up, ru);
  CUTE_UNROLL
  for (int k = 0; k < V; ++k) {
    const float g = to_f(rg(k));
    ro(k) = from_f<T>(g / (1.0f + expf(-g)) * to_f(ru(k)));
  }
  copy(Vec{}, ro, dst);
}

template <typename T, int V>
cudaError_t launch(void* out, const void* in, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  const int64_t vecs = hidden / V;
  const int64_t total = tokens * vecs;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffffll || hidden > 0x3fffffffll) return cudaErrorInvalidValue;
  silu_mul<T, V><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(in), static_cast<int>(hidden), static_cast<int>(vecs), total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t run(void* out, const void* in, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  if (tokens <= 0 || hidden <= 0) return cudaSuccess;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(in);
  int v = 16 / static_cast<int>(sizeof(T));
  while (v > 1 && (hidden % v != 0 || addr % (v * sizeof(T)) != 0)) v /= 2;
  switch (v) {
    case 8: return launch<T, 8>(out, in, tokens, hidden, stream);
    case 4: return launch<T, 4>(out, in, tokens, hidden, stream);
    case 2: return launch<T, 2>(out, in, tokens, hidden, stream);
    default: return launch<T, 1>(out, in, tokens, hidden, stream);
  }
}

}  // namespace cute_fx

extern "C" cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden, int dtype,
                                          cudaStream_t stream) {
  switch (dtype) {
    case 0: return cute_fx::run<float>(out, input, num_tokens, hidden, stream);
    case 1: return cute_fx::run<__half>(out, input, num_tokens, hidden, stream);
    case 2: return cute_fx::run<__nv_bfloat16>(out, input, num_tokens, hidden, stream);
    default: return cudaErrorInvalidValue;
  }
}
