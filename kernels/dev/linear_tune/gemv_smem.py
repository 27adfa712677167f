# Sandbox runner for gemv_smem.cu (round 4: CTA-wide cp.async staging; results/2026-11-27-h200/linear-mma/tuning/):
# correctness (max abs err vs fp32) and time vs cuBLAS, L2-cold.
#   python3 kernels/dev/linear_tune/gemv_smem.py 1x4096x2048,8x4096x2048,8x2048x5120,16x4096x6144
import ctypes, os, subprocess, sys
import torch
from sandbox_timing import rotating_problem, timed
here = os.path.dirname(os.path.abspath(__file__))
so = "/tmp/gemv_smem.so"
if not os.path.exists(so):
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", so,
                    f"{here}/gemv_smem.cu"], check=True)
lib = ctypes.CDLL(so)
shapes_arg = sys.argv[1]

cfgs = [(4, 256, 4), (4, 256, 8), (4, 512, 4), (4, 512, 6), (8, 512, 4), (8, 512, 6), (8, 1024, 3), (8, 1024, 4)]
for s in shapes_arg.split(","):
    T, K, N = map(int, s.split("x"))
    nrot, ws, x, outs, ref, t_cub = rotating_problem(T, K, N)
    res = []
    for wp, kc, st in cfgs:
        def f(i, wp=wp, kc=kc, st=st):
            return lib.tune_smem(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()),
                                 ctypes.c_void_p(outs[i].data_ptr()), T, K, N, wp, kc, st,
                                 ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        outs[0].zero_()
        if f(0) != 0:
            continue
        torch.cuda.synchronize()
        err = (outs[0].float() - ref).abs().max().item()
        res.append((timed(f, nrot), f"{wp}w{kc}k{st}s", err))
    best = min(res)
    print(f"{s:>14} cuBLAS {t_cub:6.2f} us  best {best[1]} {best[0]:6.2f} us err {best[2]:.3f}  x{t_cub / best[0]:.2f}  |  "
          + " ".join(f"{n}:{t:.2f}" for t, n, _ in res), flush=True)
    ws.clear(); outs.clear()
