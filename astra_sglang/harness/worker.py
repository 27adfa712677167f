"""Run GPU work in a child process with a timeout, so a bad kernel can never take the caller down.

Parent side: `run_worker(job, ...)` writes the job as JSON, starts the child in its own
process group, reads its event lines and enforces two limits: `timeout`, the longest
the child may go without reporting progress (a hung kernel stops the progress), and
`total_timeout`, the whole run. A child that exceeds either is killed (the whole group);
one that dies on a signal or exits without a result is reported with the signal, the
stage it was in and the tail of its stderr (where CUDA's error text lands). The result
is always a `WorkerResult`, never an exception.

Child side: `python -m astra_sglang.harness.worker JOB.json` runs `job["mode"]` (check, bench,
profile) and reports through `emit()`: one line per event on stdout, prefixed with
`@@astra ` so that anything a kernel prints is not mistaken for an event.

Any argv can stand in for the child (`argv=[...]`): the tests use small CPU programs that
hang, crash or print events, and `--sanitize` puts compute-sanitizer in front.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

PREFIX = "@@astra "
EXIT_FAILED = 3  # the child ran, handled a failure, and reported it


@dataclass
class WorkerResult:
    status: str  # "ok" | "failed" (child reported a failure) | "timeout" | "crashed" | "error"
    reason: str  # one line; "" when ok
    payload: Optional[Dict[str, Any]]  # the child's final "result" event, if any
    events: List[Dict[str, Any]] = field(default_factory=list)
    rc: Optional[int] = None
    stderr_tail: str = ""
    stdout_tail: str = ""
    seconds: float = 0.0
    stage: str = ""  # the last stage the child announced

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _signal_name(rc: int) -> str:
    try:
        name = signal.Signals(-rc).name
    except (ValueError, AttributeError):
        return f"signal {-rc}"
    desc = {
        "SIGSEGV": "segmentation fault",
        "SIGABRT": "abort",
        "SIGBUS": "bus error",
        "SIGFPE": "floating-point exception",
        "SIGILL": "illegal instruction",
        "SIGKILL": "killed (out of memory?)",
    }.get(name)
    return f"{name} ({desc})" if desc else name


# Lines of a child's stderr that explain a failure better than an exit code.
_ERR_MARKERS = (
    "CUDA error", "cudaError", "illegal memory access", "illegal address", "misaligned address",
    "unspecified launch failure", "device-side assert", "out of memory", "Segmentation fault",
    "Error", "error:", "========= ",
)


def explain(stderr: str, limit: int = 300) -> str:
    """The most telling line of a child's stderr (CUDA's error text, a Python error, a sanitizer report)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for marker in _ERR_MARKERS:
        for ln in reversed(lines):
            if marker in ln:
                return ln[:limit]
    return lines[-1][:limit] if lines else ""


def default_argv() -> List[str]:
    return [sys.executable, "-m", "astra_sglang.harness.worker"]


