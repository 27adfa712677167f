// astra-sglang moe_gate: the MoE router's logits GEMM at decode sizes (Qwen3-MoE's `self.gate`, a ReplicatedLinear
// SGLang runs as F.linear -> cuBLAS):
//   out[t, e] = T( sum_h float(x[t, h]) * float(weight[e, h]) )      fp32 accumulation, one rounding to T
//
// Self-contained: CUDA toolkit headers only, builds with `nvcc` alone and is loaded through ctypes.
// ABI:  extern "C" cudaError_t astra_moe_gate(const void* x, const void* weight, void* out, int64_t num_tokens,
//           int64_t hidden, int64_t num_experts, int dtype, cudaStream_t stream)
// x [tokens, hidden], weight [experts, hidden], out [tokens, experts], all contiguous, dtype 1 fp16, 2 bf16;
// hidden <= 8192. Launches on `stream` only; no allocation, no host sync.
//
// Why: cuBLAS tiles a [1, 2048] x [2048, 128] product into a handful of CTAs (64 outputs each) that each stream
// 256 KB of weights, 5-9 us per layer on Hopper for 0.5 MB of weights. Here:
//  * Each expert row is split over kSplit = 4 warps, 2 rows per CTA: E = 128 gives 64 CTAs of 8 warps whose weight
//    loads are all in flight at once, and each warp's share of the per-token work is a quarter of a row.
//  * The weight slices are loaded into registers BEFORE griddepcontrol.wait (weights are parameters, never written
//    by the kernels before us), so under programmatic dependent launch their DRAM latency hides behind the
//    previous kernel (the post-attention norm). Only x waits.
//  * Each CTA takes up to kTokGroup tokens (grid y covers the rest, so 32 tokens use 4x the SMs). Its x rows are
//    staged in shared memory with cp.async, all copies in flight at once (one L2 round trip per 64 KB chunk).
//    Tokens are taken kTokGroup at a time with one fp32 accumulator each, the weight vector unpacked once per
//    group; warp butterflies, then the kSplit partial sums per (expert, token) through shared memory.
//  * 2..64 tokens with hidden a multiple of 256 (at most 4096): tensor cores instead (moe_gate_mma_kernel below),
//    8 to 64 tokens in about the time of one; the CUDA-core path above serves 1 token and the other widths.
//  * hidden not a multiple of 8 or unaligned pointers: a scalar path (same math, no prefetch; correctness only).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

#ifndef ASTRA_PDL
#define ASTRA_PDL 1  // 0: plain launch; 1: PDL, weights loaded before the wait, trigger right after it
#endif

namespace astra_moeg {
namespace {

constexpr int kSplit = 4;            // warps per expert row
constexpr int kExpertsPerCta = 2;
constexpr int kThreads = kSplit * kExpertsPerCta * 32;
constexpr int kTokGroup = 8;         // tokens per pass over the weight registers (one accumulator each)
constexpr int kScalarWarps = 4;      // the scalar path: one warp per expert row
constexpr int kSmemBytes = 64 << 10;  // x chunk staging (dynamic shared memory)
constexpr int kMaxHidden = 8192;
constexpr unsigned kFull = 0xffffffffu;

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

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 8 elements of T packed in a uint4 -> 8 floats
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f(e[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// 16 bytes global -> shared without a register round trip: every copy of a chunk in flight at once (a plain
// load/store loop waits out one L2 round trip per iteration).
__device__ __forceinline__ void copy16_async(void* dst_smem, const void* src) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst_smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
#else
  *static_cast<uint4*>(dst_smem) = *static_cast<const uint4*>(src);
#endif
}

__device__ __forceinline__ void copies_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Vector path: an expert row is split over kSplit warps (vector v of the row goes to warp v / 32 % kSplit), each
// lane holding NV 16-byte weight vectors (hidden / 8 <= 32 * kSplit * NV). Tokens go in groups of kTokGroup with one
// fp32 accumulator each: the weight vector is unpacked once per group and the FMA chains are independent (one warp
// per scheduler here: a single chain per warp exposes every FMA's latency, ~1 us per token at hidden 2048).
template <typename T, int NV>
__global__ void __launch_bounds__(kThreads) moe_gate_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                            T* __restrict__ out, int tokens, int hidden,
                                                            int experts, int chunk, int tok_per_cta) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint4* xs = reinterpret_cast<uint4*>(smem_raw);
  __shared__ float part[kExpertsPerCta][kSplit][kTokGroup];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = warp / kSplit, piece = warp % kSplit;
  const int e = blockIdx.x * kExpertsPerCta + slot;
  const bool live = e < experts;
  const int nvec = hidden >> 3;  // 16-byte vectors per row

