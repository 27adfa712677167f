"""moe_experts, thirtieth session: the kernel that reads an expert several tokens share once (ASTRA_DEDUP), with launch
shapes and an L2 prefetch of w2 behind macros, timed against SGLang's installed fused_experts_impl on the same weights
(session 29's build and graph timer: CALLS back-to-back calls a CUDA graph, each call routed to its own experts, median
of REPLAYS replays). Routing `rand`: each token's top-k drawn alone (tokens rarely share an expert at 128 experts);
`same`: every token of a call takes the first token's experts in another order (what dummy-weight models route).
Every variant's output is compared bit for bit with `nodedup` (the session-29 kernel's reads: once per token) and its
error with production's. Run on the GPU node from the repository root with the e2e site on PYTHONPATH:

    python3 results/2026-11-30-h200/session30/moe_sweep.py OUT_DIR

Writes OUT_DIR/moe_sweep.md (µs per call, production / variant). Round 1's prefetch variants name macros the kernel
no longer has (it ignores them)."""
import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
import sys
from pathlib import Path

import torch

from astra_sglang.patch.layers import moe_server_defaults

_spec = importlib.util.spec_from_file_location("s29", Path(__file__).parents[1] / "session29" / "moe_sweep.py")
s29 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s29)  # build(), time_graph(), CALLS

# round 1 (`ROUND=1`) as it ran: kernel 1 at 8 vectors a row (the session-29 shape) with and without the dedup, an L2
# prefetch of w2 by kernel 1 (removed since: slower), kernel 1 at 4 or 2 vectors a row with 4 or 6 CTAs an SM.
# Round 2 (the default): kernel 1's shape picked by its grid (`auto`, the shipped default) against each fixed shape.
ROUND1 = {
    "nodedup": ["-DASTRA_DEDUP=0", "-DASTRA_K1_UNROLL=8"],
    "dedup": ["-DASTRA_K1_UNROLL=8"],
    "pf32": ["-DASTRA_K1_UNROLL=8", "-DASTRA_W2_PREFETCH_MIB=32"],
    "pf32 ef": ["-DASTRA_K1_UNROLL=8", "-DASTRA_W2_PREFETCH_MIB=32", "-DASTRA_K1_EVICT_FIRST=1"],
    "u4b4": ["-DASTRA_K1_UNROLL=4", "-DASTRA_K1_MINB=4"],
    "u2b6": ["-DASTRA_K1_UNROLL=2", "-DASTRA_K1_MINB=6"],
    "u2b6 pf32 ef": ["-DASTRA_K1_UNROLL=2", "-DASTRA_K1_MINB=6", "-DASTRA_W2_PREFETCH_MIB=32",
                     "-DASTRA_K1_EVICT_FIRST=1"],
}
ROUND2 = {
    "nodedup": ["-DASTRA_DEDUP=0"],
    "auto": [],
    "u8": ["-DASTRA_K1_UNROLL=8"],
    "u4b4": ["-DASTRA_K1_UNROLL=4", "-DASTRA_K1_MINB=4"],
    "u2b6": ["-DASTRA_K1_UNROLL=2", "-DASTRA_K1_MINB=6"],
}
VARIANTS = ROUND1 if os.environ.get("ROUND") == "1" else ROUND2
Q3, OL, MX, Q235 = (2048, 768, 128, 8, "qwen3-30b-a3b"), (2048, 1024, 64, 8, "olmoe"), (4096, 3584, 8, 2, "mixtral tp4"), \
    (4096, 192, 128, 8, "qwen3-235b tp8")
SHAPES = [(1, *Q3, "rand"), (2, *Q3, "rand"), (4, *Q3, "rand"), (2, *Q3, "same"), (4, *Q3, "same"),
          (1, *OL, "rand"), (2, *OL, "rand"), (1, *MX, "rand"), (2, *MX, "rand"), (1, *Q235, "rand"),
          (2, *Q235, "rand"), (4, *Q235, "same")]


