"""moe_experts launch-shape sweep (twenty-ninth session): kernels/moe_experts/kernel.cu built with each variant's
-D macros, timed against SGLang's installed fused_experts_impl on the same weights, as CUDA graphs of CALLS back-to-back
calls, each call routed to its own random experts (so the weights stream from HBM, not L2). Chained time per call,
median of REPLAYS replays. Run on the GPU node from the repository root with the e2e site on PYTHONPATH:

    python3 results/2026-11-30-h200/session29/moe_sweep.py OUT_DIR

Prints one table (µs per call, production / variant) and writes it to OUT_DIR/moe_sweep.md."""
import ctypes
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from astra_sglang.patch.layers import moe_server_defaults

KERNEL = Path("kernels/moe_experts/kernel.cu")
# round 1 (kernel 1 a warp a column, kernel 2 a warp a row): v0-v7; round 2 adds linear-style CTAs (ASTRA_K1_COLS) and
# the chunk kernel 2 (ASTRA_K2_ROWS). ROUND=1 runs the first round's set. Every variant names the macros whose defaults
# changed since it ran (the shipped kernel is round 2's r8g2), so each reruns as it ran.
R1 = ["-DASTRA_K2_ROWS=0"]  # round 1 had no chunk kernel
ROUND1 = {
    "v0 default": R1 + ["-DASTRA_K2_LOADS=24"],
    "v1 k2w4": R1 + ["-DASTRA_K2_WARPS=4", "-DASTRA_K2_LOADS=24"],
    "v2 k2l12": R1,
    "v3 k2w4 l12": R1 + ["-DASTRA_K2_WARPS=4"],
    "v4 k1u4": R1 + ["-DASTRA_K1_UNROLL=4", "-DASTRA_K2_LOADS=24"],
    "v5 k1w4": R1 + ["-DASTRA_K1_WARPS=4", "-DASTRA_K2_LOADS=24"],
    "v6 k1w4 k2w4 l16": R1 + ["-DASTRA_K1_WARPS=4", "-DASTRA_K2_WARPS=4", "-DASTRA_K2_LOADS=16"],
    "v7 k2w2": R1 + ["-DASTRA_K2_WARPS=2", "-DASTRA_K2_LOADS=24"],
}
G4 = ["-DASTRA_K2_GROUP=4"]  # round 2's default chunk group
ROUND2 = {
    "v2 k2l12": R1,
    "c2": R1 + ["-DASTRA_K1_COLS=2"],
    "c4": R1 + ["-DASTRA_K1_COLS=4"],
    "c2i2": R1 + ["-DASTRA_K1_COLS=2", "-DASTRA_K1_ITERS=2"],
    "r4": G4 + ["-DASTRA_K2_ROWS=4"],
    "r8g2": ["-DASTRA_K2_ROWS=8", "-DASTRA_K2_GROUP=2"],
    "c2r4": G4 + ["-DASTRA_K1_COLS=2", "-DASTRA_K2_ROWS=4"],
    "c4r4": G4 + ["-DASTRA_K1_COLS=4", "-DASTRA_K2_ROWS=4"],
    "c2r2": G4 + ["-DASTRA_K1_COLS=2", "-DASTRA_K2_ROWS=2"],
    "c1r4": G4 + ["-DASTRA_K1_COLS=1", "-DASTRA_K2_ROWS=4"],
}
VARIANTS = ROUND1 if os.environ.get("ROUND") == "1" else ROUND2
SHAPES = [  # (T, H, I, E, K, name)
    (1, 2048, 768, 128, 8, "qwen3-30b-a3b"), (2, 2048, 768, 128, 8, "qwen3-30b-a3b"),
    (4, 2048, 768, 128, 8, "qwen3-30b-a3b"), (1, 2048, 1024, 64, 8, "olmoe"), (2, 2048, 1024, 64, 8, "olmoe"),
    (1, 4096, 3584, 8, 2, "mixtral tp4"), (2, 4096, 3584, 8, 2, "mixtral tp4"),
    (1, 4096, 192, 128, 8, "qwen3-235b tp8"), (2, 4096, 192, 128, 8, "qwen3-235b tp8"),
]
CALLS, REPLAYS = 16, 15


