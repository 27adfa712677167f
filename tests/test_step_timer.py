"""The decode-step GPU timer of e2e/step_worker.py: its logic against a stand-in torch (CPU), and
on a real CUDA graph (gpu)."""
from __future__ import annotations

import types

import pytest

from astra_sglang.e2e.step_worker import GpuTimer


class FakeCuda:
    """Records the stream's order of work; an event's time is the clock when it is recorded."""

    def __init__(self):
        self.stream, self.clock = [], 0.0
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = cuda.clock
                cuda.stream.append("event")

            def synchronize(self):
                pass

            def elapsed_time(self, other):          # ms
                return (other.t - self.t) * 1e3

        class CUDAGraph:
            def replay(self):
                cuda.work("graph", 0.004)

        self.Event, self.CUDAGraph = Event, CUDAGraph

    def work(self, name, seconds):
        self.stream.append(name)
        self.clock += seconds

    def _sleep(self, cycles):                       # 2 GHz
        self.work("sleep", cycles / 2e9)


def _torch():
    t = types.SimpleNamespace(cuda=FakeCuda())
    return t


class Backend:
    def __init__(self, cuda):
        self.cuda, self.calls = cuda, 0

    def replay(self, key, fb):
        self.calls += 1
        self.cuda.work("graph", 0.005)
        return "logits"


def test_timer_pads_before_the_start_event_and_times_the_replay_only():
    t = _torch()
    timer = GpuTimer(t, pad_us=100)
    assert timer.pad_cycles == pytest.approx(200_000, rel=1e-6)          # calibrated: 2 GHz
    be = Backend(t.cuda)
    runner = types.SimpleNamespace(decode_cuda_graph_runner=types.SimpleNamespace(backend=be))
    assert timer.install(runner) == "Backend.replay"
    assert be.replay("k", None) == "logits"                             # not armed: pass-through, no events
    t.cuda.stream.clear()

    def step():
        t.cuda.work("prep", 0.001)                                      # host-side prep copies: not timed
        out = be.replay("k", None)
        t.cuda.work("sample", 0.0002)
        return out

    out, evs, whole = timer.step(step, whole=False)
    assert out == "logits" and not whole and len(evs) == 1 and be.calls == 2
    assert GpuTimer.seconds(evs) == pytest.approx(0.005)
    s = t.cuda.stream
    assert s[s.index("prep") + 1:s.index("graph") + 2] == ["sleep", "event", "graph", "event"]
    assert timer.cur is None


def test_timer_without_a_graph_times_the_whole_step_and_pads_when_asked():
    t = _torch()
    timer = GpuTimer(t, pad_us=0)
    assert timer.pad_cycles == 0
    timer.install(types.SimpleNamespace())                             # no graph runner: CUDAGraph hook
    assert timer.hook == "torch.cuda.CUDAGraph.replay"
    assert getattr(t.cuda.CUDAGraph.replay, "__astra_timer__", False)
    timer.install(types.SimpleNamespace())                             # not wrapped twice
    assert not getattr(t.cuda.CUDAGraph.replay.__wrapped__, "__astra_timer__", False)
    _, evs, whole = timer.step(lambda: t.cuda.work("eager", 0.003), whole=False)
    assert whole and GpuTimer.seconds(evs) == pytest.approx(0.003)
    # two replays in one step: summed
    g = t.cuda.CUDAGraph()
    _, evs, whole = timer.step(lambda: (g.replay(), g.replay()), whole=False)
    assert not whole and len(evs) == 2 and GpuTimer.seconds(evs) == pytest.approx(0.008)
    timer2 = GpuTimer(t, pad_us=50)
    t.cuda.stream.clear()
    timer2.step(lambda: t.cuda.work("eager", 0.003), whole=True)
    assert t.cuda.stream[:3] == ["sleep", "event", "eager"]


