// astra-sglang optimized kv_store: k_cache[indices[t]] = k[t, :k_row]; v_cache[indices[t]] = v[t, :v_row]
// for every token t whose slot is not reserved_skip_index (SGLang's CUDA-graph padding slot).
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_kv_store(const void* k, const void* v, void* k_cache, void* v_cache,
//         const void* indices, int64_t num_tokens, int64_t k_row, int64_t v_row, int64_t k_stride,
//         int64_t v_stride, int64_t size_limit, int64_t reserved_skip_index, int dtype, cudaStream_t stream)
// indices: int64. Rows in elements of dtype (1 fp16, 2 bf16, 0 fp32; the copy is bit-exact for any).
// Launches on `stream` only; no allocation, no host sync; capturable.
//
// Design:
//  * A flat grid of 256-thread blocks over every 16-byte vector of every token's K and V rows (K and V need not
//    be the same width); no per-row warp split to tune, and a decode batch is one or a few blocks.
//  * The token's K/V vector and its slot index loaded in the same batch, one round trip before the store instead of
//    index-then-data (production's order): the vector's load is a volatile asm (ASTRA_KV_LOAD_FIRST below), since as
//    plain C++ nvcc sinks it below the skip check.
//  * Programmatic dependent launch on sm_90+: all reads behind griddepcontrol.wait (k/v come from the kernels
//    just before, the slots from the batch set-up); dependents are released right after the wait.
//  * An index outside [0, size_limit) traps, as SGLang's device assert does, instead of writing out of bounds.
#include <cuda_runtime.h>
#include <stdint.h>

// Dev knobs (kernels/dev/bench_variants.sh): ASTRA_TRIG_END 1 releases dependents after the stores, where production
// does, instead of right after griddepcontrol.wait; ASTRA_PDL 0 launches plainly (no programmatic dependent launch).
#ifndef ASTRA_TRIG_END
#define ASTRA_TRIG_END 0
#endif
#ifndef ASTRA_THREADS
#define ASTRA_THREADS 256  // dev knob: threads per block (a smaller block spreads a decode batch over more SMs)
#endif
#ifndef ASTRA_PDL
#define ASTRA_PDL 1
#endif
// 1 issues the K/V vector's load as a volatile asm, so it leaves with the slot's load. As plain C++ (0) nvcc sinks it
// below the `slot == skip` return: the PTX loads the slot, branches, then loads the vector, two round trips in a row.
// 1 read faster in both orders on six decode rows in context, 0.926x / 0.931x -> 0.941x / 0.964x over production,
// chained 1.336x -> 1.373x (H200, 2026-11-29, results/2026-11-29-h200/session21/kv-store-load-first/).
#ifndef ASTRA_KV_LOAD_FIRST
#define ASTRA_KV_LOAD_FIRST 1
#endif

namespace astra_kv_k {
// internal linkage: no GNU-unique statics shared with another loaded build of this file
namespace {

constexpr int kThreads = ASTRA_THREADS;

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <int BYTES> struct Raw;
template <> struct Raw<16> { using type = uint4; };
template <> struct Raw<8> { using type = uint2; };
template <> struct Raw<4> { using type = unsigned int; };
template <> struct Raw<2> { using type = unsigned short; };

// A read-only load the compiler may not move past a branch (asm volatile): ASTRA_KV_LOAD_FIRST.
__device__ __forceinline__ void load_pinned(uint4& x, const char* p) {
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "l"(p));
}
__device__ __forceinline__ void load_pinned(uint2& x, const char* p) {
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(x.x), "=r"(x.y) : "l"(p));
}
__device__ __forceinline__ void load_pinned(unsigned int& x, const char* p) {
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(x) : "l"(p));
}
__device__ __forceinline__ void load_pinned(unsigned short& x, const char* p) {
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(x) : "l"(p));
}

