# The sandbox runners' timer: median µs per call of fn(0..nrot-1) replayed in one CUDA graph (rotating weights, so
# every call reads its weights from HBM). Not the bench: no in-context timing, no oracle.
import torch


def timed(fn, nrot, reps=20):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            for i in range(nrot):
                fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(nrot):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / nrot)
    return sorted(ts)[len(ts) // 2]
