"""Static checks on candidate sources: each rule fires with its reason, comments and strings don't;
the shipped kernels, the extracted production launchers and the correct candidates pass; every
cheating candidate is held to the static rule its header names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from astra_sglang.static_checks import (
    RULES,
    _stream_findings,
    errors,
    scan_file,
    scan_source,
    strip_comments_and_strings,
    string_literals,
    summarize,
)

REPO = Path(__file__).resolve().parents[1]

GOOD = r'''
#include <cuda_runtime.h>
#include <cstdint>
// cudaStreamCreate in a comment is fine; so is "cudaDeviceSynchronize()" in a string
/* fopen(  system(  */
__global__ void k(float* o, const float* i, int64_t n) {
  int64_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) { o[j] = i[j]; printf("%d", 1); }
}
extern "C" cudaError_t astra_x(void* o, const void* i, int64_t n, cudaStream_t stream) {
  const char* msg = "cudaStreamCreate(&s) fopen(f)";
  (void)msg;
  k<<<(n + 255) / 256, 256, 0, stream>>>(static_cast<float*>(o), static_cast<const float*>(i), n);
  cudaMemcpyAsync(o, i, 4, cudaMemcpyDeviceToDevice, stream);
  cudaMemsetAsync(o, 0, 4, stream);
  return cudaGetLastError();
}
'''


def test_clean_source_has_no_findings():
    assert scan_source(GOOD) == []


@pytest.mark.parametrize("snippet,rule,reason", [
    ("#include <torch/extension.h>", "torch", "nvcc alone"),
    ("#include <ATen/ATen.h>", "torch", "nvcc alone"),
    ("auto t = at::empty({1});", "torch", "torch/ATen C++ API"),
    ("cudaStream_t s; cudaStreamCreate(&s);", "stream-create", "creates a CUDA stream"),
    ("cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);", "stream-create", "creates a CUDA stream"),
    ("cudaEvent_t e; cudaEventCreate(&e);", "event-create", "creates a CUDA event"),
    ("k<<<1, 1, 0, cudaStreamPerThread>>>();", "stream-other", "other than the one passed in"),
    ("cudaDeviceSynchronize();", "host-sync", "synchronizes the host"),
    ("cudaStreamSynchronize(stream);", "host-sync", "synchronizes the host"),
    ("cudaMemcpy(a, b, 4, cudaMemcpyDeviceToHost);", "host-sync", "synchronous memcpy"),
    ("cudaMemset(a, 0, 4);", "host-sync", "synchronous memcpy/memset"),
    ("cudaStreamWaitEvent(stream, e, 0);", "host-sync", "waits on an event"),
    ("cudaMalloc(&p, 16);", "alloc", "allocates or frees"),
    ("cudaFree(p);", "alloc", "allocates or frees"),
    ("cudaLaunchHostFunc(stream, f, nullptr);", "host-callback", "host callback"),
    ("cudaDeviceSetLimit(cudaLimitStackSize, 1);", "device-limit", "device limit"),
    ("cudaSetDevice(1);", "device-state", "device-wide"),
    ("cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);", "graph-capture", "capture"),
    ("FILE* f = fopen(\"x\", \"w\");", "file-io", "touch files"),
    ("std::ofstream out(\"x\");", "file-io", "file stream"),
    ("#include <fstream>", "file-io", "file-system headers"),
    ("system(\"ls\");", "process", "control processes"),
    ("pid_t p = fork();", "process", "control processes"),
    ("std::thread t(f);", "process", "host threads"),
    ("#include <unistd.h>", "process", "processes or threads"),
    ("int s = socket(AF_INET, SOCK_STREAM, 0);", "network", "network"),
    ("#include <sys/socket.h>", "network", "network"),
    ("const char* v = getenv(\"X\");", "environment", "environment"),
    ("k<<<1, 32>>>(p);", "default-stream", "default stream"),
    ("k<<<1, 32, 0>>>(p);", "default-stream", "default stream"),
    ("k<<<1, 32, 0, 0>>>(p);", "default-stream", "stream 0"),
    ("k<<<dim3(1, 2), dim3(32, 1), 0, nullptr>>>(p);", "default-stream", "stream nullptr"),
])
def test_rule_fires_with_reason(snippet, rule, reason):
    src = f"#include <cuda_runtime.h>\nvoid host(float* p, cudaStream_t stream) {{\n  {snippet}\n}}\n"
    found = [f for f in scan_source(src, "cand.cu") if f.rule == rule]
    assert found, f"{rule} not found in {snippet!r}: {scan_source(src)}"
    f = found[0]
    assert reason in f.reason
    assert f.severity == "error"
    assert f.line in (1, 3)
    assert "cand.cu" in f.one_line()


def test_launch_with_templated_config_is_fine():
    src = "void h(cudaStream_t stream){ k<T, std::max(1, 2)><<<dim3(a, b), dim3(c), smem, stream>>>(x); }"
    assert scan_source(src) == []


def test_member_calls_named_like_libc_are_not_flagged():
    src = "void h(){ obj.open(x); p->send(y); std::remove(a, b, c); }"
    assert scan_source(src) == []


def test_host_clock_rejects():
    # host calls are far apart in check and back to back when bench captures: a clock tells them apart
    fs = scan_source("void h(){ auto t = std::chrono::steady_clock::now(); }")
    assert [f.rule for f in fs] == ["host-time"] and summarize(fs)


def test_strip_keeps_lines_and_includes():
    src = '#include "a.h"\n// x\nint a = 1; /* y\n z */ const char* s = "q(";\n'
    out = strip_comments_and_strings(src)
    assert out.count("\n") == src.count("\n")
    assert '#include "a.h"' in out and "q(" not in out and "y" not in out


def test_quoted_includes_beside_the_candidate_are_scanned(tmp_path):
    (tmp_path / "helper.cuh").write_text("inline void h() { cudaDeviceSynchronize(); }\n")
    (tmp_path / "cand.cu").write_text('#include "helper.cuh"\n#include <cuda_runtime.h>\n')
    fs = scan_file(tmp_path / "cand.cu")
    assert [f.rule for f in fs] == ["host-sync"] and fs[0].file.endswith("helper.cuh")


def test_production_headers_are_not_scanned(tmp_path):
    prod = tmp_path / "src"
    prod.mkdir()
    (prod / "prod.cuh").write_text("inline void h() { cudaStreamSynchronize(0); }\n")
    (tmp_path / "cand.cu").write_text('#include "src/prod.cuh"\n')
    assert scan_file(tmp_path / "cand.cu", [prod]) == []


def test_summary_names_the_first_error_and_counts_the_rest():
    src = "void h(){\n cudaDeviceSynchronize();\n cudaMalloc(&p, 4);\n}\n"
    s = summarize(scan_source(src, "c.cu"))
    assert s.startswith("static check: c.cu:2: host-sync") and "(+1 more)" in s


def test_shipped_kernels_and_launchers_pass():
    files = sorted((REPO / "kernels").glob("*/*.cu")) + sorted((REPO / "kernels").glob("*/*.cu.in"))
    assert files
    for f in files:
        assert errors(scan_file(f)) == [], f


def test_bad_candidates_static_verdicts():
    bad = REPO / "tests" / "bad_candidates"
    flagged = {f.name for f in bad.glob("*.cu") if errors(scan_file(f))}
    assert flagged == {"silu_created_stream.cu", "silu_default_stream.cu", "cheat_capture_skip.cu",
                       "cheat_l2_persist.cu", "cheat_early_exit_time.cu"}


# ------------------------------------------------------------------ what lets a kernel learn it is timed


def _host(snippet: str) -> str:
    """The snippet inside a host function that launches on its stream (so only the snippet can offend)."""
    return ("#include <cuda_runtime.h>\n__global__ void k() {}\nvoid host(float* p, cudaStream_t stream) {\n"
            f"  {snippet}\n  k<<<1, 32, 0, stream>>>();\n}}\n")


@pytest.mark.parametrize("snippet,rule,reason", [
    # capture status and graphs
    ("cudaStreamCaptureStatus st; cudaStreamIsCapturing(stream, &st);", "capture-query", "being captured"),
    ("auto q = &::cudaStreamIsCapturing;", "capture-query", "being captured"),
    ("cudaStreamGetCaptureInfo(stream, &st, &id);", "capture-query", "being captured"),
    ("cudaStreamGetCaptureInfo_v3(stream, &st, &id, &g, &d, &e, &n);", "capture-query", "being captured"),
    ("cudaThreadExchangeStreamCaptureMode(&mode);", "capture-query", "being captured"),
    ("cuStreamIsCapturing(stream, &st);", "capture-query", "being captured"),
    ("if (st == CU_STREAM_CAPTURE_STATUS_ACTIVE) return;", "capture-query", "being captured"),
    ("cudaGraph_t g; cudaStreamEndCapture(stream, &g);", "graph-capture", "graphs/capture"),
    ("cudaGraphExecUpdate(e, g, &info);", "graph-capture", "graphs/capture"),
    ("cuGraphLaunch(g, stream);", "graph-capture", "graphs/capture"),
    # stream attributes
    ("unsigned f; cudaStreamGetFlags(stream, &f);", "stream-attribute", "attributes"),
    ("int pr; cudaStreamGetPriority(stream, &pr);", "stream-attribute", "attributes"),
    ("unsigned long long id; cudaStreamGetId(stream, &id);", "stream-attribute", "attributes"),
    ("cudaStreamGetAttribute(stream, cudaStreamAttributeSynchronizationPolicy, &v);", "stream-attribute",
     "attributes"),
    ("cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_PRIORITY, &v);", "stream-attribute", "attributes"),
    # L2 persistence
    ("cudaStreamAttrValue v; v.accessPolicyWindow.base_ptr = p;", "l2-persist", "L2 access-policy"),
    ("v.accessPolicyWindow.hitRatio = 1.0f;", "l2-persist", "persisting-L2"),
    ("a.val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;", "l2-persist", "lines stay in L2"),
    ("attr.id = cudaLaunchAttributeAccessPolicyWindow;", "l2-persist", "L2"),
    ("cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20);", "l2-persist", "L2"),
    ("cudaCtxResetPersistingL2Cache();", "l2-persist", "L2"),
    # device limits
    ("size_t v; cudaDeviceGetLimit(&v, cudaLimitStackSize);", "device-limit", "device limit"),
    ("cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, 128);", "device-limit", "device limit"),
    ("cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1);", "device-limit", "device limit"),
    ("cudaDeviceSetCacheConfig(cudaFuncCachePreferL1);", "device-state", "device-wide"),
    ("cudaMemAdvise(p, 4, cudaMemAdviseSetReadMostly, 0);", "device-state", "memory-system"),
    # clocks and timers
    ("auto t = std::chrono::steady_clock::now();", "host-time", "clock"),
    ("timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);", "host-time", "clock"),
    ("cudaEventRecord(e, stream);", "event-timing", "events"),
    ("float ms; cudaEventElapsedTime(&ms, a, b);", "event-timing", "events"),
    ("if (cudaEventQuery(e) == cudaSuccess) return;", "host-sync", "synchronizes"),
    ("cupti_start(); cuptiActivityEnable(CUPTI_ACTIVITY_KIND_KERNEL);", "profiler", "measured"),
    ("cudaProfilerStart();", "profiler", "measured"),
    # lookups that escape the list
    ("void* fn; cudaGetDriverEntryPoint(\"cuStreamIsCapturing\", &fn, 0);", "driver-entry", "escapes"),
    ("cuGetProcAddress(\"cuStreamGetCaptureInfo\", &fn, 12000, 0, nullptr);", "driver-entry", "escapes"),
    ("CUstream s2; cuStreamGetCtx(stream, &ctx);", "driver-api", "driver API"),
    ("cudaLibraryLoadData(&lib, image, 0, 0, 0, 0, 0, 0);", "module-load", "loads or looks up code"),
    # host round trips and async pools
    ("cudaMemcpyAsync(p, &h, 4, cudaMemcpyHostToDevice, stream);", "host-copy", "host round trip"),
    ("cudaMemcpyToSymbolAsync(sym, &h, 4, 0, cudaMemcpyHostToDevice, stream);", "host-copy", "host round trip"),
    ("cudaMemcpyAsync(p, &h, 4, cudaMemcpyDefault, stream);", "host-copy", "infers it from the pointers"),
    ("#define Q(x) cudaStream ## x\nQ(IsCapturing)(stream, &st);", "token-paste", "token pasting"),
    ("#define G(x) x ## Graph ## Launch", "token-paste", "token pasting"),
    ("auto t = std::time(nullptr);", "host-time", "clock"),
    ("auto t = std::clock();", "device-timer", "clock"),
    ("cudaMallocAsync(&p, 4, stream);", "alloc", "allocates"),
    ("cudaFreeAsync(p, stream);", "alloc", "allocates"),
    # streams other than the one passed in
    ("#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1", "stream-other", "other than the one passed in"),
    ("k<<<1, 1, 0, (cudaStream_t)2>>>();", "stream-forged", "constant or a cast"),
    ("k<<<1, 1, 0, reinterpret_cast<cudaStream_t>(0x2)>>>();", "stream-forged", "constant or a cast"),
    ("cudaStream_t s{}; k<<<1, 1, 0, s>>>();", "stream-forged", "constant or a cast"),
    ("cudaStream_t s = 0; k<<<1, 1, 0, s>>>();", "stream-forged", "constant or a cast"),
    ("k<<<1, 1, 0, cudaStream_t()>>>();", "stream-forged", "constant or a cast"),
    ("static cudaStream_t last = stream;", "stream-state", "across calls"),
    ("static std::unordered_map<cudaStream_t, int> seen;", "stream-state", "across calls"),
    ("struct L { cudaStream_t st; } l{}; k<<<1, 1, 0, l.st>>>();", "launch-stream", "`l.st`, which is not"),
    ("k<<<1, 1, 0, pick()>>>();", "launch-stream", "`pick()`, which is not"),
    ("stream = nullptr;", "launch-stream", "overwrites the stream parameter `stream`"),
    ("cudaLaunchConfig_t cfg = {}; cfg.gridDim = 1; cudaLaunchKernelEx(&cfg, k);", "launch-stream",
     "launch config `cfg` never gets a stream"),
    ("cudaLaunchConfig_t cfg = {}; cfg.stream = nullptr; cudaLaunchKernelEx(&cfg, k);", "default-stream",
     "stream nullptr"),
    ("cudaLaunchConfig_t cfg = {dim3(1), dim3(1), 0, 0}; cudaLaunchKernelEx(&cfg, k);", "default-stream", "stream 0"),
    ("cudaLaunchKernel((void*)k, dim3(1), dim3(1), args, 0, 0);", "default-stream", "stream 0"),
    ("cudaMemsetAsync(p, 0, 4);", "launch-stream", "no stream argument"),
    ("if (stream == nullptr) return;", "stream-compare", "value of the stream handle `stream`"),
    ("const bool eager = !stream;", "stream-compare", "value of the stream handle"),
    ("auto id = reinterpret_cast<uintptr_t>(stream);", "stream-compare", "value of the stream handle"),
    ("std::memcpy(&id, &stream, sizeof id);", "stream-compare", "value of the stream handle"),
])
def test_new_rule_fires_with_reason(snippet, rule, reason):
    fs = scan_source(_host(snippet), "cand.cu")
    found = [f for f in fs if f.rule == rule]
    assert found, f"{rule} not found in {snippet!r}: {[(f.rule, f.reason) for f in fs]}"
    assert any(reason in f.reason for f in found), [f.reason for f in found]
    assert all(f.severity == "error" for f in found) and summarize(fs)


@pytest.mark.parametrize("kernel,why", [
    ("unsigned long long t = clock64();", "clock64"),
    ("long long t = clock();", "clock"),
    ('unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));', "globaltimer"),
    ('unsigned t; asm volatile("mov.u32 %0, %%glob" "altimer_lo;" : "=r"(t));', "split literal"),
    ('unsigned t; asm volatile(R"(mov.u32 %0, %%clock;)" : "=r"(t));', "raw string"),
    ('unsigned t; asm("mov.u32 %0, %%pm0;" : "=r"(t));', "performance counter"),
    ("unsigned t = cuda::ptx::get_sreg_globaltimer_lo();", "libcu++ PTX wrapper"),
    ("auto t = cuda::std::chrono::system_clock::now();", "libcu++ chrono"),
])
def test_device_timers_reject(kernel, why):
    fs = scan_source(f"__global__ void k(unsigned long long* o) {{ {kernel} }}\n", "cand.cu")
    assert {f.rule for f in errors(fs)} & {"device-timer", "host-time"}, why


@pytest.mark.parametrize("kernel", [
    'asm volatile("griddepcontrol.wait;" ::: "memory");',
    'asm volatile("prefetch.global.L2 [%0];" ::"l"(p));',
    # production SGLang JIT kernels use L2 eviction hints inside one kernel: not persistence across calls
    'unsigned long long pol; asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));',
    'asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p));',
    'printf("%d of %lld cycles\\n", 1, 2ll);',
    'const char* msg = "cudaStreamIsCapturing(s) clock64()"; (void)msg;',
])
def test_legitimate_device_code_passes(kernel):
    src = f"__global__ void k(float* p, unsigned a, unsigned b, unsigned c, unsigned d) {{ {kernel} }}\n"
    assert scan_source(src) == []


def test_device_globals_are_reported_and_managed_memory_rejects():
    fs = scan_source("__device__ unsigned long long g_end[2];\n__device__ int n = 0;\n"
                     "__device__ __forceinline__ float f(float x) { return x; }\n__device__ const int k = 1;\n")
    assert [(f.rule, f.line, f.severity) for f in fs] == [("device-global", 1, "warning"), ("device-global", 2, "warning")]
    assert summarize(fs) is None
    assert [f.rule for f in errors(scan_source("__managed__ float buf[16];\n"))] == ["managed-memory"]


def test_timer_mentioned_in_a_message_string_is_still_a_timer():
    # string rules read every literal: a PTX fragment built in a string is found wherever it is
    fs = scan_source('const char* frag = "mov.u64 %0, %%globaltimer;";\n')
    assert [f.rule for f in fs] == ["device-timer"]


def test_string_literals_joins_adjacent_and_skips_comments():
    src = '// "not this"\nx = "a" "b";\ny = R"(c"d)"; /* "nor this" */ z = \'"\'; w = "e";\n'
    assert [t for _, t in string_literals(src)] == ["ab", 'c"d', "e"]


def test_stream_handed_down_and_aliased_is_fine():
    src = r'''
#include <cuda_runtime.h>
__global__ void k(float* p) {}
template <typename... A>
inline cudaError_t launch(void (*kern)(A...), dim3 g, dim3 b, cudaStream_t stream, A... a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = g;
  cfg.blockDim = b;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, kern, a...);
}
inline int max_cluster(const void* kern) {
  cudaLaunchConfig_t q = {};  // an occupancy query, never launched: no stream needed
  q.gridDim = 8;
  int n = 0;
  cudaOccupancyMaxPotentialClusterSize(&n, kern, &q);
  return n;
}
cudaError_t run(float* p, cudaStream_t stream) {
  cudaStream_t s = stream;
  const auto t = s;
  k<<<1, 32, 0, s>>>(p);
  k<<<1, 32, 0, t>>>(p);
  cudaMemsetAsync(p, 0, 4, stream);
  return launch(k, dim3(1), dim3(32), stream, p);
}
extern "C" cudaError_t astra_x(float* p, int dtype, cudaStream_t stream);
extern "C" cudaError_t astra_x(float* p, int dtype, cudaStream_t stream) { return run(p, stream); }
'''
    assert scan_source(src) == []


def test_ignored_stream_parameter_rejects():
    src = "void run(float* p, cudaStream_t stream) { (void)stream; k<<<1, 1, 0, s0>>>(p); }\n"
    rules = {f.rule for f in scan_source(src)}
    assert {"stream-unused", "launch-stream"} <= rules
    assert {f.rule for f in scan_source("void run(float* p, cudaStream_t) { }\n")} == {"stream-unused"}
    # a member named like the parameter is not a use of it
    src = "cudaError_t run(cudaStream_t stream, cudaStream_t side) { cudaLaunchConfig_t c = {}; c.stream = side; (void)stream; return cudaLaunchKernelEx(&c, k); }\n"
    assert "stream-unused" in {f.rule for f in scan_source(src)}
    # a declaration or a function-pointer type has no body to use it in
    assert scan_source("cudaError_t run(float* p, cudaStream_t stream);\nusing F = void (*)(cudaStream_t);\n") == []


def test_rocm_shim_defines_are_not_uses():
    # production sgl_kernel/utils.cuh maps CUDA names to HIP ones under USE_ROCM
    assert scan_source("#define cudaStreamPerThread hipStreamPerThread\n#define cudaMemcpyHostToDevice hipMemcpyHostToDevice\n") == []


def test_rule_table_is_complete():
    """One table: every entry has an id, a reason and a pattern that compiles; every structural
    check it names is one _stream_findings produces."""
    checks = set()
    for r in RULES:
        assert re.fullmatch(r"[a-z0-9-]+", r.rule) and len(r.reason) > 20 and r.severity in ("error", "warning")
        assert r.target in ("code", "string", "stream")
        if r.target == "stream":
            assert r.check
            checks.add(r.check)
        else:
            re.compile(r.pattern)
    produced = set()
    for snippet in ("k<<<1, 1>>>();", "k<<<1, 1, 0, 0>>>();", "k<<<1, 1, 0, q>>>();", "stream = 0;",
                    "cudaLaunchConfig_t c = {}; cudaLaunchKernelEx(&c, k);", "if (!stream) return;"):
        produced |= {c for c, _, _ in _stream_findings(strip_comments_and_strings(
            f"void h(cudaStream_t stream) {{ {snippet} }}\nvoid g(cudaStream_t s) {{}}\n"))}
    assert produced == checks


def test_summary_prefers_the_cause_to_its_consequences():
    # the created stream is named, not the stream parameter it leaves unused (RULES order)
    src = "void run(float* p, cudaStream_t stream) {\n static cudaStream_t s = nullptr;\n cudaStreamCreate(&s);\n k<<<1, 1, 0, s>>>(p);\n}\n"
    assert "stream-create" in summarize(scan_source(src, "c.cu"))


# ------------------------------------------------------------------ the cheating candidates and production

BAD = REPO / "tests" / "bad_candidates"
CHEATS = sorted(BAD.glob("cheat_*.cu"))


def _header(path: Path, key: str) -> str:
    m = re.search(rf"^// {key}: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name} has no '// {key}:' line"
    return m.group(1).strip()


def test_every_cheat_is_in_the_readme():
    readme = (BAD / "README.md").read_text()
    assert CHEATS
    for c in CHEATS:
        assert f"| {c.name} |" in readme, c.name


@pytest.mark.parametrize("cand", CHEATS, ids=[c.stem for c in CHEATS])
def test_cheating_candidate_static_verdict(cand):
    """`// static: RULE` must reject it with that rule and a summary its `// expect:` matches;
    `// static: none` must pass the scan (only the dynamic check named in `// dynamic:` can catch it)."""
    want = _header(cand, "static")
    assert _header(cand, "dynamic") and _header(cand, "op") == "silu_and_mul"
    fs = scan_file(cand)
    if want == "none":
        assert errors(fs) == [], [f.one_line() for f in errors(fs)]
        return
    assert want in {f.rule for f in errors(fs)}, [f.one_line() for f in fs]
    s = summarize(fs)
    assert re.search(_header(cand, "expect"), s), s
    assert want in s


def test_correct_candidates_pass():
    for f in sorted(BAD.glob("ok_*.cu")):
        assert scan_file(f) == [], f


@pytest.mark.wheels
@pytest.mark.nvcc
def test_extracted_production_launchers_pass(wheel_sources, tmp_path):
    """What check scans of production: the extracted baseline.cu (optimize's round 0 is a copy of it)
    and its quoted includes beside it; the production headers under the workspace's include dirs are
    not scanned. Every op, every variant the pinned wheels provide."""
    from astra_sglang.build import Arch
    from astra_sglang.extract import available_variants, discover, extract
    from astra_sglang.registry import get_op, op_names
    from astra_sglang.build.workspace import Workspace

    roots = discover(wheel_sources["sglang"], wheel_sources["flashinfer"], wheel_sources["tvm"])
    scanned = []
    for op in op_names():
        spec = get_op(op)
        for v, ok, _ in available_variants(spec, roots):
            if not ok or getattr(v, "callable", None):  # unusable here, or the installed callable: no source
                continue
            dest = tmp_path / v.name / op
            extract(spec, roots, dest, Arch(9, 0), variant=v.name)
            ws = Workspace.open(op, path=dest)
            round0 = dest / "candidates" / "0.cu"  # where optimize puts it
            round0.write_text(ws.baseline.read_text())
            for f in (ws.baseline, round0):
                fs = scan_file(f, ws.include_dirs)
                assert fs == [], f"{op}/{v.name}: {[x.one_line() for x in fs]}"
            scanned.append(f"{op}/{v.name}")
    assert len(scanned) >= 3, scanned


@pytest.mark.nvcc
def test_cheating_candidates_compile():
    """Each cheat must build, so the GPU checks reject it for its cheat, not for a compile error."""
    import shutil
    import subprocess
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    with tempfile.TemporaryDirectory() as tmp:
        def build(c: Path):
            r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", str(c), "-o", str(Path(tmp) / f"{c.stem}.o")],
                               capture_output=True, text=True, timeout=300)
            return c.name, r.returncode, r.stderr[-2000:]

        with ThreadPoolExecutor(max_workers=2) as pool:
            for name, rc, err in pool.map(build, CHEATS):
                assert rc == 0, f"{name}: {err}"
