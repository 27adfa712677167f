"""The TMA kernel 1 of variants-next.diff against the shipped kernel and the no-math floor, without SGLang (written for
the last ~100 s of the session's device time, which were refused: too little left to start a machine; never run):
chained µs a call (CUDA graph of 16 calls, each routed to its own random experts, median of 15 replays),
Qwen3-30B-A3B's experts, bf16, and whether the TMA kernel's output equals the shipped kernel's bit for bit. Run from
the repository root after `git apply` of variants-next.diff:

    python3 results/2026-11-30-h200/session31/quick_tma.py
"""
import ctypes
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BUILDS = {"auto": ("kernels/moe_experts/kernel.cu", []), "tma": ("kernels/moe_experts/kernel.cu", ["-DASTRA_K1_TMA=1"]),
          "touch": (str(HERE / "touch.cu"), [])}
CALLS, REPLAYS = 16, 15


def build(name):
    src, flags = BUILDS[name]
    so = f"/tmp/quick_{name}.so"
    subprocess.run(["nvcc", "-arch=sm_90a", "-O3", "-std=c++17", "--use_fast_math", "-shared", "-Xcompiler", "-fPIC",
                    *flags, "-o", so, src], check=True)
    f = ctypes.CDLL(so).astra_moe_experts
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 5 + [ctypes.c_double, ctypes.c_int, ctypes.c_void_p]
    return f


def time_graph(fn):
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(CALLS):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / CALLS)
    return statistics.median(ts)


def main():
    with ThreadPoolExecutor(3) as pool:
        libs = dict(zip(BUILDS, pool.map(build, BUILDS)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    h, inter, e, k = 2048, 768, 128, 8
    w13 = (torch.randn((e, 2 * inter, h), device="cuda", generator=gen) * h ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn((e, h, inter), device="cuda", generator=gen) * inter ** -0.5).to(torch.bfloat16)
    print("| tokens | " + " | ".join(BUILDS) + " | tma == auto |")
    for t in (1, 2, 4):
        x = torch.randn((t, h), device="cuda", generator=gen).to(torch.bfloat16)
        ids = [torch.rand((t, e), device="cuda", generator=gen).topk(k, dim=1).indices.to(torch.int32).contiguous()
               for _ in range(CALLS)]
        wts = [torch.softmax(torch.randn((t, k), device="cuda", generator=gen), -1).contiguous() for _ in range(CALLS)]
        act = torch.empty((t, k, inter), device="cuda", dtype=torch.bfloat16)
        outs = {n: torch.zeros((t, h), device="cuda", dtype=torch.bfloat16) for n in BUILDS}
        row = {}
        for n, f in libs.items():
            def cand(i, f=f, o=outs[n]):
                rc = f(x.data_ptr(), w13.data_ptr(), w2.data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(),
                       act.data_ptr(), o.data_ptr(), t, h, inter, e, k, 1.0, 2, torch.cuda.current_stream().cuda_stream)
                assert rc == 0, (n, rc)
            cand(0)
            torch.cuda.synchronize()
            first = outs[n].clone()
            row[n] = time_graph(cand)
            outs[n].copy_(first)
        same = bool(torch.equal(outs["tma"], outs["auto"]))
        print(f"| {t} | " + " | ".join(f"{row[n]:.1f}" for n in BUILDS) + f" | {same} |", flush=True)


if __name__ == "__main__":
    main()