def routing(t, e, k, how, gen):
    first = torch.rand((1, e), device="cuda", generator=gen).topk(k, dim=1).indices
    if how == "same":  # every token the first token's experts, each in its own order
        ids = torch.cat([first[:, torch.randperm(k, device="cuda", generator=gen)] for _ in range(t)])
    else:
        ids = torch.cat([first, torch.rand((t - 1, e), device="cuda", generator=gen).topk(k, dim=1).indices])
    return ids.to(torch.int32).contiguous()


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm

    with ThreadPoolExecutor(len(VARIANTS)) as pool:  # nvcc runs side by side
        built = {n: pool.submit(s29.build, f"s30{n.replace(' ', '')}", f, out) for n, f in VARIANTS.items()}
        libs = {n: b.result() for n, b in built.items()}
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t, h, inter, e, k, name, how in SHAPES:
        dt = torch.bfloat16
        x = torch.randn((t, h), device="cuda", generator=gen).to(dt)
        w13 = (torch.randn((e, 2 * inter, h), device="cuda", generator=gen) * h ** -0.5).to(dt)
        w2 = (torch.randn((e, h, inter), device="cuda", generator=gen) * inter ** -0.5).to(dt)
        ids = [routing(t, e, k, how, gen) for _ in range(s29.CALLS)]
        wts = [torch.softmax(torch.randn((t, k), device="cuda", generator=gen), -1).contiguous()
               for _ in range(s29.CALLS)]
        act = torch.empty((t, k, inter), device="cuda", dtype=dt)
        outs = torch.empty((t, h), device="cuda", dtype=dt)
        hs = x.clone()
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

        def prod(i):
            fm.fused_experts_impl(hidden_states=hs, w1=w13, w2=w2, topk_weights=wts[i], topk_ids=ids[i], inplace=True,
                                  activation="silu", is_gated=True, routed_scaling_factor=1.0, filter_expert=False)

        with moe_server_defaults():
            p_us = s29.time_graph(prod)
        ref = x.clone()
        with moe_server_defaults():
            fm.fused_experts_impl(hidden_states=ref, w1=w13, w2=w2, topk_weights=wts[0], topk_ids=ids[0], inplace=True,
                                  activation="silu", is_gated=True, routed_scaling_factor=1.0, filter_expert=False)
        row = {"shape": f"{t}x{h}x{inter}x{e}x{k} {name} {how}", "production": p_us}
        base = None
        for n, f in libs.items():
            def cand(i, f=f):
                rc = f(x.data_ptr(), w13.data_ptr(), w2.data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(),
                       act.data_ptr(), outs.data_ptr(), t, h, inter, e, k, 1.0, 2, stream())
                assert rc == 0, rc
            outs.zero_()
            cand(0)
            torch.cuda.synchronize()
            err = float((outs.float() - ref.float()).abs().max() / ref.float().abs().max())
            base = outs.clone() if base is None else base
            same = bool(torch.equal(outs, base))
            row[n] = (s29.time_graph(cand), err, same)
        rows.append(row)
        print({k2: (v if not isinstance(v, tuple) else (round(v[0], 2), f"{v[1]:.1e}", v[2])) for k2, v in row.items()},
              flush=True)
        del w13, w2
        torch.cuda.empty_cache()
    names = list(VARIANTS)
    lines = ["| shape (T×H×I×E×K, routing) | production µs | " + " | ".join(names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for r in rows:
        cells = [f"{r[n][0]:.1f} ({r['production'] / r[n][0]:.2f}×{'' if r[n][2] else ', DIFFERS'})" for n in names]
        lines.append(f"| {r['shape']} | {r['production']:.1f} | " + " | ".join(cells) + " |")
    errs = {n: max(r[n][1] for r in rows) for n in names}
    text = "\n".join(lines) + "\n\nmax error vs production (max |Δ| / max |ref|): " + ", ".join(
        f"{n} {v:.1e}" for n, v in errs.items())
    (out / "moe_sweep.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
