"""kernels/NOTES.md lead 00b, measured: moe_experts with the router folded in (route_fold.diff, `-DASTRA_ROUTE_FOLD=1`:
both kernels recompute moe_router's softmax top-k from the gate's logits) against the shipped chain, without SGLang.
Run from the repository root after `patch -p1 < route_fold.diff`:

    PYTHONPATH=$PWD python3 results/2026-12-01-h200/session33/fold/quick_fold.py

µs a layer: a CUDA graph of 16 layers (each its own hidden state, so its own routing; the same expert weights),
median of 15 replays, Qwen3-30B-A3B's experts (2048 x 768, 128 experts, top 8), bf16. `chain`: moe_gate -> moe_router
-> moe_experts (what a patched server runs); `fold`: moe_gate -> moe_experts with the router folded in. `diff`: the
largest |fold - chain| of the outputs (0: bit-identical; the fold's softmax runs under --use_fast_math)."""
import ctypes
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

# kernels/dev/moe_router_chain.py's loader and graph timer (16 layers a graph, median of 15 replays)
from kernels.dev.moe_router_chain import LAYERS, graph_us, kernel, load

SRC = "kernels/moe_experts/kernel.cu"


def build_experts(fold: int):
    so = f"/tmp/quick_fold{fold}.so"
    subprocess.run(["nvcc", "-arch=sm_90a", "-O3", "-std=c++17", "--use_fast_math", "-shared", "-Xcompiler", "-fPIC",
                    f"-DASTRA_ROUTE_FOLD={fold}", "-o", so, SRC], check=True)
    return so


def main() -> int:
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    with ThreadPoolExecutor(2) as pool:
        sos = list(pool.map(build_experts, (0, 1)))
    ex_args = [vp] * 7 + [i64] * 5 + [ctypes.c_double, ctypes.c_int, vp]
    auto, fold = (load(so, "astra_moe_experts", ex_args) for so in sos)
    gate = kernel("moe_gate", "astra_moe_gate", [vp] * 3 + [i64] * 3 + [ctypes.c_int, vp])
    router = kernel("moe_router", "astra_moe_router", [vp] * 3 + [i64] * 3 + [ctypes.c_int, ctypes.c_int, vp])
    bf16, dt = torch.bfloat16, 2
    h, inter, e, k = 2048, 768, 128, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    gw = (torch.randn((e, h), device="cuda", generator=gen) * h ** -0.5).to(bf16)
    w13 = (torch.randn((e, 2 * inter, h), device="cuda", generator=gen) * h ** -0.5).to(bf16)
    w2 = (torch.randn((e, h, inter), device="cuda", generator=gen) * inter ** -0.5).to(bf16)

    def s():
        return torch.cuda.current_stream().cuda_stream

    print("| tokens | chain: gate, router, experts | fold: gate, experts | fold − chain | experts alone | "
          "fold's experts alone | router ids = host top-k | diff |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|")
    for t in (1, 2, 4):
        x = [torch.randn((t, h), device="cuda", generator=gen).to(bf16) for _ in range(LAYERS)]
        logits = [torch.empty((t, e), device="cuda", dtype=bf16) for _ in range(LAYERS)]
        wts = [torch.empty((t, k), device="cuda", dtype=torch.float32) for _ in range(LAYERS)]
        ids = [torch.empty((t, k), device="cuda", dtype=torch.int32) for _ in range(LAYERS)]
        act = torch.empty((t, k, inter), device="cuda", dtype=bf16)
        out_c = [torch.empty((t, h), device="cuda", dtype=bf16) for _ in range(LAYERS)]
        out_f = [torch.empty((t, h), device="cuda", dtype=bf16) for _ in range(LAYERS)]

        def g(i):
            assert gate(x[i].data_ptr(), gw.data_ptr(), logits[i].data_ptr(), t, h, e, dt, s()) == 0

        def r(i):
            assert router(logits[i].data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(), t, e, k, 1, dt, s()) == 0

        def m(i):
            assert auto(x[i].data_ptr(), w13.data_ptr(), w2.data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(),
                        act.data_ptr(), out_c[i].data_ptr(), t, h, inter, e, k, 1.0, dt, s()) == 0

        def f(i):
            rc = fold(x[i].data_ptr(), w13.data_ptr(), w2.data_ptr(), logits[i].data_ptr(), None, act.data_ptr(),
                      out_f[i].data_ptr(), t, h, inter, e, k, 1.0, dt, s())
            assert rc == 0, rc

        chain = graph_us(lambda i: (g(i), r(i), m(i)))
        folded = graph_us(lambda i: (g(i), f(i)))
        alone = graph_us(m)
        alone_f = graph_us(f)
        torch.cuda.synchronize()
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out_c, out_f))
        # the fold's ids: the experts whose rows it used show in its output; here the router's ids are compared with
        # a host top-k of the same logits, ties to the lowest id (stable sort)
        same_ids = all(torch.equal(ids[i].long(), torch.sort(logits[i].float(), dim=1, descending=True,
                                                              stable=True).indices[:, :k]) for i in range(LAYERS))
        print(f"| {t} | {chain:.2f} | {folded:.2f} | {folded - chain:+.2f} | {alone:.2f} | {alone_f:.2f} | "
              f"{same_ids} | {diff:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
