# The patch's own Python per eager call, on the CPU, no GPU or SGLang needed: SGLang's callable replaced by
# make_replacement around a stand-in with sgl_kernel 0.4.5's signature, the kernel launch a no-op. What
# kernels/dev/host_overhead.py calls "patch Python" on a GPU host, here for any change to patch/ to be timed.
#   python3 kernels/dev/wrapper_overhead.py [--self-check first|off] [--repo DIR]   (DIR: another checkout to compare)
import argparse, sys, tempfile, time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--self-check", default="first", choices=("first", "off"))
ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]))
a = ap.parse_args()
sys.path.insert(0, a.repo)
import torch  # noqa: E402
from astra_sglang.patch.adapters import Binder  # noqa: E402
from astra_sglang.patch.apply import make_replacement  # noqa: E402
from astra_sglang.patch.counters import CounterFile  # noqa: E402
from astra_sglang.patch.ops import OpState, TorchBackend  # noqa: E402
from astra_sglang.registry import get_op, op_part  # noqa: E402


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None): ...
def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None): ...
def silu_and_mul(input, out=None, enable_pdl=None): ...


H, dt = 4096, torch.bfloat16
x, r, g = torch.randn(8, H, dtype=dt), torch.randn(8, H, dtype=dt), torch.randn(8, 2 * H, dtype=dt)
w, o = torch.ones(H, dtype=dt), torch.empty(8, H, dtype=dt)
calls = {"rmsnorm": (rmsnorm, lambda f: f(x, w, 1e-6)), "fused_add_rmsnorm": (fused_add_rmsnorm, lambda f: f(x, r, w, 1e-6)),
         "silu_and_mul": (silu_and_mul, lambda f: f(g, o))}
root = tempfile.mkdtemp()
for op, (orig, call) in calls.items():
    spec, ad = get_op(op), op_part(op, "adapter").ADAPTER
    st = OpState(spec, ad, TorchBackend("no-op", lambda v, d, s: None), CounterFile(Path(root) / op, [op]),
                 self_check=a.self_check)
    st.checked.add(st.shape_class((8, H), "bf16"))   # --self-check first: this class has passed already
    repl = make_replacement(st, Binder(orig, ad, spec), orig, "stand-in:" + op)
    for _ in range(2000):
        call(repl)
    best = 1e9
    for _ in range(7):
        n, t0 = 20000, time.perf_counter()
        for _ in range(n):
            call(repl)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    print(f"patch Python per eager call, {op:18s} 8 x {H}: {best:5.2f} µs (best of 7 x 20000, --self-check {a.self_check})")
