"""Tensor parallel, CPU side: the step worker's ranks (real main loop, stand-in Worker), per-rank
counters, the drill's judgements, per-rank profile captures."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astra_sglang.e2e import tp_drill
from astra_sglang.e2e.profile_cli import trace_rank
from astra_sglang.e2e.step import rank_report
from astra_sglang.patch import config as cfg
from astra_sglang.patch.counters import CounterFile, rank_from_title, read_counters

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "tests" / "step_tp_shim.py"


def _worker(spec: dict, cmds, env=None):
    lines = "".join(json.dumps(c) + "\n" for c in cmds)
    p = subprocess.run([sys.executable, str(SHIM), json.dumps(spec)], input=lines, capture_output=True, text=True,
                       timeout=120, env={**os.environ, **(env or {})})
    return [json.loads(x.split(" ", 1)[1]) for x in p.stdout.splitlines() if x.startswith("@@astra-step ")], p


def test_step_worker_runs_every_command_on_every_rank():
    run = {"cmd": "run", "batch_size": 1, "input_len": 4, "output_len": 3}
    out, p = _worker({"name": "B-p1", "tp": 3, "server_args": ["--tp-size", "3"]},
                     [run, {"cmd": "profile", "batch_size": 1, "prefix": "B"}, {"cmd": "quit"}])
    assert [o["event"] for o in out] == ["ready", "done", "done", "bye"], p.stderr
    assert out[0]["tp"] == 3 and out[0]["ranks_aligned"] == "stand-in aligner, tp 3"
    r = out[1]
    assert r["gpu_step_s"] == [0.001] and r["gpu_step_s_by_rank"] == {"1": [0.002], "2": [0.003]}
    assert r["tokens_match_by_rank"] == {"1": True, "2": True}
    assert r["nccl_port"] and int(r["nccl_port"]) > 0          # one port for the whole group, chosen by rank 0
    assert [c["arm"] for c in out[2]["captures"]] == ["B"]
    assert [c["arm"] for c in out[2]["rank_captures"]] == ["B-TP1", "B-TP2"]


def test_step_worker_reports_a_rank_that_sampled_other_ids():
    out, _ = _worker({"name": "B-p1", "tp": 2}, [{"cmd": "run", "batch_size": 1}, {"cmd": "quit"}],
                     env={"FAKE_TP_DIVERGE": "1"})
    assert out[1]["tokens_match_by_rank"] == {"1": False}


def test_fault_drill_names_op_and_rank():
    env = {cfg.ENV_FAULT_DRILL: "fused_add_rmsnorm@TP1, silu_and_mul"}
    assert cfg.fault_drill("fused_add_rmsnorm", "TP1", env)
    assert cfg.fault_drill("fused_add_rmsnorm", "TP1 EP1", env)
    assert not cfg.fault_drill("fused_add_rmsnorm", "TP0", env)
    assert not cfg.fault_drill("fused_add_rmsnorm", None, env)
    assert cfg.fault_drill("silu_and_mul", None, env) and cfg.fault_drill("silu_and_mul", "TP3", env)
    assert not cfg.fault_drill("rmsnorm", "TP1", env) and not cfg.fault_drill("silu_and_mul", "TP0", {})


def test_rank_from_sglang_process_titles():
    assert rank_from_title("sglang::scheduler_TP1") == "TP1"
    assert rank_from_title("sglang::scheduler_TP0_EP0") == "TP0 EP0"
    assert rank_from_title("sglang::astra_step_TP2") == "TP2"
    assert rank_from_title("sglang::detokenizer") is None and rank_from_title("python3") is None


def test_counters_name_a_live_process_rank_titled_after_the_patch(tmp_path, monkeypatch):
    import astra_sglang.patch.counters  # noqa: F401
    mod = sys.modules["astra_sglang.patch.counters"]

    c = CounterFile(tmp_path, ["silu_and_mul"])            # untitled yet: no rank in its meta file
    c.bump("silu_and_mul", "calls")
    assert json.loads((tmp_path / f"{os.getpid()}.json").read_text())["rank"] in (None, "rank0")
    monkeypatch.setattr(mod, "_title", lambda pid="self": "sglang::scheduler_TP1")
    assert read_counters(tmp_path)[0].rank in ("TP1", "rank0")   # live: read from the title now
    c.rank = None
    c.note_rank()                                                # a self-check writes it down
    assert json.loads((tmp_path / f"{os.getpid()}.json").read_text())["rank"] == "TP1"


def test_trace_rank_from_sglang_trace_names():
    assert trace_rank("1732-TP-1.trace.json.gz") == "TP1"
    assert trace_rank("prefix-1732-TP-0-EP-0-DECODE.trace.json.gz") == "TP0"
    assert trace_rank("merged-1732.trace.json.gz") == "server"


def _ranks(**calls):
    """rank -> counters as tp_drill.read_ranks returns them."""
    return {r: {"pids": [i], "ops": {op: dict(c) for op, c in ops.items()},
                "status": {op: c.get("_status", {}) for op, c in ops.items()}}
            for i, (r, ops) in enumerate(calls.items())}


def test_drill_every_rank_check():
    ok = _ranks(TP0={"silu_and_mul": {"calls": 5}, "rmsnorm": {}}, TP1={"silu_and_mul": {"calls": 5}})
    assert tp_drill.check_every_rank(ok, 2) == []
    missing = _ranks(TP0={"silu_and_mul": {"calls": 5}}, TP1={"silu_and_mul": {"calls": 0}})
    assert tp_drill.check_every_rank(missing, 2) == ["silu_and_mul: no astra calls in TP1"]
    assert tp_drill.check_every_rank(_ranks(TP0={"silu_and_mul": {"calls": 1}}), 2) == ["no counters from TP1"]
    assert "no rank made any astra call" in tp_drill.check_every_rank(_ranks(TP0={}, TP1={}), 2)


def test_drill_fault_check():
    dis = {"calls": 1, "checks_failed": 1, "disabled": 1,
           "_status": {"state": "disabled", "reason": "self-check mismatch on bf16 (4, 8192): ..."}}
    good = _ranks(TP0={"fused_add_rmsnorm": {"calls": 9}}, TP1={"fused_add_rmsnorm": dis})
    assert tp_drill.check_drill(good, "fused_add_rmsnorm", "TP1", 2) == []
    both = _ranks(TP0={"fused_add_rmsnorm": dis}, TP1={"fused_add_rmsnorm": dis})
    assert any("must touch TP1 only" in p for p in tp_drill.check_drill(both, "fused_add_rmsnorm", "TP1", 2))
    none = _ranks(TP0={"fused_add_rmsnorm": {"calls": 9}}, TP1={"fused_add_rmsnorm": {"calls": 9}})
    assert len(tp_drill.check_drill(none, "fused_add_rmsnorm", "TP1", 2)) == 2


def test_drill_parity_and_report():
    assert tp_drill.parity([[1, 2, 3], [4]], [[1, 2, 3], [4]]) == []
    assert tp_drill.parity([[1, 2, 3]], [[1, 9, 3]]) == ["request 0: tokens differ from position 1 (3 vs 3 tokens)"]
    ranks = _ranks(TP0={"silu_and_mul": {"calls": 3}}, TP1={"silu_and_mul": {"calls": 3}})
    res = {"A": {"tokens": [[1, 2]], "alive_after": True},
           "B": {"tokens": [[1, 3]], "alive_after": True, "ranks": ranks, "profile_rc": 0}}
    checks = tp_drill.judge(res, 2, "fused_add_rmsnorm", "TP1")
    assert checks["A"] == [] and checks["B"] == ["request 0: tokens differ from position 1 (2 vs 2 tokens)"]
    md = tp_drill.report({"tp": 2}, res, checks, "fused_add_rmsnorm", "TP1")
    assert "| B | patched |" in md and "| NO |" in md and "| TP1 | 1 | silu_and_mul | 3 |" in md


def test_drill_needs_two_ranks():
    p = subprocess.run([sys.executable, "-m", "astra_sglang.e2e.tp_drill", "--tp", "1"], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert p.returncode == 2 and p.stderr.strip().startswith("error:") and "--tp" in p.stderr


def test_step_rank_report():
    recs = [{"proc": "B-p1", "batch_size": 1, "tokens_match_by_rank": {"1": True}},
            {"proc": "B-p1", "batch_size": 8, "tokens_match_by_rank": {"1": False}}]
    md = rank_report(recs, {"B": {"by_rank": {"TP0": {"silu_and_mul": {"calls": 4}}, "TP1": {"silu_and_mul": {"calls": 4}}}}})
    assert "NO: B-p1 bs 8 TP1" in md and "| B | TP1 | silu_and_mul | 4 |" in md


@pytest.mark.parametrize("args", [["--step", "--tp", "0"], ["--tp", "0"]])
def test_e2e_tp_must_be_positive(tmp_path, args):
    p = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "e2e", "--model-path", "llama3-8b", *args,
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60, cwd="/")
    assert p.returncode != 0 and "--tp must be >= 1" in p.stderr and not (tmp_path / "o").exists()


def test_patched_function_keeps_a_signature_torch_can_register(tmp_path, monkeypatch):
    """SGLang 0.5.17 registers models/utils.fused_inplace_qknorm as a torch custom op at import; its
    module has string annotations; a patched replacement must still give infer_schema real types."""
    import functools

    import torch

    from astra_sglang.patch.apply import resolve_signature

    (tmp_path / "sgl_like.py").write_text("from __future__ import annotations\nimport torch\n\n"
                                          "def qknorm(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, *, "
                                          "head_dim: int = 0) -> None:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import sgl_like

    ns: dict = {}
    exec("def replacement(*args, **kwargs):\n    return None\n", ns)     # globals without torch, like patch/apply
    wrapper = functools.update_wrapper(ns["replacement"], sgl_like.qknorm)
    with pytest.raises(ValueError, match="Unsupported type annotation"):
        torch.library.infer_schema(wrapper, mutates_args=["q", "k"])
    resolve_signature(wrapper, sgl_like.qknorm)
    assert torch.library.infer_schema(wrapper, mutates_args=["q", "k"]).startswith("(Tensor(a0!) q, Tensor(a1!) k")


def test_step_worker_all_means_the_default_ops_like_the_server():
    """The one-batch path patched every op for "all", DEFAULT_OFF ones too (rope ran in the H200
    step A/B of 2026-11-23): "all" must mean what `patch --serve --ops all` patches."""
    from astra_sglang.e2e.step_worker import ops_to_patch
    from astra_sglang.patch import patchable_ops
    from astra_sglang.registry import op_part

    all_ops = ops_to_patch("all")
    off = [o for o in patchable_ops() if getattr(op_part(o, "adapter"), "DEFAULT_OFF", "")]
    assert off and not set(off) & set(all_ops) and "fused_add_rmsnorm" in all_ops
    assert ops_to_patch(["rope"]) == ["rope"]
    assert ops_to_patch(["all", "rope"]) == all_ops + ["rope"]  # e2e --step --ops all,rope


def test_tp_collectives_are_communication_not_sampling():
    """A rank's all-reduce waits for the slowest rank (20 ms per step on TP0 of the H200 drill): it was
    counted as sampling/logits."""
    from astra_sglang.e2e.attribution import classify

    for name in ("::all_reduce_kernel", "ncclDevKernel_AllGather_RING_LL", "cross_device_reduce_1stage<bf16>"):
        assert classify(name).category == "communication", name
    assert classify("void at::native::reduce_kernel<512, 1>(argmax)").op == "sampling/logits"
    assert classify("moe_sum_reduce_kernel").op == "moe_combine"


def test_counters_by_rank_sums_a_ranks_processes_and_can_skip_idle_ones(tmp_path, monkeypatch):
    """patch.counters.by_rank serves both the step's per-rank table and the drill's checks."""
    from astra_sglang.patch.counters import by_rank

    mod = sys.modules["astra_sglang.patch.counters"]
    c = CounterFile(tmp_path, ["silu_and_mul"])
    c.bump("silu_and_mul", "calls", 3)
    c.set_status("silu_and_mul", state="patched")
    monkeypatch.setattr(mod.os, "getpid", lambda: 999999)          # a second process ...
    monkeypatch.setattr(mod, "_title", lambda pid="self": "sglang::detokenizer_TP1")
    CounterFile(tmp_path, ["silu_and_mul"])                          # ... that only imported the patch
    monkeypatch.undo()
    every = by_rank(tmp_path)
    mine = next(r for r in every if r != "TP1")
    assert every[mine]["ops"]["silu_and_mul"]["calls"] == 3
    assert every[mine]["status"]["silu_and_mul"]["state"] == "patched"
    assert every["TP1"]["pids"] == [999999] and not any(every["TP1"]["ops"]["silu_and_mul"].values())
    assert "TP1" not in by_rank(tmp_path, active_only=True)
