# Sandbox runner for gemv_tx.cu's variants: max abs err vs fp32 and µs per call (L2-cold, CUDA graph) against cuBLAS
# and the shipped kernel (kernels/linear/kernel.cu), bf16. ROUND picks the variant set of that tuning round
# (results/2026-11-27-h200/linear-mma/tuning/round{5,6,7,8}-*):
#   ROUND=8 python3 kernels/dev/linear_tune/gemv_tx.py 4x4096x6144,8x4096x24576     (tokens x in x out)
import ctypes, os, subprocess, sys, json
import torch
from sandbox_timing import rotating_problem, timed

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(f"{here}/../../..")


def build(src, so):
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", so, src],
                   check=True)
    return ctypes.CDLL(so)


tx = build(f"{here}/gemv_tx.cu", "/tmp/gemv_tx.so")
shipped = build(f"{root}/kernels/linear/kernel.cu", "/tmp/astra_linear_shipped.so")
shipped.astra_linear.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_void_p]

# variant family -> (entry point, label of a configuration, max tokens)
FAMILIES = {
    "tx": ("tune_tx", "{}w{}r{}u", 16),     # register transpose: warps, 8-row tiles, chunks in flight
    "cpa": ("tune_cpa", "c{}w{}r{}s", 16),  # per-warp cp.async staging: warps, 8-row tiles, stages
    "ws": ("tune_ws", "s{}w{}k{}s", 8),     # whole-row warp streams: warps, warps per row group, stages
    "pf": ("tune_pf", "p{}w{}r", 8),        # register transpose with a one-deep prefetch: warps, 8-row tiles
}
TX9 = [(4, 1, 1), (4, 1, 2), (4, 2, 1), (8, 1, 1), (8, 1, 2), (8, 2, 1), (16, 1, 1), (2, 1, 2), (2, 2, 2)]
ROUNDS = {
    "5": {"tx": TX9},
    "6": {"tx": TX9, "cpa": [(4, 1, 2), (4, 1, 3), (4, 1, 4), (4, 2, 2), (4, 2, 3), (8, 1, 2), (8, 1, 3), (8, 2, 2),
                             (16, 1, 2), (2, 1, 4), (2, 2, 3)]},
    "7": {"tx": TX9[:6], "ws": [(4, 1, 4), (4, 1, 6), (4, 2, 4), (4, 2, 6), (8, 2, 4), (4, 4, 4), (8, 4, 3), (8, 4, 4),
                                (2, 1, 8), (8, 1, 3), (2, 2, 6), (4, 4, 6), (8, 8, 3)]},
    "8": {"tx": [(4, 1, 1), (4, 2, 1), (8, 1, 1), (8, 2, 1), (8, 1, 2)],
          "pf": [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)]},
}
variants = ROUNDS[os.environ.get("ROUND", "8")]
stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731
rows = []
for s in sys.argv[1].split(","):
    T, K, N = map(int, s.split("x"))
    nrot, ws, x, outs, ref, t_cub = rotating_problem(T, K, N)
    f_shipped = lambda i: shipped.astra_linear(x.data_ptr(), ws[i].data_ptr(), outs[i].data_ptr(), T, K, N, 2,  # noqa
                                               stream())
    outs[0].zero_(); f_shipped(0); torch.cuda.synchronize()
    e_shipped = (outs[0].float() - ref).abs().max().item()
    t_shipped = timed(f_shipped, nrot)
    res = []
    for fam, cfgs in variants.items():
        entry, label, max_t = FAMILIES[fam]
        if T > max_t:
            continue
        for cfg in cfgs:
            def f(i, cfg=cfg, entry=getattr(tx, entry)):
                return entry(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()),
                             ctypes.c_void_p(outs[i].data_ptr()), T, K, N, *cfg, stream())
            outs[0].zero_()
            rc = f(0)
            torch.cuda.synchronize()
            if rc != 0:  # a configuration the entry point does not instantiate, or a launch it refused
                continue
            err = (outs[0].float() - ref).abs().max().item()
            res.append((timed(f, nrot), label.format(*cfg), err))
    best = min(res)
    gb = N * K * 2 / 1e3
    rows.append({"shape": s, "cublas": t_cub, "fma": t_shipped, "fma_err": e_shipped,
                 "tx": {n: (t, e) for t, n, e in res}})
    print(f"{s:>14} cuBLAS {t_cub:6.2f}  fma {t_shipped:6.2f} (x{t_cub / t_shipped:.2f})  tx {best[1]} {best[0]:6.2f} "
          f"({gb / best[0]:4.0f} GB/s) err {best[2]:.3f} fma_err {e_shipped:.3f}  x{t_cub / best[0]:.2f} | "
          + " ".join(f"{n}:{t:.2f}" for t, n, e in sorted(res)[:8])
          + ("  BAD-ERR" if max(e for _, _, e in res) > 2 * e_shipped + 0.01 else ""), flush=True)
    ws.clear(); outs.clear()  # free the rotating weights before the next shape
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/gemv_tx.json", "w"), indent=1)
