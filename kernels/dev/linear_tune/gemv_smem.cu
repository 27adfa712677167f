// Sandbox, round 4 (results/2026-11-27-h200/linear-mma/tuning/round4-*: 0.41-0.73x cuBLAS): decode GEMV for 1..16
// tokens on tensor cores with the weights staged through shared memory by cp.async (coalesced 16-byte copies, a
// STAGES-deep pipeline), bf16.
// mma.m16n8k16: A = x (tokens as M, rows >= T zero), B = 8 weight rows as N ("col": a weight row is contiguous in k),
// C = [16 tokens][8 rows]. CTA = WARPS warps owning 8 output rows; a stage is 8 rows x KC k; warp w computes the k
// range [w * KC / WARPS, (w + 1) * KC / WARPS) of every stage; partial C summed over warps in shared memory.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace {
__device__ __forceinline__ void cp16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill (rows / k beyond the end)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t ldx(const __nv_bfloat16* x, int t, int T, int k, int K) {
  // two consecutive bf16 of token t at k (k even, K a multiple of 8): 0 outside
  return (t < T && k < K) ? __ldg(reinterpret_cast<const uint32_t*>(x + static_cast<int64_t>(t) * K + k)) : 0u;
}

// KC: k per stage (a multiple of 16 * WARPS); row stride in shared memory padded by 16 bytes (8 bf16) so the 8
// rows' words fall in different banks for the fragment loads
template <int WARPS, int KC, int STAGES, bool TOK16>
__global__ void __launch_bounds__(WARPS * 32) gemv_smem(const __nv_bfloat16* __restrict__ x,
                                                        const __nv_bfloat16* __restrict__ w,
                                                        __nv_bfloat16* __restrict__ out, int T, int K, int N) {
  constexpr int kStride = KC + 8;          // bf16 per padded row
  constexpr int kVecPerRow = KC / 8;       // 16-byte copies per row per stage
  constexpr int kThreads = WARPS * 32;
  constexpr int kKPerWarp = KC / WARPS;    // k of a stage each warp computes
  static_assert(kKPerWarp % 16 == 0, "a warp's k range is whole mma steps");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* ws = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [STAGES][8][kStride]
  __shared__ float red[WARPS][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * 8;
  const int nstages = (K + KC - 1) / KC;

  auto issue = [&](int st) {  // stage st's 8 rows x KC k into buffer st % STAGES
    __nv_bfloat16* dst = ws + (st % STAGES) * 8 * kStride;
    for (int i = threadIdx.x; i < 8 * kVecPerRow; i += kThreads) {
      const int r = i / kVecPerRow, v = i % kVecPerRow;
      const int k = st * KC + v * 8;
      const int row = min(n0 + r, N - 1);
      cp16(dst + r * kStride + v * 8, w + static_cast<int64_t>(row) * K + min(k, K - 8), k < K);
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nstages) issue(s);
    cp_commit();
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // x is the previous kernel's; the weights were not
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int st = 0; st < nstages; ++st) {
    cp_wait<STAGES - 2>();
    __syncthreads();  // stage st landed for every thread; buffer (st - 1) % STAGES is free
    if (st + STAGES - 1 < nstages) issue(st + STAGES - 1);
    cp_commit();
    const __nv_bfloat16* b = ws + (st % STAGES) * 8 * kStride + g * kStride;  // weight row g of this stage
#pragma unroll
    for (int kk = 0; kk < kKPerWarp; kk += 16) {
      const int kl = warp * kKPerWarp + kk;  // k within the stage
      const int kg = st * KC + kl;           // k in the row
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(b + kl + 2 * q);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(b + kl + 2 * q + 8);
      const uint32_t a0 = ldx(x, g, T, kg + 2 * q, K), a2 = ldx(x, g, T, kg + 2 * q + 8, K);
      const uint32_t a1 = TOK16 ? ldx(x, g + 8, T, kg + 2 * q, K) : 0u;
      const uint32_t a3 = TOK16 ? ldx(x, g + 8, T, kg + 2 * q + 8, K) : 0u;
      mma(c, a0, a1, a2, a3, b0, b1);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][lane][i] = c[i];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int l = threadIdx.x >> 2, i = threadIdx.x & 3;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < WARPS; ++p) s += red[p][l][i];
    const int tok = (l >> 2) + (i >= 2 ? 8 : 0), n = n0 + (l & 3) * 2 + (i & 1);
    if (tok < T && n < N) out[static_cast<int64_t>(tok) * N + n] = __float2bfloat16_rn(s);
  }
}

template <int WARPS, int KC, int STAGES>
cudaError_t go(const void* x, const void* w, void* o, int T, int K, int N, cudaStream_t s) {
  const size_t smem = size_t(STAGES) * 8 * (KC + 8) * 2;
  auto kern = T > 8 ? gemv_smem<WARPS, KC, STAGES, true> : gemv_smem<WARPS, KC, STAGES, false>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kern<<<(N + 7) / 8, WARPS * 32, smem, s>>>((const __nv_bfloat16*)x, (const __nv_bfloat16*)w, (__nv_bfloat16*)o,
                                             T, K, N);
  return cudaGetLastError();
}
}  // namespace

// cfg: WARPS x KC x STAGES, one of the instantiated ones
extern "C" cudaError_t tune_smem(const void* x, const void* w, void* o, int T, int K, int N, int warps, int kc,
                                 int stages, cudaStream_t s) {
  if (T < 1 || T > 16 || K % 8) return cudaErrorInvalidValue;
#define C(W, KC_, S) if (warps == W && kc == KC_ && stages == S) return go<W, KC_, S>(x, w, o, T, K, N, s);
  C(4, 256, 4) C(4, 256, 8) C(4, 512, 4) C(4, 512, 6) C(8, 512, 4) C(8, 512, 6) C(8, 1024, 3) C(8, 1024, 4)
#undef C
  return cudaErrorInvalidValue;
}
