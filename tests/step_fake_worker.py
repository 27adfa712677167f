"""A stand-in for e2e/step_worker.py (no SGLang, no GPU): same protocol, synthetic numbers.

Unpatched arms take 10 ms of GPU time per decode step at batch 1 (+0.1 ms per request); a patched
arm's fused_add_rmsnorm kernels are 2x faster, saving FAKE_SAVED_US per step. Each process is off
by a persistent random factor (sd $FAKE_PROC_SD, default 0.1%, seeded by its name) and each step
by 0.1% noise. Greedy ids depend only on the seed and position (identical across arms) unless
FAKE_DIVERGE is set for the patched arm. $FAKE_EXTRA_SAVED_US (µs per step) makes a process faster still: given
to one arm with `--arm-env`, the A/B of a switch.
Profiles are Chrome traces with the kernel names SGLang 0.5.17 shows.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import zlib

import numpy as np

from astra_sglang.e2e.step_worker import REPLY

FAKE_SAVED_US = 200.0
LAYERS = 4


def reply(obj):
    sys.stdout.write(REPLY + json.dumps(obj) + "\n")
    sys.stdout.flush()


def kernels(bs: int, patched: bool):
    """One decode step: (name, dur µs) in launch order."""
    norm = "void astra_farn::(anonymous namespace)::fused_add_rmsnorm_kernel<1>(...)" if patched else \
        "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)"
    norm_us = 25.0 if patched else 50.0           # 2 per layer x 4 layers x 25 µs saved = 200 µs
    out = [("void at::native::indexSelectLargeIndex<c10::BFloat16>(...)", 5.0)]
    for _ in range(LAYERS):
        out += [(norm, norm_us), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 300.0 + bs),
                ("void fused_rope_store_kernel<true>(...)", 10.0), ("_fwd_grouped_kernel_stage1", 80.0 + 2 * bs),
                ("_fwd_kernel_stage2", 20.0), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 200.0), (norm, norm_us),
                ("nvjet_tst_128x8_64x16_4x1_v_bz_TNT", 900.0 + 2 * bs),
                ("void act_and_mul_kernel<__nv_bfloat16, true>(ActivationParams)", 15.0),
                ("nvjet_tst_128x8_64x16_4x1_v_bz_TNT", 500.0)]
    out += [("nvjet_tst_lm_head", 700.0), ("void at::native::reduce_kernel<512, 1>(argmax)", 8.0)]
    return out


def trace(bs: int, steps: int, patched: bool, shapes: bool) -> dict:
    ev, t, corr = [], 1000.0, 1
    for _s in range(steps):
        for name, dur in kernels(bs, patched):
            k = {"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur, "pid": 0, "tid": 7,
                 "args": {"stream": 7, "device": 0, "correlation": corr}}
            if "FusedAddRMSNorm" in name:           # PDL: starts 1 µs before its producer ends
                k["ts"] -= 1.0
                k["dur"] += 1.0
            ev.append(k)
            if shapes:
                ev.append({"ph": "X", "cat": "cpu_op", "name": "sgl_kernel::fused_add_rmsnorm" if "RMSNorm" in name
                           else "aten::mm", "ts": t - 500.0, "dur": 20.0, "pid": 1, "tid": 1,
                           "args": {"Input Dims": [[bs, 4096], [bs, 4096], [4096], []]}})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t - 495.0, "dur": 5.0,
                           "pid": 1, "tid": 1, "args": {"correlation": corr}})
            corr += 1
            t += dur          # back to back, as in a CUDA graph
    return {"traceEvents": ev}


def main():
    spec = json.loads(sys.argv[1])
    patched = spec.get("ops", "none") != "none"
    if os.environ.get("FAKE_FAIL_START") == spec["name"]:
        reply({"event": "fatal", "error": "RuntimeError: no GPU", "traceback": ""})
        sys.exit(1)
    for f in ("model_path", "tokenizer_path"):
        assert os.path.isfile(os.path.join(spec[f], "config.json")) or f == "tokenizer_path", spec[f]
    assert os.path.isfile(os.path.join(spec["tokenizer_path"], "tokenizer.json")), spec["tokenizer_path"]
    print("some SGLang chatter on stdout", flush=True)
    reply({"event": "ready", "load_s": 0.1, "gpu": "FakeGPU", "timer": "FakeBackend.replay"})
    rng = np.random.default_rng(zlib.crc32(spec["name"].encode()))
    proc_factor = 1.0 + float(os.environ.get("FAKE_PROC_SD", "0.001")) * rng.standard_normal()
    assert spec.get("gpu_pad_us", 0) >= 0
    if os.environ.get("FAKE_SPEC_LOG"):                # the spec each worker got, for the tests
        with open(os.environ["FAKE_SPEC_LOG"], "a") as f:
            f.write(json.dumps(spec) + "\n")
    log = os.environ.get("FAKE_CMD_LOG")
    for line in sys.stdin:
        cmd = json.loads(line)
        if log:                                   # the driver's command order, for the tests
            with open(log, "a") as f:
                f.write(f"{spec['name']} {cmd['cmd']}\n")
        if cmd["cmd"] == "quit":
            reply({"event": "bye"})
            return
        if cmd["cmd"] == "run":
            bs, n = cmd["batch_size"], cmd["output_len"]
            saved_us = (FAKE_SAVED_US if patched else 0.0) + float(os.environ.get("FAKE_EXTRA_SAVED_US", "0"))
            base = (0.010 + 0.0001 * bs - saved_us * 1e-6) * proc_factor
            dec = list(base * (1 + 0.001 * rng.standard_normal(n - 1)))
            dec[0] *= 1.3                                    # the first step after prefill is slow
            toks = [[(cmd["seed"] * 31 + i * 7 + j) % 1000 for j in range(n)] for i in range(bs)]
            if patched and os.environ.get("FAKE_DIVERGE"):
                toks[0][3] += 1
            reply({"event": "done", "cmd": "run", "seconds": 0.01, "prefill_s": 0.02 + 0.001 * bs,
                   "gpu_step_s": dec, "decode_wall_s": sum(dec) * 1.1, "decode_steps": len(dec),
                   "timer": "FakeBackend.replay", "replays_per_step": 1, "tokens": toks})
        elif cmd["cmd"] == "profile":
            bs, d, pre = cmd["batch_size"], cmd["dir"], cmd["prefix"]
            os.makedirs(d, exist_ok=True)
            files = {}
            for stage, steps, sh in (("decode", cmd["steps"], False), ("decode-eager", 1, True), ("prefill", 1, True)):
                fn = f"{pre}-bs{bs}-{stage}.trace.json.gz"
                with gzip.open(os.path.join(d, fn), "wt") as f:
                    json.dump(trace(bs if stage != "prefill" else bs * cmd["input_len"], steps, patched, sh), f)
                files[stage] = fn
            caps = [{"stage": "prefill", "batch_size": bs, "tokens": bs * cmd["input_len"], "steps": 1,
                     "trace": files["prefill"], "arm": pre},
                    {"stage": "decode", "batch_size": bs, "tokens": bs, "steps": cmd["steps"], "trace": files["decode"],
                     "shapes_trace": files["decode-eager"], "arm": pre}]
            reply({"event": "done", "cmd": "profile", "seconds": 0.01, "captures": caps})
        else:
            reply({"event": "error", "error": f"unknown {cmd['cmd']}"})


if __name__ == "__main__":
    main()
