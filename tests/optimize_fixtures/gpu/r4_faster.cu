// optimize fixture, round 4 (scripted): silu_and_mul, out[t, i] = silu(x[t, i]) * x[t, d + i].
//
// Flat grid over [tokens, d / V] vectors, V = the widest vector (<= 16 bytes) that divides d and the
// pointers' alignment, so every hidden size works; 256 threads, one vector of gate and one of up per
// thread. The change against production is in the launch/latency path, which is what small (decode)
// shapes pay for:
//  * programmatic dependent launch (sm_90+): each thread asks L2 to prefetch its two input vectors,
//    then waits for the previous grid (griddepcontrol.wait), then releases the next grid at once
//    (launch_dependents) instead of after its stores, so the next call's launch overlaps this one;
//  * every read and write of the op's buffers comes after the wait (the prefetch reads nothing).
// fp32 math, silu(g) = g / (1 + exp(-g)) as in production (--use_fast_math applies to both).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

namespace fx4 {

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

constexpr int kThreads = 256;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) silu_mul(T* __restrict__ out, const T* __restrict__ in, uint32_t hidden,
                                                     uint32_t vecs_per_row, uint32_t total) {
  const uint32_t i = blockIdx.x * kThreads + threadIdx.x;
  const bool live = i < total;
  const uint32_t row = live ? i / vecs_per_row : 0;
  const uint32_t col = (i - row * vecs_per_row) * V;
  const T* g = in + static_cast<uint64_t>(row) * 2u * hidden + col;
  const T* u = g + hidden;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (live) {
    prefetch_l2(g);
    prefetch_l2(u);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (!live) return;
  const Pack<T, V> gv = *reinterpret_cast<const Pack<T, V>*>(g);
  const Pack<T, V> uv = *reinterpret_cast<const Pack<T, V>*>(u);
  Pack<T, V> ov;
#pragma unroll
  for (int k = 0; k < V; ++k) ov.v[k] = from_f<T>(silu(to_f(gv.v[k])) * to_f(uv.v[k]));
  *reinterpret_cast<Pack<T, V>*>(out + static_cast<uint64_t>(row) * hidden + col) = ov;
}

template <typename T, int V>
cudaError_t launch(void* out, const void* in, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  const uint64_t vecs = static_cast<uint64_t>(hidden) / V;
  const uint64_t total = static_cast<uint64_t>(tokens) * vecs;
  if (total > 0xffffff00ull || hidden > 0x7fffffffll) return cudaErrorInvalidValue;  // 32-bit thread index
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<uint32_t>((total + kThreads - 1) / kThreads));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, silu_mul<T, V>, static_cast<T*>(out), static_cast<const T*>(in),
                            static_cast<uint32_t>(hidden), static_cast<uint32_t>(vecs), static_cast<uint32_t>(total));
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

}  // namespace fx4

extern "C" cudaError_t astra_silu_and_mul(void* out, const void* input, int64_t num_tokens, int64_t hidden, int dtype,
                                          cudaStream_t stream) {
  switch (dtype) {
    case 0: return fx4::run<float>(out, input, num_tokens, hidden, stream);
    case 1: return fx4::run<__half>(out, input, num_tokens, hidden, stream);
    case 2: return fx4::run<__nv_bfloat16>(out, input, num_tokens, hidden, stream);
    default: return cudaErrorInvalidValue;
  }
}