  // The weight slice into registers: independent of the previous kernel, so before the wait.
  uint4 wv[NV];
  const uint4* wrow = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(live ? e : 0) * nvec;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = (i * kSplit + piece) * 32 + lane;
    wv[i] = (live && v < nvec) ? __ldg(wrow + v) : make_uint4(0, 0, 0, 0);
  }
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  const uint4* xg = reinterpret_cast<const uint4*>(x);
  // this CTA's tokens: blockIdx.y picks a range, so many tokens spread over more SMs (weights re-read from L2)
  const int t_begin = blockIdx.y * tok_per_cta, t_end = min(tokens, t_begin + tok_per_cta);
  for (int t0 = t_begin; t0 < t_end; t0 += chunk) {
    const int nt = min(chunk, t_end - t0);
    __syncthreads();  // the previous chunk's readers are done
    const int total = nt * nvec;
    const uint4* src = xg + static_cast<int64_t>(t0) * nvec;
    for (int i = threadIdx.x; i < total; i += kThreads) copy16_async(xs + i, src + i);
    copies_wait();
    __syncthreads();
    for (int g = 0; g < nt; g += kTokGroup) {  // uniform over the CTA: every warp reaches the barriers
      float acc[kTokGroup];
#pragma unroll
      for (int k = 0; k < kTokGroup; ++k) acc[k] = 0.f;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = (i * kSplit + piece) * 32 + lane;
        if (v < nvec) {
          float b[8];
          unpack8<T>(wv[i], b);
#pragma unroll
          for (int k = 0; k < kTokGroup; ++k) {
            if (g + k < nt) {
              float a[8];
              unpack8<T>(xs[(g + k) * nvec + v], a);
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[k] = fmaf(a[j], b[j], acc[k]);
            }
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kTokGroup; ++k) acc[k] = warp_sum(acc[k]);
      if (lane == 0) {
#pragma unroll
        for (int k = 0; k < kTokGroup; ++k) part[slot][piece][k] = acc[k];
      }
      __syncthreads();
      if (piece == 0 && lane < kTokGroup && g + lane < nt && live) {
        float s = 0.f;
#pragma unroll
        for (int p = 0; p < kSplit; ++p) s += part[slot][p][lane];
        out[static_cast<int64_t>(t0 + g + lane) * experts + e] = from_f<T>(s);
      }
      __syncthreads();  // part[] is reused by the next group
    }
  }
}

// Tensor-core path (2..64 tokens, hidden a multiple of 256, at most 4096): mma.sync m16n8k16, A = 16 expert rows x 16
// k, B = 16 k x 8 tokens, fp32 accumulators. A CTA owns one 16-row expert tile and 8 tokens (grid y: the token
// tiles); its 8 warps split hidden in 32-wide chunks (warp w: chunks w, w + 8, ...). The k order inside an mma is
// free as long as A and B agree, so each lane loads 16 contiguous bytes per row and per token and uses them as its
// k slots of two consecutive mmas: lane (g = lane / 4, q = lane % 4) loads k = chunk + 8q .. 8q + 7 of expert rows
// g and g + 8 (A) and of token g (B); mma 0 takes words 0-1, mma 1 words 2-3 (words 0 / 1 fill the fragment's
// k slots 2q, 2q + 1 / 2q + 8, 2q + 9, for A and B alike). The weight fragments are loaded before the PDL wait.
// Partial tiles of the 8 warps are summed through shared memory.
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaRows = 16;   // experts per CTA (the mma's M)
constexpr int kMmaToks = 8;    // tokens per CTA (the mma's N)
constexpr int kMmaMaxTokens = 64;

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#endif
}

