# Sandbox runner for gemv_tx.cu: max abs err vs fp32 and µs per call (L2-cold, CUDA graph) vs cuBLAS and the shipped
# FMA kernel (kernels/linear/kernel.cu).   python3 astra-work/dev/gemv/gemv_tx.py 1x4096x2048,8x4096x2048
import ctypes, os, subprocess, sys, json
import torch
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(f"{here}/../../..")
def build(src, so):
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", so, src],
                   check=True)
    return ctypes.CDLL(so)
tx = build(f"{here}/gemv_tx.cu", "/tmp/gemv_tx.so")
fma = build(f"{root}/kernels/linear/kernel.cu", "/tmp/astra_linear_fma.so")
fma.astra_linear.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_void_p]

def timed(fn, nrot, reps=20):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            for i in range(nrot):
                fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(nrot):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / nrot)
    return sorted(ts)[len(ts) // 2]

cfgs = [(4, 1, 1), (4, 1, 2), (4, 2, 1), (8, 1, 1), (8, 1, 2), (8, 2, 1)]
pf_cfgs = [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)]
ws_cfgs = [(4, 1, 4), (4, 1, 6), (4, 2, 4), (4, 2, 6), (8, 2, 4), (4, 4, 4), (8, 4, 3), (8, 4, 4), (2, 1, 8),
           (8, 1, 3), (2, 2, 6), (4, 4, 6), (8, 8, 3)]
if os.environ.get("ONLY_PF"):  # round 8: the prefetching variant against the register transpose only
    ws_cfgs, cfgs = [], [(4, 1, 1), (4, 2, 1), (8, 1, 1), (8, 2, 1), (8, 1, 2)]
cpa_cfgs = []
rows = []
for s in sys.argv[1].split(","):
    T, K, N = map(int, s.split("x"))
    nrot = max(4, (600 << 20) // (N * K * 2))
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(T, N, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
    ref = torch.nn.functional.linear(x.float(), ws[0].float())
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    t_cub = timed(lambda i: torch.nn.functional.linear(x, ws[i]), nrot)
    f_fma = lambda i: fma.astra_linear(x.data_ptr(), ws[i].data_ptr(), outs[i].data_ptr(), T, K, N, 2, stream())
    outs[0].zero_(); f_fma(0); torch.cuda.synchronize()
    e_fma = (outs[0].float() - ref).abs().max().item()
    t_fma = timed(f_fma, nrot)
    res = []
    for wp, rt, u in cfgs:
        def f(i, wp=wp, rt=rt, u=u):
            return tx.tune_tx(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()),
                              ctypes.c_void_p(outs[i].data_ptr()), T, K, N, wp, rt, u, stream())
        outs[0].zero_()
        if f(0) != 0:
            torch.cuda.synchronize()
            continue
        torch.cuda.synchronize()
        err = (outs[0].float() - ref).abs().max().item()
        res.append((timed(f, nrot), f"{wp}w{rt}r{u}u", err))
    for wp, rt, st in cpa_cfgs:
        def f(i, wp=wp, rt=rt, st=st):
            return tx.tune_cpa(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()),
                               ctypes.c_void_p(outs[i].data_ptr()), T, K, N, wp, rt, st, stream())
        outs[0].zero_()
        if f(0) != 0:
            torch.cuda.synchronize()
            continue
        torch.cuda.synchronize()
        err = (outs[0].float() - ref).abs().max().item()
        res.append((timed(f, nrot), f"c{wp}w{rt}r{st}s", err))
    for wp, rt in pf_cfgs:
        if T > 8:
            break
        def f(i, wp=wp, rt=rt):
            return tx.tune_pf(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()),
                              ctypes.c_void_p(outs[i].data_ptr()), T, K, N, wp, rt, stream())
        outs[0].zero_()
        if f(0) != 0:
            torch.cuda.synchronize()
            continue
        torch.cuda.synchronize()
        err = (outs[0].float() - ref).abs().max().item()
        res.append((timed(f, nrot), f"p{wp}w{rt}r", err))
    for wp, ks, st in ws_cfgs:
        if T > 8:
            break
        def f(i, wp=wp, ks=ks, st=st):
            return tx.tune_ws(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()),
                              ctypes.c_void_p(outs[i].data_ptr()), T, K, N, wp, ks, st, stream())
        outs[0].zero_()
        if f(0) != 0:
            torch.cuda.synchronize()
            continue
        torch.cuda.synchronize()
        err = (outs[0].float() - ref).abs().max().item()
        res.append((timed(f, nrot), f"s{wp}w{ks}k{st}s", err))
    best = min(res)
    gb = N * K * 2 / 1e3
    rows.append({"shape": s, "cublas": t_cub, "fma": t_fma, "fma_err": e_fma, "tx": {n: (t, e) for t, n, e in res}})
    print(f"{s:>14} cuBLAS {t_cub:6.2f}  fma {t_fma:6.2f} (x{t_cub / t_fma:.2f})  tx {best[1]} {best[0]:6.2f} "
          f"({gb / best[0]:4.0f} GB/s) err {best[2]:.3f} fma_err {e_fma:.3f}  x{t_cub / best[0]:.2f} | "
          + " ".join(f"{n}:{t:.2f}" for t, n, e in sorted(res)[:8])
          + ("  BAD-ERR" if max(e for _, _, e in res) > 2 * e_fma + 0.01 else ""), flush=True)
    del ws, outs
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/gemv_tx.json", "w"), indent=1)
