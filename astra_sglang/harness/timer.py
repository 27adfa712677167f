"""The timer: CUDA graphs of back-to-back calls over rotating input sets, replayed interleaved and
timed with CUDA events; the copy ceiling (an SM copy kernel), the graph launch floor (an empty
kernel) and the in-context floor (a kernel that only waits for its producer and reads one byte of its output),
measured with the same machinery. Planning functions are pure (no torch)."""
from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..build.cache import cache_root
from ..errors import AstraError
from ..files import write_whole
from .stats import median, spread

DEFAULT_REPLAYS = 30
WARMUP_REPLAYS = 3
TARGET_REPLAY_US = 2000.0  # aim for replays of about 2 ms: far above event resolution
MAX_CALLS = 4096  # kernel nodes per graph
L2_FACTOR = 4.0  # rotating sets total more than this many L2s
MEM_CAP_BYTES = 24 << 30  # input sets for one shape never take more than this
# At most this many rotating input sets (and so calls per graph): every set is made, restored (in-place
# ops) and re-checked one by one in Python, and each is one call (graph node(s)) in every timed graph. A
# tiny set (moe_align at batch 1: 1.1 KB, 228k sets for 4x a 60 MiB L2) would otherwise take minutes in
# one stage, which the worker's no-progress watchdog reports as a hang. 16384 leaves every op whose sets
# are >= 16 KB (4x 60 MiB / 16384) as it was; smaller sets are timed less L2-cold, and the row says so. Sets so
# small that 16384 of them fit in L2 (< ~3.8 KB: routers, moe_align, one-token combines) rotate MAX_CALLS
# instead: L2-resident either way, and a quarter of the set-up (moe_align's rows took ~25 s, H200 2026-11-27).
MAX_SETS = 16384
CEILING_BYTES = 1 << 30  # bytes per copy when measuring the ceiling

HELPERS_CU = r"""
// astra-sglang bench helpers: an SM copy kernel (the bandwidth ceiling), an SM read kernel (the ceiling of a pure
// read stream, e.g. a decode GEMV's weights), an empty kernel (the graph launch floor) and a touch kernel (the
// in-context floor). Built once per GPU arch into the cache.
#include <cuda_runtime.h>
#include <cstdint>

__global__ void __launch_bounds__(256) astra_copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, int64_t n) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * 4 + threadIdx.x;
  int4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
    if (i < n) v[k] = src[i];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
    if (i < n) dst[i] = v[k];
  }
}

// every 16-byte vector read once and folded into a value that is stored only if it matches a pattern random data
// never makes: no load can be dropped, and nothing is written
__global__ void __launch_bounds__(256) astra_read_kernel(const int4* __restrict__ src, int* __restrict__ sink, int64_t n) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * 4 + threadIdx.x;
  int4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
    v[k] = i < n ? src[i] : make_int4(0, 0, 0, 0);
  }
  int acc = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  if (acc == 0x13572468) sink[0] = acc;
}

__global__ void astra_empty_kernel() {}

// The least any kernel placed after a producer can do: it releases its dependents, waits for the producer, then
// reads one byte of the producer's output and stores it to a scratch byte. It is timed twice, PDL-launched (so it
// may start as early as a candidate that uses PDL) and launched plainly (behind a producer that never releases its
// dependents early, a cuBLAS nvjet GEMM or a Triton kernel, a plain launch costs 0.3-0.5 us less than a PDL one,
// H200 2026-11-28); the lower of the two bounds every kernel's marginal time there from below. The griddepcontrol
// instructions are no-ops in a plain launch.
__global__ void astra_touch_kernel(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (threadIdx.x == 0) dst[0] = src[0];
}

extern "C" cudaError_t astra_copy(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  if (n <= 0) return cudaSuccess;
  const int64_t per_block = 256 * 4;
  const unsigned blocks = static_cast<unsigned>((n + per_block - 1) / per_block);
  astra_copy_kernel<<<blocks, 256, 0, stream>>>(static_cast<const int4*>(src), static_cast<int4*>(dst), n);
  return cudaGetLastError();
}

extern "C" cudaError_t astra_read(const void* src, void* sink, int64_t bytes, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  if (n <= 0) return cudaSuccess;
  const int64_t per_block = 256 * 4;
  const unsigned blocks = static_cast<unsigned>((n + per_block - 1) / per_block);
  astra_read_kernel<<<blocks, 256, 0, stream>>>(static_cast<const int4*>(src), static_cast<int*>(sink), n);
  return cudaGetLastError();
}

extern "C" cudaError_t astra_empty(cudaStream_t stream) {
  astra_empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

extern "C" cudaError_t astra_touch(const void* src, void* dst, int pdl, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, astra_touch_kernel, static_cast<const unsigned char*>(src),
                            static_cast<unsigned char*>(dst));
}
"""
HELPERS_VERSION = "4"