template <typename T, int NC>  // NC: 32-wide chunks per warp (hidden / 256 of them, at most NC)
__global__ void __launch_bounds__(kMmaThreads) moe_gate_mma_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                    T* __restrict__ out, int tokens, int hidden,
                                                                    int experts) {
  __shared__ float part[kMmaWarps][kMmaRows][kMmaToks];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int e0 = blockIdx.x * kMmaRows, t0 = blockIdx.y * kMmaToks;
  const int nchunks = hidden / (32 * kMmaWarps);  // per warp
  const int r_lo = e0 + g, r_hi = e0 + g + 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // weight fragments, before the wait
  uint4 wlo[NC], whi[NC];
#pragma unroll
  for (int i = 0; i < NC; ++i) {
    const int k = ((i * kMmaWarps + warp) * 32) + 8 * q;
    const bool in = i < nchunks;
    wlo[i] = (in && r_lo < experts) ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r_lo) * hidden + k))
                                    : zero;
    whi[i] = (in && r_hi < experts) ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r_hi) * hidden + k))
                                    : zero;
  }
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  const int t = t0 + g;  // this lane's token of the B fragment
  uint4 xv[NC];
#pragma unroll
  for (int i = 0; i < NC; ++i) {
    const int k = ((i * kMmaWarps + warp) * 32) + 8 * q;
    xv[i] = (i < nchunks && t < tokens) ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * hidden + k)
                                        : zero;
  }
  float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};  // two chains: words 0-1 and 2-3
#pragma unroll
  for (int i = 0; i < NC; ++i) {
    if (i < nchunks) {
      mma16816<T>(c0, wlo[i].x, whi[i].x, wlo[i].y, whi[i].y, xv[i].x, xv[i].y);
      mma16816<T>(c1, wlo[i].z, whi[i].z, wlo[i].w, whi[i].w, xv[i].z, xv[i].w);
    }
  }
  // C fragment: c[0], c[1] = (row g, tokens 2q, 2q + 1); c[2], c[3] = (row g + 8, the same tokens)
  part[warp][g][2 * q] = c0[0] + c1[0];
  part[warp][g][2 * q + 1] = c0[1] + c1[1];
  part[warp][g + 8][2 * q] = c0[2] + c1[2];
  part[warp][g + 8][2 * q + 1] = c0[3] + c1[3];
  __syncthreads();
  if (threadIdx.x < kMmaRows * kMmaToks) {
    const int r = threadIdx.x / kMmaToks, n = threadIdx.x % kMmaToks;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < kMmaWarps; ++v) s += part[v][r][n];
    if (e0 + r < experts && t0 + n < tokens) out[static_cast<int64_t>(t0 + n) * experts + e0 + r] = from_f<T>(s);
  }
}

// Scalar path (hidden % 8 != 0 or unaligned pointers): one warp per expert, lanes stride the row.
template <typename T>
__global__ void __launch_bounds__(kScalarWarps * 32) moe_gate_scalar_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                   T* __restrict__ out, int tokens, int hidden,
                                                                   int experts) {
  const int lane = threadIdx.x & 31;
  const int e = blockIdx.x * kScalarWarps + (threadIdx.x >> 5);
  if (ASTRA_PDL) {
    pdl_wait();
    pdl_trigger();
  }
  if (e >= experts) return;
  const T* wrow = w + static_cast<int64_t>(e) * hidden;
  for (int t = 0; t < tokens; ++t) {
    const T* xrow = x + static_cast<int64_t>(t) * hidden;
    float acc = 0.f;
    for (int h = lane; h < hidden; h += 32) acc = fmaf(to_f(xrow[h]), to_f(wrow[h]), acc);
    acc = warp_sum(acc);
    if (lane == 0) out[static_cast<int64_t>(t) * experts + e] = from_f<T>(acc);
  }
}

int device_major() {
  static int cached_dev = -1, major = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev != cached_dev) {
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cached_dev = dev;
  }
  return major;
}

template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                   Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (ASTRA_PDL && device_major() >= 9) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

