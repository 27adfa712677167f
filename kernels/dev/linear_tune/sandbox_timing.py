# The sandbox runners' shared pieces: one problem per shape on rotating weights (>= 600 MB, so every call reads its
# weights from HBM), and the timer: median µs per call of fn(0..nrot-1) replayed in one CUDA graph.
# Not the bench: no in-context timing, no oracle.
import torch


def rotating_problem(T, K, N):
    """(nrot, weights, x, outputs, fp32 reference of x @ weights[0]^T, cuBLAS µs per call) for T x K -> N, bf16."""
    nrot = max(4, (600 << 20) // (N * K * 2))
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(T, N, device="cuda", dtype=torch.bfloat16) for _ in range(nrot)]
    ref = torch.nn.functional.linear(x.float(), ws[0].float())
    t_cub = timed(lambda i: torch.nn.functional.linear(x, ws[i]), nrot)
    return nrot, ws, x, outs, ref, t_cub


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