def run_worker(
    job: Dict[str, Any],
    *,
    argv: Optional[Sequence[str]] = None,
    timeout: float = 60.0,
    total_timeout: float = 3600.0,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[Path] = None,
    progress: Optional[Callable[[str], None]] = None,
    on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> WorkerResult:
    """Run `job` in a child process; never raises for anything the child does. `on_event` sees every event as it
    arrives (bench writes its rows so far with it: a run killed from outside keeps them)."""
    t0 = time.monotonic()
    fd, job_path = tempfile.mkstemp(prefix="astra-job-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(job, f)
    err_file = tempfile.TemporaryFile(mode="w+b")
    cmd = list(argv or default_argv()) + [job_path]
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    # the child must import this package even when the caller runs from a source tree
    pkg_root = str(Path(__file__).absolute().parent.parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    events: List[Dict[str, Any]] = []
    payload: Optional[Dict[str, Any]] = None
    stage = ""
    noise: List[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, stdin=subprocess.DEVNULL,
                                env=child_env, cwd=str(cwd) if cwd else None, start_new_session=True)
    except OSError as e:
        os.unlink(job_path)
        return WorkerResult("error", f"cannot start the worker ({cmd[0]}): {e}", None, seconds=time.monotonic() - t0)

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    last = time.monotonic()
    killed: Optional[str] = None
    eof = False
    try:
        while not eof:
            now = time.monotonic()
            wait = min(last + timeout - now, t0 + total_timeout - now)
            if wait <= 0:
                killed = (f"no progress for {timeout:.0f}s (hang?)" if last + timeout <= now
                          else f"exceeded the total time limit of {total_timeout:.0f}s")
                break
            ready = sel.select(timeout=min(wait, 1.0))
            if not ready:
                if proc.poll() is not None:
                    # the child is gone but a grandchild may hold the pipe open; drain what is there
                    try:
                        chunk = os.read(proc.stdout.fileno(), 1 << 16)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        break
                    buf += chunk
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                eof = True
            buf += chunk
            while b"\n" in buf or (eof and buf):
                if b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                else:
                    line, buf = buf, b""
                text = line.decode(errors="replace")
                if text.startswith(PREFIX):
                    try:
                        ev = json.loads(text[len(PREFIX):])
                    except json.JSONDecodeError:
                        noise.append(text)
                        continue
                    last = time.monotonic()
                    events.append(ev)
                    if on_event:
                        on_event(ev)
                    kind = ev.get("event")
                    if kind == "result":
                        payload = ev
                    elif kind == "stage":
                        stage = ev.get("msg", stage)
                        if progress:
                            progress(stage)
                    elif kind == "progress" and progress:
                        progress(ev.get("msg", ""))
                    elif kind == "heartbeat":
                        pass
                else:
                    noise.append(text)
                    noise = noise[-50:]
    finally:
        sel.close()
        if killed:
            _kill_group(proc)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = proc.wait()
        if proc.stdout:
            proc.stdout.close()
        err_file.seek(0)
        stderr = err_file.read().decode(errors="replace")
        err_file.close()
        try:
            os.unlink(job_path)
        except OSError:
            pass
    _kill_group(proc)  # whatever the child left running in its group
    dt = time.monotonic() - t0
    tail = stderr[-4000:]
    out_tail = "\n".join(noise)[-2000:]
    where = f" during {stage}" if stage else ""
    if killed:
        return WorkerResult("timeout", f"timed out: {killed}{where}", payload, events, rc, tail, out_tail, dt, stage)
    if payload is not None:
        ok = bool(payload.get("ok", False))
        reason = "" if ok else str(payload.get("reason") or "worker reported a failure")
        return WorkerResult("ok" if ok else "failed", reason, payload, events, rc, tail, out_tail, dt, stage)
    if rc is not None and rc < 0:
        why = explain(stderr)
        return WorkerResult("crashed", f"worker crashed: {_signal_name(rc)}{where}" + (f": {why}" if why else ""),
                            None, events, rc, tail, out_tail, dt, stage)
    why = explain(stderr) or "no result reported"
    return WorkerResult("crashed", f"worker exited with code {rc}{where}: {why}", None, events, rc, tail, out_tail, dt, stage)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group (it was started in a new session, so the group is ours alone)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


# ----------------------------------------------------------------------------------------
# child side


def emit(event: str, **fields: Any) -> None:
    """Report one event to the parent (stage, progress, heartbeat, result)."""
    line = PREFIX + json.dumps({"event": event, **fields}, default=_json_default)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    return str(o)


MODES = {
    "check": "astra_sglang.harness.checkjob:run_check_job",
    "bench": "astra_sglang.harness.bench:run_bench_job",
    "profile": "astra_sglang.harness.ncu:run_profile_job",
}


def child_main(job_path: str) -> int:
    import importlib
    import traceback

    job = json.loads(Path(job_path).read_text())
    mode = job.get("mode")
    if mode not in MODES:
        emit("result", ok=False, reason=f"unknown worker mode {mode!r}")
        return EXIT_FAILED
    mod, fn = MODES[mode].split(":")
    try:
        result = getattr(importlib.import_module(mod), fn)(job)
    except BaseException as e:  # report, never let a traceback be the only trace
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        emit("result", ok=False, reason=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
             error_kind="exception")
        return EXIT_FAILED
    emit("result", **result)
    return 0 if result.get("ok") else EXIT_FAILED


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m astra_sglang.harness.worker JOB.json\n")
        sys.exit(2)
    rc = child_main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: after a sticky CUDA error, CUDA's own atexit can hang or crash
    os._exit(rc)