def test_tp_ranks_align_before_the_pad_of_every_timed_replay(monkeypatch):
    """At TP > 1 the aligner (an all-reduce over SGLang's TP group) runs before the pad of each timed replay and of
    a whole-step timing, never inside the timed interval; untimed replays pass through without it."""
    from astra_sglang.e2e import step_worker as sw

    t = _torch()
    reduced = []
    t.zeros = lambda n, device: ("buf", n, device)
    t.distributed = types.SimpleNamespace(
        all_reduce=lambda buf, group: (reduced.append((buf, group)), t.cuda.work("all_reduce", 0.00002)))
    monkeypatch.delenv(sw.ALIGN_ENV, raising=False)
    align, note = sw.rank_aligner(t, 2, group_of=lambda: "tp-group")
    assert callable(align) and "all-reduce" in note
    timer = GpuTimer(t, pad_us=100, align=align)
    be = Backend(t.cuda)
    timer.install(types.SimpleNamespace(decode_cuda_graph_runner=types.SimpleNamespace(backend=be)))
    be.replay("k", None)
    assert reduced == []                                               # not armed: no collective
    t.cuda.stream.clear()
    _, evs, _ = timer.step(lambda: be.replay("k", None), whole=False)
    s = t.cuda.stream  # the step's own outer events (its whole-step fallback) around the replay's
    assert s[s.index("all_reduce"):s.index("graph") + 2] == ["all_reduce", "sleep", "event", "graph", "event"]
    assert s.count("all_reduce") == 1
    assert reduced == [(("buf", 1, "cuda"), "tp-group")] and GpuTimer.seconds(evs) == pytest.approx(0.005)
    t.cuda.stream.clear()
    timer.step(lambda: t.cuda.work("eager", 0.003), whole=True)
    assert t.cuda.stream[:3] == ["all_reduce", "sleep", "event"]


@pytest.mark.parametrize("tp,env,group_of,why", [
    (1, None, lambda: "g", "TP 1"),
    (2, "0", lambda: "g", "off"),
    (2, "off", lambda: "g", "off"),
    (2, None, lambda: None, "device group is None"),
    (2, None, lambda: 1 / 0, "no TP group (ZeroDivisionError"),
])
def test_rank_aligner_is_off_at_tp_1_when_switched_off_or_without_a_group(monkeypatch, tp, env, group_of, why):
    from astra_sglang.e2e import step_worker as sw

    if env is None:
        monkeypatch.delenv(sw.ALIGN_ENV, raising=False)
    else:
        monkeypatch.setenv(sw.ALIGN_ENV, env)
    align, note = sw.rank_aligner(_torch(), tp, group_of=group_of)
    assert align is None and why in note


@pytest.mark.gpu
def test_timer_on_a_real_cuda_graph():
    import torch

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.matmul(x, x, out=y)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            torch.matmul(x, x, out=y)
    backend = types.SimpleNamespace(replay=lambda: g.replay())
    runner = types.SimpleNamespace(decode_cuda_graph_runner=types.SimpleNamespace(backend=backend))
    timer = GpuTimer(torch, pad_us=100)
    timer.install(runner)
    assert timer.pad_cycles > 10_000
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        _, evs, whole = timer.step(lambda: runner.decode_cuda_graph_runner.backend.replay(), whole=False)
        assert not whole
        times.append(evs)
    torch.cuda.synchronize()
    t = sorted(GpuTimer.seconds(e) for e in times)
    # the same graph timed from outside, back to back
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        g.replay()
    b.record()
    b.synchronize()
    ref = a.elapsed_time(b) / 20 / 1e3
    assert t[10] == pytest.approx(ref, rel=0.05)                       # the pad is outside the interval
    assert (t[15] - t[5]) / t[10] < 0.02


def test_profile_warms_each_batch_sizes_prefill_before_profiling_it(tmp_path):
    """The profiled prefill must not be the patch's first call of its shape class (that call runs the self-check,
    SGLang's kernels beside astra's): one prefill of the same size runs first, unprofiled, and its KV slots are freed."""
    import contextlib

    from astra_sglang.e2e.step_worker import Worker

    log = []

    class Runner:
        def clear(self):
            log.append("clear")

        def extend(self, reqs):
            log.append(("extend", reqs))
            return "ids", None, "batch"

        def decode(self, ids, batch):
            log.append("decode")
            return ids, None

        def cleanup(self, batch):
            log.append("cleanup")

    @contextlib.contextmanager
    def profiler(shapes):
        log.append("profile on")
        yield types.SimpleNamespace()
        log.append("profile off")

    w = Worker.__new__(Worker)
    w.runner, w.sync = Runner(), lambda: None
    w._reqs = lambda bs, n, seed: f"{bs}x{n}"
    w._profiler, w._save = profiler, staticmethod(lambda prof, path: path)
    w.profile(2, 64, steps=1, warmup=0, dir=str(tmp_path), shapes=False)
    first_profile = log.index("profile on")
    assert ("extend", "2x64") in log[:first_profile]                      # the warm prefill, same size
    warm = log.index(("extend", "2x64"))
    assert log[warm + 1:first_profile] == ["cleanup", "clear", "clear"]  # freed, then the profiled run's own clear
    assert log[first_profile + 1] == ("extend", "2x64")                 # the profiled prefill
