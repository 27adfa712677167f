"""moe_experts, thirty-first session: where the expert weights' bandwidth goes at 1-4 tokens. Variants of
kernels/moe_experts/kernel.cu behind macros (kernel 1 persistent with the next step's loads in flight,
`ASTRA_K1_STREAM`; kernel 1's shape over windows of several tokens, `ASTRA_K1_MULTI`; kernel 2 issuing its next
chunks before this chunk's FMAs, `ASTRA_K2_PIPE`) and `touch` (touch.cu here: the same bytes read in one persistent
launch, no math; the floor), timed against SGLang's installed fused_experts_impl on the same weights with session
29's build and graph timer and session 30's routing (`rand`: each token's top-k drawn alone; `same`: every token on
the first token's experts). Every variant's output is compared bit for bit with the shipped kernel's (`auto`).
None of these variants shipped: kernels/moe_experts/kernel.cu no longer has their macros; apply `variants-r1r2.diff`
(rounds 1 and 2), `variants-r3.diff` (round 3) or `variants-next.diff` (`VARIANTS=auto,tma,touch`: not yet run)
here to the kernel of 360cb43 to run them (`auto` and `touch` run as they are). Run on the GPU node from the
repository root with the e2e site on PYTHONPATH:

    python3 results/2026-11-30-h200/session31/moe_sweep.py OUT_DIR         # the sweep: OUT_DIR/moe_sweep.md
    NCU=1 VARIANTS=auto,s2b4 python3 .../moe_sweep.py OUT_DIR              # a few eager calls each, for ncu
"""
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from astra_sglang.patch.layers import moe_server_defaults

HERE = Path(__file__).resolve().parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


s29 = _load("s29", HERE.parents[1] / "2026-11-30-h200" / "session29" / "moe_sweep.py")  # build(), time_graph()
s30 = _load("s30", HERE.parents[1] / "2026-11-30-h200" / "session30" / "moe_sweep.py")  # routing()

ALL = {
    "auto": [],
    "m1": ["-DASTRA_K1_MULTI=1"],
    "s4b2": ["-DASTRA_K1_STREAM=4"],
    "s2b4": ["-DASTRA_K1_STREAM=2", "-DASTRA_K1_STREAM_MINB=4"],
    "s8b1": ["-DASTRA_K1_STREAM=8", "-DASTRA_K1_STREAM_MINB=1"],
    "p1": ["-DASTRA_K2_PIPE=1", "-DASTRA_K2_GROUP=1"],
    "p1r4": ["-DASTRA_K2_PIPE=1", "-DASTRA_K2_GROUP=1", "-DASTRA_K2_ROWS=4"],
    "s2b4 p1": ["-DASTRA_K1_STREAM=2", "-DASTRA_K1_STREAM_MINB=4", "-DASTRA_K2_PIPE=1", "-DASTRA_K2_GROUP=1"],
    "touch": None,  # touch.cu: the floor
    # round 2: kernel 2 reads the window's act from shared memory and sums its rows in one butterfly (ASTRA_K2_STAGE)
    "st": ["-DASTRA_K2_STAGE=1"],
    "st g3": ["-DASTRA_K2_STAGE=1", "-DASTRA_K2_GROUP=3"],
    "st r16g1": ["-DASTRA_K2_STAGE=1", "-DASTRA_K2_ROWS=16", "-DASTRA_K2_GROUP=1"],
    "st r4g4": ["-DASTRA_K2_STAGE=1", "-DASTRA_K2_ROWS=4", "-DASTRA_K2_GROUP=4"],
    "st m2": ["-DASTRA_K2_STAGE=1", "-DASTRA_K1_MULTI=2"],
    # round 3: kernel 1 persistent, its weight tiles through shared memory with cp.async (ASTRA_K1_STAGED), STAGES
    # tiles of 16 rows x CV vectors in flight a CTA, SMB CTAs an SM
    "g": ["-DASTRA_K1_STAGED=1"],
    "g s8c32": ["-DASTRA_K1_STAGED=1", "-DASTRA_K1_STAGES=8", "-DASTRA_K1_CV=32"],
    "g s6b2": ["-DASTRA_K1_STAGED=1", "-DASTRA_K1_STAGES=6", "-DASTRA_K1_SMB=2"],
    "g s3b4": ["-DASTRA_K1_STAGED=1", "-DASTRA_K1_STAGES=3", "-DASTRA_K1_SMB=4"],
    "g s4c32b5": ["-DASTRA_K1_STAGED=1", "-DASTRA_K1_STAGES=4", "-DASTRA_K1_CV=32", "-DASTRA_K1_SMB=5"],
    # next (written after the session's device time was spent, compiled, never run; `variants-next.diff`): kernel 1's
    # 8-column tiles by bulk copy (TMA) into a 3-tile ring, a producer warp and eight consumer warps
    "tma": ["-DASTRA_K1_TMA=1"],
}
ROUND1 = "auto,m1,s4b2,s2b4,s8b1,p1,p1r4,s2b4 p1,touch"  # as round 1 ran (VARIANTS=...)
ROUND2 = "auto,st,st g3,st r16g1,st r4g4,st m2,touch"  # with variants-r1r2.diff applied
ROUND3 = "auto,g,g s8c32,g s6b2,g s3b4,g s4c32b5,touch"
NEXT = "auto,tma,touch"  # with variants-next.diff applied
VARIANTS = {n: ALL[n] for n in os.environ.get("VARIANTS", ROUND3).split(",")}
Q3, OL, MX, Q235 = s30.Q3, s30.OL, s30.MX, s30.Q235
SHAPES = [(1, *Q3, "rand"), (2, *Q3, "rand"), (3, *Q3, "rand"), (4, *Q3, "rand"), (2, *Q3, "same"), (4, *Q3, "same"),
          (1, *OL, "rand"), (2, *OL, "rand"), (1, *MX, "rand"), (2, *MX, "rand"), (1, *Q235, "rand"),
          (2, *Q235, "rand"), (4, *Q235, "same")]
