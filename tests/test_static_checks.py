"""Static checks on candidate sources: each rule fires with its reason, comments and strings don't."""
from __future__ import annotations

from pathlib import Path

import pytest

from astra_sglang.static_checks import errors, scan_file, scan_source, strip_comments_and_strings, summarize

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
    ("cudaDeviceSetLimit(cudaLimitStackSize, 1);", "device-state", "device-wide state"),
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


def test_host_clock_is_a_warning_only():
    fs = scan_source("void h(){ auto t = std::chrono::steady_clock::now(); }")
    assert fs and all(f.severity == "warning" for f in fs)
    assert summarize(fs) is None


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
    assert flagged == {"silu_created_stream.cu", "silu_default_stream.cu"}