# ------------------------------------------------------------------------------------------
# planning (pure)


def plan_sets(set_bytes: int, l2_bytes: int, l2: str = "cold", mem_cap: int = MEM_CAP_BYTES,
              max_sets: int = MAX_SETS) -> Tuple[int, str]:
    """How many rotating input sets: enough to exceed L2_FACTOR × L2 (at least 2), within mem_cap and
    max_sets.

    Returns (n_sets, note) where note says when the memory cap or the set cap kept the rotation short."""
    if l2 == "warm":
        return 1, ""
    if set_bytes <= 0:
        return 2, ""
    need = max(2, math.ceil(L2_FACTOR * l2_bytes / set_bytes))
    cap = max(1, mem_cap // set_bytes)
    if need > cap and cap <= max_sets:
        n = max(1, cap)
        return n, (f"only {n} input sets fit in {mem_cap >> 30} GiB ({n * set_bytes / max(l2_bytes, 1):.1f}× L2)")
    if need > max_sets:
        n = max(2, max_sets)
        if n * set_bytes < l2_bytes:
            # even the capped rotation sits in L2: more sets buy no coldness, only minutes of set-up, re-check and
            # graph nodes (one call per set per graph), so rotate about a graph's worth of calls
            n = max(2, min(n, MAX_CALLS))
        return n, (f"input sets capped at {n} ({set_bytes} B each: {n * set_bytes / max(l2_bytes, 1):.2f}× L2, "
                   "not L2-cold)")
    return need, ""


def plan_calls(est_us: float, n_sets: int, target_us: float = TARGET_REPLAY_US, max_calls: int = MAX_CALLS) -> int:
    """Calls per graph replay: about target_us of work, every set used equally often, at least one pass."""
    est_us = max(est_us, 0.5)
    n = max(n_sets, int(math.ceil(target_us / est_us)))
    per = int(math.ceil(n / n_sets))
    n = per * n_sets
    if n > max_calls:
        n = max(n_sets, (max_calls // n_sets) * n_sets)
    return n


def ceiling_key(name: str, uuid: str, extra: str = "") -> str:
    return f"{name}|{uuid}|{extra}"


def load_cached_ceiling(path: Path, key: str) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    v = data.get(key)
    # a ceiling cached before the read ceiling existed is measured again
    return v if isinstance(v, dict) and v.get("gbps") and v.get("read_gbps") else None


def store_ceiling(path: Path, key: str, value: Dict[str, Any]) -> None:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = value
    write_whole(path, json.dumps(data, indent=1) + "\n")


# ------------------------------------------------------------------------------------------
# worker side (torch + CUDA)


class Helpers:
    def __init__(self, lib_path: str):
        import ctypes

        self.lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_LOCAL)
        self.lib.astra_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        self.lib.astra_copy.restype = ctypes.c_int
        self.lib.astra_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        self.lib.astra_read.restype = ctypes.c_int
        self.lib.astra_empty.argtypes = [ctypes.c_void_p]
        self.lib.astra_empty.restype = ctypes.c_int
        self.lib.astra_touch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.lib.astra_touch.restype = ctypes.c_int

    @staticmethod
    def _stream():
        import torch

        return torch.cuda.current_stream().cuda_stream

    def copy(self, dst, src, nbytes: int) -> int:
        import ctypes

        return self.lib.astra_copy(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), nbytes,
                                   ctypes.c_void_p(self._stream()))

    def read(self, src, sink, nbytes: int) -> int:
        import ctypes

        return self.lib.astra_read(ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(sink.data_ptr()), nbytes,
                                   ctypes.c_void_p(self._stream()))

    def empty(self) -> int:
        import ctypes

        return self.lib.astra_empty(ctypes.c_void_p(self._stream()))

    def touch(self, src, dst, pdl: bool = True) -> int:
        import ctypes

        return self.lib.astra_touch(ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(dst.data_ptr()), int(pdl),
                                    ctypes.c_void_p(self._stream()))


def graph_of(fn: Callable[[int], None], n: int, warm: int = 1):
    """Capture fn(0..n-1) into a CUDA graph, after an eager warm-up of fn(0..warm-1) outside capture. `warm`: the
    calls that differ (one per input set): a torch.compile'd callable (an installed SGLang op) recompiles on a set
    its guards have not seen, and a compile inside capture breaks it (moe_combine's compiled sum, H200, 2026-11-29)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(max(1, min(warm, n))):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    torch.cuda.synchronize()
    return g


def time_graphs(graphs: Sequence[Any], replays: int, before: Optional[Callable[[int], None]] = None,
                 warmup: int = WARMUP_REPLAYS) -> List[List[float]]:
    """Replay the graphs interleaved (rotating the order every round); ms per replay for each."""
    import torch

    k = len(graphs)
    for _ in range(warmup):
        for j, g in enumerate(graphs):
            if before:
                before(j)
            g.replay()
    torch.cuda.synchronize()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
              for _ in range(k)]
    for r in range(replays):
        order = list(range(k))
        if r % 2:
            order.reverse()
        for j in order:
            if before:
                before(j)
            a, b = events[j][r]
            a.record()
            graphs[j].replay()
            b.record()
    torch.cuda.synchronize()
    return [[a.elapsed_time(b) for a, b in events[j]] for j in range(k)]


def measure_ceiling(helpers: Helpers, nbytes: int = CEILING_BYTES, calls: int = 10, replays: int = 10) -> Dict[str, Any]:
    """SM copy-kernel bandwidth (bytes read + written per second), GB/s, and beside it (read_gbps) the SM read
    kernel's over the same buffer: a pure read stream goes faster than a 1:1 copy (H200: 4575 GB/s of decode-GEMV
    weights against a 4095 GB/s copy, 2026-11-26), so read-only kernels are judged against that one."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    nbytes = int(min(nbytes, free // 4)) // 4096 * 4096
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)

    def call(i: int) -> None:
        rc = helpers.copy(dst, src, nbytes)
        if rc:
            raise RuntimeError(f"copy kernel failed: cudaError {rc}")

    g = graph_of(call, calls)
    ms = time_graphs([g], replays)[0]
    if not torch.equal(src[:4096], dst[:4096]) or not torch.equal(src[-4096:], dst[-4096:]):
        raise RuntimeError("the copy kernel did not copy")
    per_call_s = median(ms) / 1e3 / calls
    dst = g = None   # freed (not del'd: the timed closure names dst)
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")

    def read(i: int) -> None:
        rc = helpers.read(src, sink, nbytes)
        if rc:
            raise RuntimeError(f"read kernel failed: cudaError {rc}")

    g = graph_of(read, calls)
    rms = time_graphs([g], replays)[0]
    read_s = median(rms) / 1e3 / calls
    src = sink = g = None
    torch.cuda.empty_cache()
    return {"gbps": 2 * nbytes / per_call_s / 1e9, "bytes": nbytes, "spread": max(spread(ms), spread(rms)),
            "read_gbps": nbytes / read_s / 1e9,
            "measured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def measure_launch_floor(helpers: Helpers, calls: int = 1000, replays: int = 10, with_spread: bool = False):
    """Per-call time of an empty kernel in a graph of back-to-back calls, µs (and its spread)."""
    def call(i: int) -> None:
        rc = helpers.empty()
        if rc:
            raise RuntimeError(f"empty kernel failed: cudaError {rc}")

    g = graph_of(call, calls)
    ms = time_graphs([g], replays)[0]
    us = median(ms) * 1e3 / calls
    return (us, spread(ms)) if with_spread else us



def build_helpers(arch_text: str) -> Path:
    """Build (once per arch, cached) the copy/empty helper kernels."""
    from ..build import build_shared, first_error_line, parse_arch

    arch = parse_arch(arch_text)
    d = cache_root() / "helpers"
    d.mkdir(parents=True, exist_ok=True)
    src = d / "astra_bench_helpers.cu"
    if not src.exists() or src.read_text() != HELPERS_CU:
        src.write_text(HELPERS_CU)
    flags = [arch.gencode("sglang_jit"), "-O3", "-std=c++17", "-Xcompiler", "-fPIC"]
    res = build_shared(src, [], flags, d / "build", f"helpers-v{HELPERS_VERSION}")
    if not res.ok:
        raise AstraError(f"the bench helper kernels do not compile: {first_error_line(res.log)}")
    return res.library


# ------------------------------------------------------------------------------------------
# in context: the op between the neighbours it has in a model's graph

CONTEXT_K = 4096  # the producer GEMM's inner size and the consumer's default output width (a model's hidden size)
CONTEXT_TARGET_US = 1000.0
CONTEXT_MAX_CALLS = 256


class Neighbours:
    """A producer GEMM writing the op's first input and a consumer GEMM reading its first output, both
    `F.linear` with [out, in] weights as SGLang's linear layers call cuBLAS (the same TN kernels): what
    sits around a memory-bound op in a decode step (o_proj -> fused_add_rmsnorm -> qkv_proj or gate_up,
    gate_up -> silu -> down). `consumer_k`: the consumer's output width (a model's next GEMM, e.g.
    2 x intermediate / TP after the post-attention norm; default the hidden size CONTEXT_K).

    A GEMM cannot write integers (moe_align's expert ids) nor read them as activations: where the op's first
    input (output) is not floating point, the producer writes (the consumer reads) a bf16 activation of the op's
    rows instead. The GEMMs then keep the stream order, the launch gaps and the L2 traffic of a model's graph
    (router GEMM -> align -> expert GEMM) but not the data dependency.

    `gemm` (neighbour_gemm.AstraLinear, bench --neighbours astra): the GEMM a patched server runs instead of cuBLAS
    where it does not decline the shape (`gemm.declines(tokens, in, out, dtype)` None); `kinds` says which ran.
    `norm` (neighbour_gemm.AstraRMSNorm; sites.Site.norm_after): astra's norm reads the op's output into a scratch
    row set and the consumer GEMM reads that, as a patched server runs a MoE combine's output through the next
    layer's norm first. With `norm_before` (sites.Site.norm_before) it runs between the producer GEMM, which then
    writes a scratch row set, and the op, writing the op's input: a Gemma layer's second norm of a pair. Both
    (`norm_before` and `norm_after`) put one on each side, each with its own weight: Qwen3's q/k norm before rope
    and the KV store after it. `norm_after` defaults to "a norm, not before"."""

    def __init__(self, spec, tensors: Dict[str, Any], k: int = CONTEXT_K, seed: int = 0,
                 consumer_k: Optional[int] = None, gemm: Any = None, norm: Any = None, norm_before: bool = False,
                 norm_after: Optional[bool] = None):
        import torch

        ins = [a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("in", "inout")]
        outs = [a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("out", "inout")]
        self.src_name, self.dst_name = ins[0], outs[0]
        src, dst = tensors[self.src_name], tensors[self.dst_name]
        rows = src.shape[0]
        act = src.dtype if src.dtype.is_floating_point else (
            dst.dtype if dst.dtype.is_floating_point else torch.bfloat16)
        self.width_in = src.numel() // rows
        self.src_scratch = None if src.dtype.is_floating_point else torch.empty(
            rows, self.width_in, device=src.device, dtype=act)
        g = torch.Generator(device=src.device).manual_seed(seed)
        if dst.dtype.is_floating_point:
            self.dst_scratch, self.width_out = None, dst.numel() // dst.shape[0]
        else:   # an activation of the op's rows, as the expert GEMM reads the hidden states after align
            self.dst_scratch, self.width_out = torch.randn(rows, k, generator=g, device=src.device, dtype=act), k
        out_dtype = dst.dtype if self.dst_scratch is None else act
        # two activations, alternated: consecutive calls get different inputs, so an op that reads its input
        # before the producer's write has landed (PDL prefetch before the wait) reads the previous values
        kc = int(consumer_k or k)
        self.a = [torch.randn(rows, k, generator=g, device=src.device, dtype=act) for _ in range(2)]
        self.b = (torch.randn(self.width_in, k, generator=g, device=src.device, dtype=torch.float32) / k ** 0.5).to(act)
        self.c = (torch.randn(kc, self.width_out, generator=g, device=src.device, dtype=torch.float32)
                  / self.width_out ** 0.5).to(out_dtype)
        y_rows = dst.shape[0] if self.dst_scratch is None else rows
        self.y = torch.empty(y_rows, kc, device=dst.device, dtype=out_dtype)
        self.gemm_bytes = (self.b.numel() * self.b.element_size() + self.c.numel() * self.c.element_size())
        self.norm, self.normed, self.pre, self.pre_w, self.post_w = None, None, None, None, None
        if norm_after is None:
            norm_after = not norm_before
        if norm is not None and norm_before:   # producer GEMM -> scratch -> norm -> the op's input
            if self.src_scratch is not None or not src.is_contiguous():
                raise ValueError("a norm before the op needs a contiguous floating-point input")
            self.pre_w = self._take_norm(norm, "before", act, self.width_in, src.device, g)
            self.pre = torch.empty(rows, self.width_in, device=src.device, dtype=act)
        if norm is not None and norm_after:   # the op's output (a float activation) -> norm -> scratch -> consumer GEMM
            if self.dst_scratch is not None:
                raise ValueError("a norm after the op needs a floating-point output")
            self.post_w = self._take_norm(norm, "after", out_dtype, self.width_out, dst.device, g)
            self.normed = torch.empty(y_rows, self.width_out, device=dst.device, dtype=out_dtype)
        takes = (lambda t, i, o, d: gemm is not None and gemm.declines(t, i, o, d) is None)
        # astra's linear takes contiguous rows only (its ABI): a strided op tensor keeps F.linear
        src_ok = self.src_scratch is not None or src.is_contiguous()
        dst_ok = self.dst_scratch is not None or dst.is_contiguous()
        self.prod_gemm = gemm if src_ok and takes(rows, k, self.width_in, act) else None
        self.cons_gemm = gemm if dst_ok and takes(y_rows, self.width_out, kc, out_dtype) else None
        # what ran as the producer / consumer, for the row: "linear" (astra's) or "cuBLAS"
        self.kinds = tuple("linear" if g is not None else "cuBLAS" for g in (self.prod_gemm, self.cons_gemm))
        if self.pre is not None:
            self.kinds = (f"{self.kinds[0]} + rmsnorm", self.kinds[1])
        if self.normed is not None:
            self.kinds = (self.kinds[0], f"rmsnorm + {self.kinds[1]}")

    def _take_norm(self, norm: Any, where: str, dtype: Any, width: int, device: Any, g: Any) -> Any:
        """The norm beside the op; returns its weight over `width` (ValueError where it declines `dtype`)."""
        import torch

        why = norm.declines(dtype) if hasattr(norm, "declines") else None
        if why:
            raise ValueError(f"the norm {where} the op: {why}")
        self.norm = norm
        return (1.0 + 0.1 * torch.randn(width, generator=g, device=device)).to(dtype)

    def produced(self, tensors: Dict[str, Any]):
        """The tensor the producer GEMM writes: the op's first input (or its bf16 stand-in)."""
        return tensors[self.src_name] if self.src_scratch is None else self.src_scratch

    def produce(self, tensors: Dict[str, Any], i: int = 0) -> None:
        import torch

        t = self.produced(tensors)
        op_in = t.view(t.shape[0], self.width_in)
        out = op_in if self.pre is None else self.pre
        if self.prod_gemm is not None:
            self.prod_gemm(self.a[i % 2], self.b, out)
        else:
            torch.nn.functional.linear(self.a[i % 2], self.b, out=out)
        if self.pre is not None:
            self.norm(self.pre, self.pre_w, op_in)

    def consume(self, tensors: Dict[str, Any]) -> None:
        import torch

        t = tensors[self.dst_name] if self.dst_scratch is None else self.dst_scratch
        x = t.view(t.shape[0], self.width_out)
        if self.normed is not None:
            self.norm(x, self.post_w, self.normed)
            x = self.normed
        if self.cons_gemm is not None:
            self.cons_gemm(x, self.c, self.y)
        else:
            torch.nn.functional.linear(x, self.c, out=self.y)


def plan_context_calls(gemm_bytes: int, op_est_us: float, gbps: float, target_us: float = CONTEXT_TARGET_US,
                       max_calls: int = CONTEXT_MAX_CALLS) -> int:
    """(producer, op, consumer) triples per graph: about target_us of work, 4 to max_calls."""
    per = op_est_us + (gemm_bytes / (gbps * 1e3) if gbps else 10.0)
    return int(max(4, min(max_calls, math.ceil(target_us / max(per, 0.5)))))