if os.environ.get("NCU"):
    SHAPES = [(1, *Q3, "rand"), (2, *Q3, "rand"), (4, *Q3, "rand")]


def build_all(out):
    with ThreadPoolExecutor(len(VARIANTS)) as pool:  # nvcc runs side by side
        built = {n: pool.submit(s29.build, f"s31{n.replace(' ', '')}", f, out) for n, f in VARIANTS.items()
                 if f is not None}
        libs = {n: b.result() for n, b in built.items()}
    if "touch" in VARIANTS:
        s29.KERNEL = HERE / "touch.cu"
        libs["touch"] = s29.build("s31touch", [], out)
    return {n: libs[n] for n in VARIANTS}


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm

    libs = build_all(out)
    ncu = bool(os.environ.get("NCU"))
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t, h, inter, e, k, name, how in SHAPES:
        dt = torch.bfloat16
        x = torch.randn((t, h), device="cuda", generator=gen).to(dt)
        w13 = (torch.randn((e, 2 * inter, h), device="cuda", generator=gen) * h ** -0.5).to(dt)
        w2 = (torch.randn((e, h, inter), device="cuda", generator=gen) * inter ** -0.5).to(dt)
        ids = [s30.routing(t, e, k, how, gen) for _ in range(s29.CALLS)]
        wts = [torch.softmax(torch.randn((t, k), device="cuda", generator=gen), -1).contiguous()
               for _ in range(s29.CALLS)]
        act = torch.empty((t, k, inter), device="cuda", dtype=dt)
        outs = torch.empty((t, h), device="cuda", dtype=dt)
        hs = x.clone()
        stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

        def prod(i):
            fm.fused_experts_impl(hidden_states=hs, w1=w13, w2=w2, topk_weights=wts[i], topk_ids=ids[i], inplace=True,
                                  activation="silu", is_gated=True, routed_scaling_factor=1.0, filter_expert=False)

        row = {"shape": f"{t}x{h}x{inter}x{e}x{k} {name} {how}"}
        with moe_server_defaults():
            if ncu:
                for i in range(3):
                    prod(i)
            else:
                row["production"] = s29.time_graph(prod)
        ref = x.clone()
        with moe_server_defaults():
            fm.fused_experts_impl(hidden_states=ref, w1=w13, w2=w2, topk_weights=wts[0], topk_ids=ids[0], inplace=True,
                                  activation="silu", is_gated=True, routed_scaling_factor=1.0, filter_expert=False)
        base = None
        for n, f in libs.items():
            def cand(i, f=f):
                rc = f(x.data_ptr(), w13.data_ptr(), w2.data_ptr(), wts[i].data_ptr(), ids[i].data_ptr(),
                       act.data_ptr(), outs.data_ptr(), t, h, inter, e, k, 1.0, 2, stream())
                assert rc == 0, rc
            if ncu:
                for i in range(3):
                    cand(i)
                continue
            outs.zero_()
            cand(0)
            torch.cuda.synchronize()
            err = float((outs.float() - ref.float()).abs().max() / ref.float().abs().max())
            base = outs.clone() if base is None else base
            same = bool(torch.equal(outs, base))  # before the timing's calls overwrite outs
            row[n] = (s29.time_graph(cand), err, same)
        torch.cuda.synchronize()
        if not ncu:
            rows.append(row)
            print({k2: (v if not isinstance(v, tuple) else (round(v[0], 2), f"{v[1]:.1e}", v[2]))
                   for k2, v in row.items()}, flush=True)
        del w13, w2
        torch.cuda.empty_cache()
    if ncu:
        return
    names = list(VARIANTS)
    lines = ["| shape (T×H×I×E×K, routing) | production µs | " + " | ".join(names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for r in rows:
        cells = [f"{r[n][0]:.1f} ({r['production'] / r[n][0]:.2f}×{'' if r[n][2] or n == 'touch' else ', DIFFERS'})"
                 for n in names]
        lines.append(f"| {r['shape']} | {r['production']:.1f} | " + " | ".join(cells) + " |")
    errs = {n: max(r[n][1] for r in rows) for n in names if n != "touch"}
    text = "\n".join(lines) + "\n\nmax error vs production (max |Δ| / max |ref|): " + ", ".join(
        f"{n} {v:.1e}" for n, v in errs.items())
    (out / "moe_sweep.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