def build(name, flags, out):
    so = Path("/tmp") / f"moe_{name.split()[0]}.so"  # not under OUT: what comes back is the table
    subprocess.run(["nvcc", "-arch=sm_90a", "-O3", "-std=c++17", "--use_fast_math", "-shared", "-Xcompiler", "-fPIC",
                    *flags, "-o", str(so), str(KERNEL)], check=True)
    lib = ctypes.CDLL(str(so))
    f = lib.astra_moe_experts
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


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm

    libs = {n: build(n, f, out) for n, f in VARIANTS.items()}
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t, h, inter, e, k, name in SHAPES:
        dt = torch.bfloat16
        x = torch.randn((t, h), device="cuda", generator=gen).to(dt)
        w13 = (torch.randn((e, 2 * inter, h), device="cuda", generator=gen) * h ** -0.5).to(dt)
        w2 = (torch.randn((e, h, inter), device="cuda", generator=gen) * inter ** -0.5).to(dt)
        ids = [torch.rand((t, e), device="cuda", generator=gen).topk(k, dim=1).indices.to(torch.int32).contiguous()
               for _ in range(CALLS)]
        wts = [torch.softmax(torch.randn((t, k), device="cuda", generator=gen), -1).contiguous() for _ in range(CALLS)]
        act = torch.empty((t, k, inter), device="cuda", dtype=dt)
        outs = torch.empty((t, h), device="cuda", dtype=dt)
        hs = x.clone()
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

        def prod(i):
            fm.fused_experts_impl(hidden_states=hs, w1=w13, w2=w2, topk_weights=wts[i], topk_ids=ids[i], inplace=True,
                                  activation="silu", is_gated=True, routed_scaling_factor=1.0, filter_expert=False)

        with moe_server_defaults():
            p_us = time_graph(prod)
        # correctness of each variant against production on call 0 (max abs diff relative to the output's scale)
        ref = x.clone()
        with moe_server_defaults():
            fm.fused_experts_impl(hidden_states=ref, w1=w13, w2=w2, topk_weights=wts[0], topk_ids=ids[0], inplace=True,
                                  activation="silu", is_gated=True, routed_scaling_factor=1.0, filter_expert=False)
        row = {"shape": f"{t}x{h}x{inter}x{e}x{k} {name}", "production": p_us}
        for n, f in libs.items():
            def cand(i, f=f):
                rc = f(x.data_ptr(), w13.data_ptr(), w2.data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(),
                       act.data_ptr(), outs.data_ptr(), t, h, inter, e, k, 1.0, 2, stream())
                assert rc == 0, rc
            cand(0)
            torch.cuda.synchronize()
            err = float((outs.float() - ref.float()).abs().max() / ref.float().abs().max())
            row[n] = (time_graph(cand), err)
        rows.append(row)
        print(row, flush=True)
        del w13, w2
        torch.cuda.empty_cache()
    names = list(VARIANTS)
    lines = ["| shape | production µs | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for r in rows:
        cells = [f"{r[n][0]:.1f} ({r['production'] / r[n][0]:.2f}×, err {r[n][1]:.1e})" for n in names]
        lines.append(f"| {r['shape']} | {r['production']:.1f} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    (out / "moe_sweep.md").write_text(text + "\n")
    print(text)
    # the variant run.sh ships for the step and the served A/B: fastest at 1 token on the first shape (Qwen3-30B-A3B)
    best = min(names, key=lambda n: rows[0][n][0])
    (out / "best.txt").write_text(" ".join(VARIANTS[best]) + "\n")
    print(f"best at {rows[0]['shape']}: {best} {VARIANTS[best]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
