"""Why the in-context floor is bimodal: the cuBLAS kernels of bench's neighbour GEMMs, and what one kernel between them
costs, per hidden size. GPU only; torch and bench's timer (no workspace, no SGLang).

bench times an op between a producer GEMM (tokens x 4096 -> hidden) and a consumer GEMM (hidden -> 4096). Its floor,
a PDL-launched touch kernel in the op's place, cost 0.1-0.4 us on some shapes and 1.5-1.9 us on others (H200,
2026-11-28, kernels/NOTES.md). This prints, per shape, the kernels each GEMM launches and the marginal time of a
plain one-block kernel between them (CUDA graph of N repeats, with minus without, medians of interleaved replays):

    python kernels/dev/floor_probe.py [--hidden 4096,5120,3584,7168,8192] [--tokens 1,64] [--producer-k 4096]
        [--consumer-width 4096]

--producer-k / --consumer-width set the GEMMs to a model's own (o_proj's input, qkv's or gate_up's output) to see
whether the model's neighbours carry the same floor as bench's (producer 4096 -> hidden, consumer hidden -> 4096).

What it showed (H200, 2026-11-28, results/2026-11-28-h200x2/session15/floor/): the floor is low where the producer ends
with cuBLAS's split-K reduce kernel and high where it ends with one nvjet GEMM kernel, for the models' pairs too.
"""
from __future__ import annotations

import argparse
import sys


def kernel_names(fn) -> list:
    """The CUDA kernels `fn` launches, in order (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()]


def marginal_us(with_op, alone, n: int, replays: int) -> float:
    """Per call, the median over interleaved replays of (with - alone): bench's own graphs, timer and statistic."""
    from astra_sglang.harness.stats import marginal
    from astra_sglang.harness.timer import graph_of, time_graphs

    ms = time_graphs([graph_of(lambda i: with_op(), n), graph_of(lambda i: alone(), n)], replays)
    per = [[m * 1e3 / n for m in series] for series in ms]
    return marginal(per[0], per[1])["median"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="4096,5120,3584,7168,8192")
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--producer-k", type=int, default=4096)
    ap.add_argument("--consumer-width", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--replays", type=int, default=40)
    a = ap.parse_args(argv)
    try:
        hidden = [int(x) for x in a.hidden.split(",")]
        tokens = [int(x) for x in a.tokens.split(",")]
    except ValueError:
        print("error: --hidden and --tokens take comma-separated integers", file=sys.stderr)
        return 2
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("error: no CUDA GPU (floor_probe times GEMMs on the GPU)", file=sys.stderr)
        return 2
    bf = dict(device="cuda", dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; producer T x {a.producer_k} -> H, consumer H -> "
          f"{a.consumer_width}; one-block kernel between them")
    print(f"{'shape':>10}  {'between us':>10}  producer kernels | consumer kernels")
    for t in tokens:
        for h in hidden:
            x_in = torch.randn(t, a.producer_k, **bf)
            w1 = torch.randn(h, a.producer_k, **bf) / a.producer_k ** 0.5
            mid = torch.empty(t, h, **bf)
            w2 = torch.randn(a.consumer_width, h, **bf) / h ** 0.5
            y = torch.empty(t, a.consumer_width, **bf)
            one = mid[:1, :8]

            def alone():
                F.linear(x_in, w1, out=mid)
                F.linear(mid, w2, out=y)

            def between():
                F.linear(x_in, w1, out=mid)
                one.mul_(1.0)   # one tiny kernel in the op's place (not PDL-launched: an upper bound on the floor)
                F.linear(mid, w2, out=y)

            prod = kernel_names(lambda: F.linear(x_in, w1, out=mid))
            cons = kernel_names(lambda: F.linear(mid, w2, out=y))
            us = marginal_us(between, alone, a.calls, a.replays)
            short = lambda ks: ", ".join(k[:48] for k in ks)  # noqa: E731
            print(f"{t:>4}x{h:<5}  {us:>10.2f}  {short(prod)} | {short(cons)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
