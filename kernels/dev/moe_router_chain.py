"""How much of the MoE router's launch sits on the decode chain's critical path (kernels/NOTES.md lead 00b): the chain
a patched Qwen3-MoE layer runs at 1-2 tokens, astra's moe_gate -> moe_router -> moe_experts (two launches), against
the same chain with the router's ids and weights already in memory (what folding the top-k into moe_experts could
at most save), and each part alone. GPU only: the shipped kernels built as a patched server builds them, no SGLang.

    python kernels/dev/moe_router_chain.py [--tokens 1,2] [--hidden 2048] [--inter 768] [--experts 128] [--topk 8]

µs a layer: a CUDA graph of 16 layers (each its own hidden state, so its own routing; the same expert weights),
median of 15 replays. The `gate, experts` chain reads the ids the router wrote for the same logits beforehand, so
both chains compute the same output (checked).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys

LAYERS, REPLAYS = 16, 15


def load(path, symbol: str, argtypes):
    """`symbol` of the shared library at `path` as a ctypes function returning a cudaError_t."""
    f = getattr(ctypes.CDLL(str(path)), symbol)
    f.restype, f.argtypes = ctypes.c_int, argtypes
    return f


def kernel(op: str, symbol: str, argtypes):
    """The shipped kernel of `op`, built with the flags a patched server uses, as a ctypes function."""
    from astra_sglang.patch.apply import build_kernel

    return load(build_kernel(op), symbol, argtypes)


def graph_us(body) -> float:
    """µs a layer of `body(i)` for i in range(LAYERS), captured once, replayed REPLAYS times."""
    import torch

    body(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(LAYERS):
            body(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / LAYERS)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,2")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=8)
    a = ap.parse_args(argv)
    try:
        tokens = [int(s) for s in a.tokens.split(",")]
    except ValueError:
        tokens = []
    if not tokens or min(tokens) < 1:
        print(f"error: --tokens {a.tokens!r}: comma-separated positive integers", file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU: this measures kernels on one", file=sys.stderr)
        return 2
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    gate = kernel("moe_gate", "astra_moe_gate", [vp] * 3 + [i64] * 3 + [ctypes.c_int, vp])
    router = kernel("moe_router", "astra_moe_router", [vp] * 3 + [i64] * 3 + [ctypes.c_int, ctypes.c_int, vp])
    experts = kernel("moe_experts", "astra_moe_experts", [vp] * 7 + [i64] * 5 + [ctypes.c_double, ctypes.c_int, vp])
    bf16, dt = torch.bfloat16, 2
    h, inter, e, k = a.hidden, a.inter, a.experts, a.topk
    gen = torch.Generator(device="cuda").manual_seed(0)
    gw = (torch.randn((e, h), device="cuda", generator=gen) * h ** -0.5).to(bf16)
    w13 = (torch.randn((e, 2 * inter, h), device="cuda", generator=gen) * h ** -0.5).to(bf16)
    w2 = (torch.randn((e, h, inter), device="cuda", generator=gen) * inter ** -0.5).to(bf16)
    print("| tokens | gate, router, experts | gate, experts (ids ready) | router on the chain | gate | router | experts "
          "| same output |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")

    def s():   # the stream at launch time: inside a capture that is the graph's stream, not the default one
        return torch.cuda.current_stream().cuda_stream

    for t in tokens:
        x = [torch.randn((t, h), device="cuda", generator=gen).to(bf16) for _ in range(LAYERS)]
        logits = [torch.empty((t, e), device="cuda", dtype=bf16) for _ in range(LAYERS)]
        wts = [torch.empty((t, k), device="cuda", dtype=torch.float32) for _ in range(LAYERS)]
        ids = [torch.empty((t, k), device="cuda", dtype=torch.int32) for _ in range(LAYERS)]
        act = torch.empty((t, k, inter), device="cuda", dtype=bf16)
        out = [torch.empty((t, h), device="cuda", dtype=bf16) for _ in range(LAYERS)]

        def g(i):
            assert gate(x[i].data_ptr(), gw.data_ptr(), logits[i].data_ptr(), t, h, e, dt, s()) == 0

        def r(i):
            assert router(logits[i].data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(), t, e, k, 1, dt, s()) == 0

        def m(i):
            assert experts(x[i].data_ptr(), w13.data_ptr(), w2.data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(),
                           act.data_ptr(), out[i].data_ptr(), t, h, inter, e, k, 1.0, dt, s()) == 0

        full = graph_us(lambda i: (g(i), r(i), m(i)))
        first = torch.stack(out).clone()
        no_router = graph_us(lambda i: (g(i), m(i)))   # the ids and weights the full chain's router left
        same = bool(torch.equal(torch.stack(out), first))
        parts = [graph_us(f) for f in (g, r, m)]
        print(f"| {t} | {full:.2f} | {no_router:.2f} | {full - no_router:.2f} | "
              + " | ".join(f"{p:.2f}" for p in parts) + f" | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
