"""Tensor-parallel drill: the patch in every worker of a `--tp N` SGLang server, checked.

    python -m astra_sglang.e2e.tp_drill --model-path llama3-70b --tp 2 --out DIR [--drill-op OP] [--ops all]

Three servers, one after another (a 70B-shaped model fills the GPUs once), each through
`astra-sglang patch --serve` with dummy weights and token-id prompts:
  A  unpatched (`--ops none`): the reference tokens;
  B  patched: every rank's counters must show astra calls for every op any rank runs, and
     `profile --url --tp N` runs during its traffic (one trace per rank, attributed per rank);
  C  patched, with ASTRA_SGLANG_FAULT_DRILL=<drill-op>@TP<last rank>: that rank's self-check fails,
     the op is disabled in that rank only, loudly, and the server keeps serving.
Greedy tokens of B and C must equal A's in every request. Counters are read while each server is
alive (the rank comes from SGLang's process titles). Outputs in --out: report.md, results.json,
counters-<arm>.json, server-<arm>.log, profile-B/. Exit 1 when a check fails.
Run it from outside a source checkout (the servers must import the installed astra_sglang).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from astra_sglang.patch.counters import fresh_counter_dir

from .cli import Server, launcher_cmd, server_args
from .client import Workload, make_prompts, run_workload, wait_ready


def _say(msg: str) -> None:
    print(f"  · {msg}", file=sys.stderr, flush=True)


def read_ranks(counter_dir: Path) -> Dict[str, dict]:
    """rank -> {"pids", "ops", "status"} of the processes that ran an op (patch.counters.by_rank)."""
    from astra_sglang.patch.counters import by_rank

    return by_rank(counter_dir, active_only=True)


def check_every_rank(ranks: Dict[str, dict], tp: int) -> List[str]:
    """Every TP rank ran astra for every op that any rank ran."""
    want = {f"TP{i}" for i in range(tp)}
    problems = [f"no counters from {r}" for r in sorted(want - set(ranks))]
    problems += [f"a process without a TP rank ran ops: {r}" for r in sorted(set(ranks) - want)]
    used = {op for r in ranks.values() for op, c in r["ops"].items() if c.get("calls", 0)}
    for op in sorted(used):
        for r in sorted(want & set(ranks)):
            if not ranks[r]["ops"].get(op, {}).get("calls", 0):
                problems.append(f"{op}: no astra calls in {r}")
    if not used:
        problems.append("no rank made any astra call")
    return problems


def check_drill(ranks: Dict[str, dict], op: str, rank: str, tp: int) -> List[str]:
    """The drilled rank disabled `op` after a failed self-check; every other rank kept it."""
    problems = []
    mine = ranks.get(rank)
    if mine is None:
        return [f"no counters from {rank}"]
    c = mine["ops"].get(op, {})
    st = mine["status"].get(op, {})
    if not c.get("checks_failed", 0):
        problems.append(f"{rank} {op}: no failed self-check counted")
    if st.get("state") != "disabled" or "self-check mismatch" not in str(st.get("reason", "")):
        problems.append(f"{rank} {op}: state {st.get('state')!r} ({st.get('reason', '')!r}), want disabled by a "
                        "self-check mismatch")
    for r in sorted(set(ranks) - {rank}):
        oc = ranks[r]["ops"].get(op, {})
        if oc.get("disabled", 0) or not oc.get("calls", 0):
            problems.append(f"{r} {op}: disabled={oc.get('disabled', 0)} calls={oc.get('calls', 0)}; the drill "
                            f"must touch {rank} only")
    return problems


def parity(ref: List[List[int]], got: List[List[int]]) -> List[str]:
    out = []
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"request {i}: tokens differ from position {first} ({len(a)} vs {len(b)} tokens)")
    if len(ref) != len(got):
        out.append(f"{len(ref)} reference requests, {len(got)} answered")
    return out


def run_arm(arm: str, ops: str, model: str, tp: int, port: int, out: Path, prompts, w: Workload, env: dict,
            startup_timeout: float, profile_steps: int = 0, into: Optional[Dict[str, dict]] = None) -> dict:
    """One server's run; `into[arm]` holds what is known so far (a run cut off while the server stops
    keeps its tokens and counters)."""
    cdir = fresh_counter_dir(out / f"counters-{arm}")
    args = server_args(model, "dummy", port, 16384, 0.85, 8, ["--tp-size", str(tp), "--disable-prefill-cuda-graph"])
    cmd = launcher_cmd(sys.executable, ops, cdir, args, "first")
    _say(f"arm {arm}: {' '.join(cmd)}")
    s = Server(arm, cmd, port, out / f"server-{arm}.log", env, cdir)
    res: dict = {"arm": arm, "ops": ops, "drill": env.get("ASTRA_SGLANG_FAULT_DRILL", "")}
    if into is not None:
        into[arm] = res
    try:
        try:
            wait_ready("127.0.0.1", port, startup_timeout, s.alive)
        except RuntimeError as e:
            res["error"] = f"{e}\n{s.tail()}"
            return res
        res["startup_s"] = round(time.monotonic() - s.t0, 1)
        _say(f"arm {arm} ready after {res['startup_s']:.0f}s")
        prof = None
        if profile_steps:
            prof = subprocess.Popen([sys.executable, "-m", "astra_sglang.cli", "profile", "--url",
                                     f"http://127.0.0.1:{port}", "--model-path", model, "--tp", str(tp),
                                     "--steps", str(profile_steps), "--out", str(out / f"profile-{arm}"),
                                     "--startup-timeout", "120"],
                                    stdout=open(out / f"profile-{arm}.log", "w"), stderr=subprocess.STDOUT)
            time.sleep(3)       # the profiler starts before the traffic it records
        run = run_workload("127.0.0.1", port, w, prompts, arm, 0)
        res["tokens"] = [r.output_ids for r in run.results]
        res["request_errors"] = [r.error for r in run.results if r.error]
        if prof is not None:
            # keep traffic flowing until the profiler has its steps
            stop = threading.Event()

            def more():
                while not stop.is_set():
                    run_workload("127.0.0.1", port, w, prompts[:2], arm, 1)
            t = threading.Thread(target=more, daemon=True)
            t.start()
            try:
                res["profile_rc"] = prof.wait(180)
            except subprocess.TimeoutExpired:
                prof.kill()
                res["profile_rc"] = "timeout"
            stop.set()
            t.join(120)
        res["alive_after"] = s.alive()
        res["ranks"] = read_ranks(cdir)      # while alive: the process titles name the ranks
    finally:
        (out / f"counters-{arm}.json").write_text(json.dumps(res.get("ranks", {}), indent=1))
        res["exit_code"] = s.stop()
    return res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m astra_sglang.e2e.tp_drill", description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", default="llama3-70b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--ops", default="all")
    ap.add_argument("--drill-op", default="fused_add_rmsnorm")
    ap.add_argument("--out", type=Path, default=Path("tp-drill-out"))
    ap.add_argument("--port", type=int, default=30400)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--startup-timeout", type=float, default=400)
    ap.add_argument("--arms", default="A,B,C", help="which of A (unpatched), B (patched), C (drill) to run")
    a = ap.parse_args(argv)
    from astra_sglang.errors import AstraError
    from astra_sglang.patch.config import ENV_FAULT_DRILL

    from .model_configs import resolve_model_path

    if a.tp < 2:
        raise AstraError("--tp must be >= 2 (the drill is about several ranks)")
    model = str(resolve_model_path(a.model_path))
    vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    w = Workload("tp-drill", a.prompts, a.input_len, a.output_len, a.prompts)
    prompts = make_prompts(w, vocab)
    base_env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
    base_env.pop(ENV_FAULT_DRILL, None)
    drill_rank = f"TP{a.tp - 1}"
    arms = {"A": ("none", {}), "B": (a.ops, {}), "C": (a.ops, {ENV_FAULT_DRILL: f"{a.drill_op}@{drill_rank}"})}
    meta = {"date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "model": a.model_path, "tp": a.tp,
            "command": " ".join(["python -m astra_sglang.e2e.tp_drill", *(argv if argv is not None else sys.argv[1:])]),
            "workload": w.describe()}
    results: Dict[str, dict] = {}
    checks: Dict[str, List[str]] = {}
    def save() -> Dict[str, List[str]]:
        checks = judge(results, a.tp, a.drill_op, drill_rank)
        (out / "results.json").write_text(json.dumps({"meta": meta, "arms": results, "checks": checks}, indent=1,
                                                     default=str))
        (out / "report.md").write_text(report(meta, results, checks, a.drill_op, drill_rank))
        return checks

    try:
        for i, arm in enumerate(x.strip() for x in a.arms.split(",")):
            ops, env = arms[arm]
            run_arm(arm, ops, model, a.tp, a.port + 10 * i, out, prompts, w, {**base_env, **env},
                    a.startup_timeout, a.profile_steps if arm == "B" else 0, into=results)
            checks = save()           # after every arm: a run cut off later keeps what it had
    except KeyboardInterrupt:
        meta["interrupted"] = "yes (time limit): the arms below are what had run"
        checks = save()
    print((out / "report.md").read_text())
    return 0 if results and not any(checks.values()) else 1


def judge(results: Dict[str, dict], tp: int, drill_op: str, drill_rank: str) -> Dict[str, List[str]]:
    """arm -> what failed (empty: passed)."""
    checks: Dict[str, List[str]] = {}
    for arm, r in results.items():
        p = [f"server: {r['error'].splitlines()[0]}"] if r.get("error") else []
        p += [f"request failed: {e}" for e in r.get("request_errors", [])]
        if "tokens" in r and not r.get("alive_after", False):
            p.append("the server died during the run")
        # greedy parity against the unpatched arm; without one (--arms B,C), the drill against plain patched
        ref = "A" if "A" in results else ("B" if arm == "C" else None)
        if ref and arm != ref and "tokens" in results[ref] and "tokens" in r:
            p += parity(results[ref]["tokens"], r["tokens"])
        if arm == "B" and "ranks" in r:
            p += check_every_rank(r["ranks"], tp)
        if arm == "C" and "ranks" in r:
            p += check_drill(r["ranks"], drill_op, drill_rank, tp)
        checks[arm] = p
    return checks


def report(meta: dict, results: Dict[str, dict], checks: Dict[str, List[str]], drill_op: str, drill_rank: str) -> str:
    lines = ["# Tensor-parallel drill", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [""]
    what = {"A": "unpatched", "B": "patched", "C": f"patched, {drill_op} self-check forced to fail in {drill_rank}"}
    lines += ["| arm | what | start-up (s) | requests | greedy tokens = A | checks |", "|---|---|---:|---:|---|---|"]
    for arm, r in results.items():
        same = "—" if arm == "A" else ("yes" if not any("tokens differ" in c or "answered" in c
                                                       for c in checks.get(arm, [])) and "tokens" in r else "NO")
        lines.append(f"| {arm} | {what[arm]} | {r.get('startup_s', '—')} | {len(r.get('tokens', []))} | {same} | "
                     f"{'pass' if not checks.get(arm) else '; '.join(checks[arm])} |")
    for arm, r in results.items():
        if not r.get("ranks"):
            continue
        lines += ["", f"## Counters of arm {arm}, per rank (read while the server ran)", "",
                  "| rank | pids | op | calls | captured | checks passed | checks failed | fallbacks | state |",
                  "|---|---|---|---:|---:|---:|---:|---:|---|"]
        for rank, d in sorted(r["ranks"].items()):
            for op, c in sorted(d["ops"].items()):
                if not any(c.values()):
                    continue
                st = d["status"].get(op, {})
                state = str(st.get("state", "")) + (f" ({st['reason'][:80]})" if st.get("reason") else "")
                lines.append(f"| {rank} | {','.join(map(str, d['pids']))} | {op} | {c.get('calls', 0)} | "
                             f"{c.get('captured', 0)} | {c.get('checks_passed', 0)} | {c.get('checks_failed', 0)} | "
                             f"{c.get('fallbacks', 0)} | {state} |")
    if "B" in results and "profile_rc" in results["B"]:
        lines += ["", f"Profile of arm B during its traffic (per rank): profile-B/profile.md "
                  f"(exit {results['B']['profile_rc']})"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - one line for the user
        from astra_sglang.errors import AstraError

        if isinstance(e, AstraError):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
