# Times gemv_tune.cu's configurations against F.linear (cuBLAS) on rotating weights (>= 600 MB: L2-cold), in CUDA
# graphs, and prints the best per shape. Not the bench: no in-context timing, no oracle beyond a max-abs error.
#   python3 kernels/dev/linear_tune/gemv_tune.py 1x4096x2048,8x2048x5120   (tokens x in_features x out_features)
import ctypes, subprocess, sys, os, json
import torch
from sandbox_timing import rotating_problem, timed
here = os.path.dirname(os.path.abspath(__file__))
so = "/tmp/gemv_tune.so"
if not os.path.exists(so):
    subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", so, f"{here}/gemv_tune.cu"], check=True)
lib = ctypes.CDLL(so)
lib.tune_gemv.restype = ctypes.c_int
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
cfgs = [(2, 2), (4, 1), (4, 2), (8, 1)]
grids = [0]
res = []
for T, K, N in shapes:
    nrot, ws, x, outs, ref, t_cub = rotating_problem(T, K, N)
    row = {"shape": f"{T}x{K}x{N}", "cublas": t_cub, "cfg": {}}
    for rb, u in cfgs:
        st = torch.cuda.current_stream().cuda_stream
        rc = lib.tune_gemv(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[0].data_ptr()), ctypes.c_void_p(outs[0].data_ptr()), T, K, N, rb, u, 0, ctypes.c_void_p(st))
        torch.cuda.synchronize()
        if rc != 0 or T > 8: continue
        err = (outs[0].float() - ref).abs().max().item()
        def f(i, rb=rb, u=u):
            lib.tune_gemv(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()), ctypes.c_void_p(outs[i].data_ptr()), T, K, N, rb, u, 0, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        t = timed(f, nrot)
        row["cfg"][f"{rb}x{u}"] = (round(t, 2), round(err, 3))
    for wp, u in [(4, 8), (8, 2), (8, 8), (16, 8), (4, 104), (4, 108), (8, 102), (8, 104), (8, 108), (16, 102), (16, 104), (16, 108)]:
        outs[0].zero_()
        rc = lib.tune_mma(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[0].data_ptr()), ctypes.c_void_p(outs[0].data_ptr()), T, K, N, wp, u, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        torch.cuda.synchronize()
        if rc != 0: continue
        err = (outs[0].float() - ref).abs().max().item()
        def f(i, wp=wp, u=u):
            lib.tune_mma(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ws[i].data_ptr()), ctypes.c_void_p(outs[i].data_ptr()), T, K, N, wp, u, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        row["cfg"][f"m{wp}x{u}"] = (round(timed(f, nrot), 2), round(err, 3))
    best = min(row["cfg"].items(), key=lambda kv: kv[1][0])
    gb = N * K * 2 / 1e3
    print(f"{row['shape']:>14} cuBLAS {t_cub:6.2f} us ({gb/t_cub:4.0f} GB/s)  best {best[0]} {best[1][0]:6.2f} us ({gb/best[1][0]:4.0f} GB/s) err {best[1][1]}  x{t_cub/best[1][0]:.2f}", flush=True)
    print("     ", " ".join(f"{k}:{v[0]}" for k, v in row["cfg"].items()), flush=True)
    res.append(row)
    ws.clear(); outs.clear()
json.dump(res, open(os.environ.get("OUT", "/tmp") + "/gemv_tune.json", "w"), indent=1)
