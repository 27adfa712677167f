"""Worker isolation with CPU stand-in processes: hangs, crashes, garbage, limits — never a crash of the caller."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from astra_sglang.harness.worker import PREFIX, explain, run_worker


def py(code: str):
    """argv for a stand-in child: `python -c code JOBFILE` (the job file lands in sys.argv[1])."""
    return [sys.executable, "-c", code]


EMIT = "import json,sys\ndef emit(**k): print('" + PREFIX + "' + json.dumps(k), flush=True)\n"


def test_ok_result_and_events():
    code = EMIT + (
        "job=json.load(open(sys.argv[1]))\n"
        "emit(event='stage', msg='working')\n"
        "print('kernel printf noise', flush=True)\n"
        "emit(event='case', n=job['x'])\n"
        "emit(event='result', ok=True, value=job['x'] * 2)\n")
    seen = []
    r = run_worker({"x": 21}, argv=py(code), timeout=20, progress=seen.append)
    assert r.ok and r.status == "ok" and r.reason == ""
    assert r.payload["value"] == 42
    assert [e["event"] for e in r.events] == ["stage", "case", "result"]
    assert seen == ["working"] and r.stage == "working"
    assert "kernel printf noise" in r.stdout_tail


def test_reported_failure():
    code = EMIT + "emit(event='result', ok=False, reason='out: error 1 > tolerance')\nsys.exit(3)\n"
    r = run_worker({}, argv=py(code), timeout=20)
    assert not r.ok and r.status == "failed" and r.reason == "out: error 1 > tolerance" and r.rc == 3


def test_hang_is_killed_after_the_progress_timeout():
    code = EMIT + "emit(event='stage', msg='candidate on 1x4096 fp16')\nimport time\ntime.sleep(600)\n"
    t0 = time.monotonic()
    r = run_worker({}, argv=py(code), timeout=2, total_timeout=60)
    assert time.monotonic() - t0 < 20
    assert r.status == "timeout" and not r.ok
    assert "no progress for 2s" in r.reason and "during candidate on 1x4096 fp16" in r.reason


def test_progress_resets_the_hang_timer_but_not_the_total_limit():
    code = EMIT + "import time\nfor i in range(100):\n    emit(event='heartbeat')\n    time.sleep(0.3)\n"
    r = run_worker({}, argv=py(code), timeout=2, total_timeout=3)
    assert r.status == "timeout" and "total time limit of 3s" in r.reason


def test_hang_with_grandchild_kills_the_whole_group():
    code = ("import subprocess,sys,time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "open(sys.argv[1] + '.pid', 'w').write(str(p.pid))\n"
            "time.sleep(600)\n")
    r = run_worker({}, argv=py(code), timeout=2)
    assert r.status == "timeout"
    # the job file is gone; the grandchild's pid file sits beside where it was
    pid_files = list(Path(tempfile.gettempdir()).glob("astra-job-*.json.pid"))
    for pf in pid_files:
        pid = int(pf.read_text())
        pf.unlink()
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"grandchild {pid} survived")


def test_segfault_is_a_crash_with_signal_and_stage():
    code = EMIT + ("emit(event='stage', msg='candidate on 3x64 fp16 normal')\n"
                   "import ctypes\nctypes.string_at(0)\n")
    r = run_worker({}, argv=py(code), timeout=20)
    assert r.status == "crashed" and not r.ok
    assert "SIGSEGV" in r.reason and "during candidate on 3x64 fp16 normal" in r.reason


def test_abort_and_kill_signals():
    r = run_worker({}, argv=py("import os; os.abort()"), timeout=20)
    assert r.status == "crashed" and "SIGABRT" in r.reason
    r = run_worker({}, argv=py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), timeout=20)
    assert r.status == "crashed" and "SIGKILL" in r.reason


def test_exit_without_result_explains_from_stderr():
    code = ("import sys\nsys.stderr.write('noise\\nRuntimeError: CUDA error: an illegal memory access was encountered\\n"
            "more noise\\n')\nsys.exit(1)\n")
    r = run_worker({}, argv=py(code), timeout=20)
    assert r.status == "crashed" and "code 1" in r.reason
    assert "illegal memory access" in r.reason


def test_garbage_event_lines_are_ignored():
    code = ("print('" + PREFIX + "{not json', flush=True)\n"
            "print('" + PREFIX + "{\"event\": \"result\", \"ok\": true}', flush=True)\n")
    r = run_worker({}, argv=py(code), timeout=20)
    assert r.ok


def test_missing_executable_is_an_error_not_an_exception():
    r = run_worker({}, argv=["/nonexistent/astra-worker"], timeout=5)
    assert r.status == "error" and "cannot start the worker" in r.reason


def test_real_worker_unknown_mode_and_exception():
    r = run_worker({"mode": "nope"}, timeout=60)
    assert r.status == "failed" and "unknown worker mode" in r.reason
    r = run_worker({"mode": "check", "op": "no_such_op"}, timeout=60)
    assert r.status == "failed" and "unknown op" in r.reason


def test_explain_prefers_cuda_errors():
    err = "Traceback...\n  File x\nRuntimeError: CUDA error: an illegal memory access was encountered\nwhatever\n"
    assert "illegal memory access" in explain(err)
    assert explain("") == ""


def test_on_event_sees_rows_as_they_arrive_even_when_the_run_is_killed():
    """bench writes its rows so far from on_event: a row emitted before a hang reaches the caller before the kill."""
    code = EMIT + (
        "emit(event='row', row={'shape': '1x8'})\n"
        "emit(event='row', row={'shape': '2x8'})\n"
        "import time; time.sleep(60)\n")
    seen = []
    t0 = time.monotonic()
    r = run_worker({}, argv=py(code), timeout=2, total_timeout=60,
                   on_event=lambda ev: seen.append((ev["row"]["shape"], time.monotonic() - t0)))
    assert r.status == "timeout" and not r.ok
    assert [s for s, _ in seen] == ["1x8", "2x8"]
    assert all(t < 2 for _, t in seen)  # delivered on arrival, not after the hang timer ran out
