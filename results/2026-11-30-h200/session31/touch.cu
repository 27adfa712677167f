// The bytes moe_experts moves at a call, read and nothing else (the sweep's floor, thirty-first session): one
// persistent launch reads, for every routed (token, expert) slot, its expert's w13 and w2 (what the op streams where
// tokens do not share experts), 4 vectors a thread in flight, and writes one xor per CTA into act so the loads stay.
// Same ABI as kernels/moe_experts/kernel.cu (astra_moe_experts), so the sweep times it as one more variant.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void __launch_bounds__(256) touch_kernel(const uint4* __restrict__ w13, const uint4* __restrict__ w2,
                                                    const int* __restrict__ ids, unsigned* act, int64_t n13,
                                                    int64_t n2, int64_t total, int num_experts) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int64_t per = n13 + n2, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  for (int64_t g0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g0 < total; g0 += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t g = g0 + i * stride;
      v[i] = make_uint4(0, 0, 0, 0);
      if (g < total) {
        const int64_t s = g / per, r = g - s * per;
        const int e = ids[s];
        if (e >= 0 && e < num_experts) {
          const uint4* p = r < n13 ? w13 + e * n13 + r : w2 + e * n2 + (r - n13);
          asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                       : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w) : "l"(p));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x9e3779b9u) act[blockIdx.x] = acc;  // never in practice; keeps the loads
}

extern "C" cudaError_t astra_moe_experts(const void* x, const void* w13, const void* w2, const void* topk_weights,
                                         const void* topk_ids, void* act, void* out, int64_t num_tokens,
                                         int64_t hidden, int64_t inter, int64_t num_experts, int64_t topk,
                                         double routed_scaling_factor, int dtype, cudaStream_t stream) {
  (void)x; (void)topk_weights; (void)out; (void)routed_scaling_factor; (void)dtype;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t n13 = 2 * inter * hidden / 8, n2 = hidden * inter / 8, total = num_tokens * topk * (n13 + n2);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(sms * 4));
  cfg.blockDim = dim3(256);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, touch_kernel, static_cast<const uint4*>(w13), static_cast<const uint4*>(w2),
                            static_cast<const int*>(topk_ids), static_cast<unsigned*>(act), n13, n2, total,
                            static_cast<int>(num_experts));
}