template <typename T, int NV>
cudaError_t launch_vec(const void* x, const void* w, void* out, int tokens, int hidden, int experts,
                       cudaStream_t stream) {
  // opt in above 48 KB of dynamic shared memory once per device (a function attribute of the current device)
  static uint64_t opted = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return cudaErrorInvalidDevice;
  if (dev < 64 && !(opted >> dev & 1)) {
    const cudaError_t err = cudaFuncSetAttribute(moe_gate_kernel<T, NV>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    opted |= uint64_t(1) << dev;
  }
  const int row_bytes = hidden * static_cast<int>(sizeof(T));
  const int tok_per_cta = min(tokens, kTokGroup);
  const int chunk = max(1, min(tok_per_cta, kSmemBytes / row_bytes));
  const size_t smem = static_cast<size_t>(chunk) * row_bytes;
  const dim3 grid((experts + kExpertsPerCta - 1) / kExpertsPerCta, (tokens + tok_per_cta - 1) / tok_per_cta);
  return launch(moe_gate_kernel<T, NV>, grid, kThreads, smem, stream, static_cast<const T*>(x),
                static_cast<const T*>(w), static_cast<T*>(out), tokens, hidden, experts, chunk, tok_per_cta);
}

template <typename T>
cudaError_t dispatch(const void* x, const void* w, void* out, int tokens, int hidden, int experts,
                     cudaStream_t stream) {
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  if (hidden % 8 != 0 || !aligned) {
    return launch(moe_gate_scalar_kernel<T>, dim3((experts + kScalarWarps - 1) / kScalarWarps), kScalarWarps * 32, 0,
                  stream, static_cast<const T*>(x),
                  static_cast<const T*>(w), static_cast<T*>(out), tokens, hidden, experts);
  }
  if (tokens >= 2 && tokens <= kMmaMaxTokens && hidden % (32 * kMmaWarps) == 0 && hidden <= 4096 &&
      device_major() >= 8) {
    const dim3 grid((experts + kMmaRows - 1) / kMmaRows, (tokens + kMmaToks - 1) / kMmaToks);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(w);
    T* ot = static_cast<T*>(out);
    if (hidden <= 2048) return launch(moe_gate_mma_kernel<T, 8>, grid, kMmaThreads, 0, stream, xt, wt, ot, tokens,
                                      hidden, experts);
    return launch(moe_gate_mma_kernel<T, 16>, grid, kMmaThreads, 0, stream, xt, wt, ot, tokens, hidden, experts);
  }
  const int nvec = hidden / 8, per = 32 * kSplit;  // vectors one register slot covers across the split
  if (nvec <= per * 1) return launch_vec<T, 1>(x, w, out, tokens, hidden, experts, stream);
  if (nvec <= per * 2) return launch_vec<T, 2>(x, w, out, tokens, hidden, experts, stream);
  if (nvec <= per * 4) return launch_vec<T, 4>(x, w, out, tokens, hidden, experts, stream);
  return launch_vec<T, 8>(x, w, out, tokens, hidden, experts, stream);
}

}  // namespace
}  // namespace astra_moeg

extern "C" cudaError_t astra_moe_gate(const void* x, const void* weight, void* out, int64_t num_tokens,
                                      int64_t hidden, int64_t num_experts, int dtype, cudaStream_t stream) {
  using namespace astra_moeg;
  if (num_tokens < 0 || hidden < 1 || hidden > kMaxHidden || num_experts < 1) return cudaErrorInvalidValue;
  if (num_tokens > (int64_t(1) << 30) || num_experts > (int64_t(1) << 20)) return cudaErrorInvalidValue;
  if ((num_tokens + kTokGroup - 1) / kTokGroup > 65535) return cudaErrorInvalidValue;  // grid y
  if (num_tokens == 0) return cudaSuccess;
  const int t = static_cast<int>(num_tokens), h = static_cast<int>(hidden), e = static_cast<int>(num_experts);
  switch (dtype) {
    case 1: return dispatch<__half>(x, weight, out, t, h, e, stream);
    case 2: return dispatch<__nv_bfloat16>(x, weight, out, t, h, e, stream);
    default: return cudaErrorInvalidValue;
  }
}
