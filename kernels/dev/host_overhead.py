# Host cost per eager call of SGLang's norm / activation callables, unpatched vs patched (astra's kernel launched
# through the patch's Python wrapper), on a GPU machine with SGLang importable. Small tensors, so the host is the
# bottleneck: what a host-bound prefill or eager decode pays per patched call. linear: linear_tune/host_overhead.py.
#   python3 kernels/dev/host_overhead.py [tokens ...]        (default 8 and 2048 tokens, hidden 4096, bf16)
import sys, tempfile, time
import torch
import sgl_kernel
from astra_sglang.patch import apply_astra_kernels, revert_astra_kernels

H, dt = 4096, torch.bfloat16
tokens = [int(t) for t in sys.argv[1:]] or [8, 2048]


def calls(t):
    x, r = (torch.randn(t, H, device="cuda", dtype=dt) for _ in range(2))
    w = torch.ones(H, device="cuda", dtype=dt)
    g, o = torch.randn(t, 2 * H, device="cuda", dtype=dt), torch.empty(t, H, device="cuda", dtype=dt)
    # module attributes looked up per call: the patch rebinds them
    return {"rmsnorm": lambda: sgl_kernel.rmsnorm(x, w, 1e-6),
            "fused_add_rmsnorm": lambda: sgl_kernel.fused_add_rmsnorm(x, r, w, 1e-6),
            "silu_and_mul": lambda: sgl_kernel.silu_and_mul(g, o)}


def host_us(f, n=3000):
    for _ in range(200): f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


res = {(op, t): [host_us(f)] for t in tokens for op, f in calls(t).items()}
pat = apply_astra_kernels(["rmsnorm", "fused_add_rmsnorm", "silu_and_mul"], self_check="off",
                          counter_dir=tempfile.mkdtemp(), propagate=False)
for t in tokens:
    for op, f in calls(t).items():
        res[(op, t)].append(host_us(f))
        # the split: the patch's Python alone (the backend's launch a no-op), then the launch alone (ctypes + CUDA)
        be, seen = pat.states[op].backend, {}
        real = be.launch
        be.launch = lambda *a: seen.setdefault("args", a)
        res[(op, t)].append(host_us(f))
        del be.launch
        res[(op, t)].append(host_us(lambda: real(*seen["args"])))
revert_astra_kernels()
for (op, t), (a, b, py, launch) in res.items():
    print(f"host µs per call, {op:18s} {t:5d} x {H}: unpatched {a:6.2f}  patched {b:6.2f}  (+{b - a:.2f}; "
          f"patch Python {py:.2f} + launch {launch:.2f})")