// B: bytes per access. nk / nv: accesses per K / V row. Strides in bytes.
template <int B>
__global__ void __launch_bounds__(kThreads) kv_store_kernel(const char* __restrict__ k, const char* __restrict__ v,
                                                            char* __restrict__ kc, char* __restrict__ vc,
                                                            const int64_t* __restrict__ indices, uint32_t total,
                                                            uint32_t nk, uint32_t nv, int64_t ks, int64_t vs,
                                                            int64_t kcs, int64_t vcs, int64_t limit, int64_t skip) {
  using R = typename Raw<B>::type;
  const uint32_t gid = blockIdx.x * kThreads + threadIdx.x;
  pdl_wait();
  if (!ASTRA_TRIG_END) pdl_trigger();
  if (gid >= total) return;
  const uint32_t per = nk + nv;
  const uint32_t t = gid / per;
  const uint32_t j = gid - t * per;
  const bool is_k = j < nk;
  const uint32_t col = is_k ? j : j - nk;
  const char* src = (is_k ? k + static_cast<int64_t>(t) * ks : v + static_cast<int64_t>(t) * vs) +
                    static_cast<int64_t>(col) * B;
  const int64_t slot = indices[t];
  R x;
  if (ASTRA_KV_LOAD_FIRST) load_pinned(x, src);
  else x = *reinterpret_cast<const R*>(src);
  if (slot == skip) return;
  if (slot < 0 || (limit > 0 && slot >= limit)) __trap();
  char* dst = (is_k ? kc + slot * kcs : vc + slot * vcs) + static_cast<int64_t>(col) * B;
  *reinterpret_cast<R*>(dst) = x;
  if (ASTRA_TRIG_END) pdl_trigger();
}

template <int B>
cudaError_t launch(const void* k, const void* v, void* kc, void* vc, const void* idx, uint32_t total, uint32_t nk,
                   uint32_t nv, int64_t ks, int64_t vs, int64_t kcs, int64_t vcs, int64_t limit, int64_t skip,
                   cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((total + kThreads - 1) / kThreads);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ASTRA_PDL ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kv_store_kernel<B>, static_cast<const char*>(k), static_cast<const char*>(v),
                            static_cast<char*>(kc), static_cast<char*>(vc), static_cast<const int64_t*>(idx), total,
                            nk, nv, ks, vs, kcs, vcs, limit, skip);
}

}  // namespace
}  // namespace astra_kv_k

extern "C" cudaError_t astra_kv_store(const void* k, const void* v, void* k_cache, void* v_cache, const void* indices,
                                      int64_t num_tokens, int64_t k_row, int64_t v_row, int64_t k_stride,
                                      int64_t v_stride, int64_t size_limit, int64_t reserved_skip_index, int dtype,
                                      cudaStream_t stream) {
  using namespace astra_kv_k;
  const int64_t es = dtype == 0 ? 4 : (dtype == 1 || dtype == 2) ? 2 : 0;
  if (es == 0 || num_tokens < 0 || k_row <= 0 || v_row <= 0 || k_stride < k_row || v_stride < v_row)
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int64_t kb = k_row * es, vb = v_row * es;                  // row bytes
  const int64_t ks = k_stride * es, vs = v_stride * es;            // token strides (bytes)
  // widest access every pointer, stride and row width allows (the cache rows are kb / vb apart)
  const uint64_t bits = reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
                        reinterpret_cast<uintptr_t>(k_cache) | reinterpret_cast<uintptr_t>(v_cache) |
                        static_cast<uint64_t>(kb | vb | ks | vs);
  const int b = bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : 2;
  const uint64_t nk = kb / b, nv = vb / b;
  const uint64_t total = static_cast<uint64_t>(num_tokens) * (nk + nv);
  if (total > 0xffffffffull - kThreads) return cudaErrorInvalidValue;
  const uint32_t T = static_cast<uint32_t>(total), NK = static_cast<uint32_t>(nk), NV = static_cast<uint32_t>(nv);
  switch (b) {
    case 16: return launch<16>(k, v, k_cache, v_cache, indices, T, NK, NV, ks, vs, kb, vb, size_limit,
                               reserved_skip_index, stream);
    case 8: return launch<8>(k, v, k_cache, v_cache, indices, T, NK, NV, ks, vs, kb, vb, size_limit,
                             reserved_skip_index, stream);
    case 4: return launch<4>(k, v, k_cache, v_cache, indices, T, NK, NV, ks, vs, kb, vb, size_limit,
                             reserved_skip_index, stream);
    default: return launch<2>(k, v, k_cache, v_cache, indices, T, NK, NV, ks, vs, kb, vb, size_limit,
                              reserved_skip_index, stream);
  }
}
