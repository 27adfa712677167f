# Host cost per UnquantizedLinearMethod.apply call, unpatched vs with astra's linear patch, on a GPU machine with
# SGLang importable: a prefill call (declined by the adapter) and a 1-token call (astra's kernel, eager). Small
# weights, so the host is the bottleneck. results/2026-11-26-h200/linear/host-overhead*.txt
import tempfile, time, types
import torch
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from astra_sglang.patch import apply_astra_kernels, revert_astra_kernels

m = UnquantizedLinearMethod()
layer = types.SimpleNamespace(weight=torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16), quant_method=m)
xs = {"prefill 256 tok": torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16),
      "decode 1 tok": torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)}

def host_us(x, n=3000):
    for _ in range(200): m.apply(layer, x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): m.apply(layer, x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6

res = {}
for k, x in xs.items(): res[k] = [host_us(x)]
apply_astra_kernels(["linear"], self_check="off", counter_dir=tempfile.mkdtemp(), propagate=False)
for k, x in xs.items(): res[k].append(host_us(x))
revert_astra_kernels()
for k, (a, b) in res.items(): print(f"host µs per apply, {k}: unpatched {a:.2f}  patched {b:.2f}  (+{b - a:.2f})")
