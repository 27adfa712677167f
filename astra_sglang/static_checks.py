"""Static checks on a candidate's CUDA source, before it is built or run.

A candidate is one .cu behind the op's ABI. It must do its work on the stream it is
handed (CUDA-graph capture, no hidden ordering), never synchronize the host, never
pull in torch/ATen (it must build with nvcc alone), and never touch files,
processes or the network. Each finding names the rule, the line and the reason.

The scan works on the source with comments removed and string literals blanked,
so a rule mentioned in a comment is not a finding. Quoted includes that resolve
next to the candidate (not the workspace's production headers) are scanned too.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple


@dataclass(frozen=True)
class Finding:
    rule: str  # short id, e.g. "stream-create"
    severity: str  # "error" (rejects the candidate) or "warning" (reported only)
    file: str
    line: int
    text: str  # the offending source line, trimmed
    reason: str

    def one_line(self) -> str:
        return f"{Path(self.file).name}:{self.line}: {self.rule}: {self.reason} [{self.text[:80]}]"

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    rule: str
    pattern: str  # regex on comment-free, string-blanked code
    reason: str
    severity: str = "error"


_CALL = r"\b{}\s*\("

RULES: Tuple[Rule, ...] = (
    # --- torch / ATen: the candidate must build with nvcc alone --------------------
    Rule("torch", r"#\s*include\s*[<\"](?:torch|ATen|c10|caffe2)/",
         "includes torch/ATen headers: a candidate must build with nvcc alone (no libtorch)"),
    Rule("torch", r"\b(?:at|torch|c10)::",
         "uses the torch/ATen C++ API: a candidate must build with nvcc alone (no libtorch)"),
    # --- stream / event creation: all work on the ABI's stream ---------------------
    Rule("stream-create", _CALL.format(r"(?:cudaStreamCreate\w*|cuStreamCreate\w*)"),
         "creates a CUDA stream: all work must run on the stream passed in (graph capture, ordering)"),
    Rule("event-create", _CALL.format(r"(?:cudaEventCreate\w*|cuEventCreate\w*)"),
         "creates a CUDA event: all work must run on the stream passed in, with no cross-stream sync"),
    Rule("stream-other", r"\b(?:cudaStreamPerThread|cudaStreamLegacy|CU_STREAM_PER_THREAD|CU_STREAM_LEGACY)\b",
         "uses a stream other than the one passed in"),
    Rule("graph-capture", _CALL.format(r"(?:cudaStreamBeginCapture\w*|cudaStreamEndCapture|cudaGraph\w+)"),
         "manipulates CUDA graphs/capture: the caller owns capture; launch plainly on the given stream"),
    # --- host synchronization --------------------------------------------------------
    Rule("host-sync", _CALL.format(r"(?:cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|"
                                    r"cudaStreamQuery|cudaEventQuery|cuCtxSynchronize|cuStreamSynchronize|"
                                    r"cudaThreadSynchronize)"),
         "synchronizes the host with the device: breaks graph capture and serializes the caller"),
    Rule("host-sync", _CALL.format(r"(?:cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|cudaMemcpyToSymbol|"
                                    r"cudaMemcpyFromSymbol|cudaMemset|cudaMemset2D|cudaMemcpyPeer)"),
         "synchronous memcpy/memset: blocks the host and is not on the given stream (use the *Async form)"),
    Rule("host-sync", _CALL.format(r"cudaStreamWaitEvent"),
         "waits on an event: all work must run on the one stream passed in"),
    Rule("alloc", _CALL.format(r"(?:cudaMalloc|cudaMallocManaged|cudaMallocHost|cudaHostAlloc|cudaFree|"
                                r"cudaFreeHost|cudaMallocPitch|cudaMalloc3D|cudaMallocArray|cuMemAlloc\w*|"
                                r"cuMemFree\w*|cudaHostRegister)"),
         "allocates or frees memory in the call: synchronizes the device, is not graph-capturable, and "
         "lets a kernel keep state (results cached between calls)"),
    Rule("host-callback", _CALL.format(r"(?:cudaLaunchHostFunc|cudaStreamAddCallback|cuLaunchHostFunc)"),
         "runs a host callback on the stream: serializes the stream with the host"),
    Rule("device-state", _CALL.format(r"(?:cudaSetDevice|cudaDeviceReset|cudaDeviceSetLimit|cudaDeviceSetCacheConfig|"
                                       r"cudaDeviceSetSharedMemConfig|cudaSetDeviceFlags|cudaCtxResetPersistingL2Cache|"
                                       r"cudaDeviceSetMemPool|cudaProfilerStart|cudaProfilerStop)"),
         "changes device-wide state: a kernel may only launch work on the stream it is given"),
    # --- files, processes, network, environment ---------------------------------------
    Rule("file-io", r"#\s*include\s*<(?:fstream|filesystem|sys/stat\.h|fcntl\.h|dirent\.h)>",
         "includes file-system headers: a kernel must not read or write files"),
    Rule("file-io", _CALL.format(r"(?:fopen|fopen64|freopen|fread|fwrite|fprintf|fputs|fgets|fscanf|open|"
                                  r"openat|creat|unlink|remove|rename|mkdir|rmdir|opendir|readdir|stat|"
                                  r"mmap|dlopen|dlsym)"),
         "file-system or dynamic-loader call in host code: a kernel must not touch files"),
    Rule("file-io", r"\bstd::(?:ifstream|ofstream|fstream|filesystem)\b|\b(?:ifstream|ofstream)\s+\w",
         "C++ file stream: a kernel must not touch files"),
    Rule("process", r"#\s*include\s*<(?:unistd\.h|spawn\.h|sys/wait\.h|thread|future|signal\.h|csignal)>",
         "includes process/thread headers: a kernel must not start processes or threads"),
    Rule("process", _CALL.format(r"(?:system|popen|pclose|fork|vfork|execl|execlp|execle|execv|execvp|execve|"
                                  r"posix_spawn|posix_spawnp|kill|raise|abort|exit|_exit|quick_exit|"
                                  r"pthread_create|atexit|sleep|usleep|nanosleep)"),
         "process, thread, signal or sleep call in host code: a kernel must not control processes"),
    Rule("process", r"\bstd::(?:thread|async|jthread|this_thread)\b",
         "starts host threads: a kernel must do its work on the device, on the given stream"),
    Rule("network", r"#\s*include\s*<(?:sys/socket\.h|netinet/\w+\.h|arpa/inet\.h|netdb\.h|curl/curl\.h)>",
         "includes networking headers: a kernel must not use the network"),
    Rule("network", _CALL.format(r"(?:socket|connect|bind|listen|accept|send|sendto|recv|recvfrom|"
                                  r"getaddrinfo|gethostbyname)"),
         "network call in host code: a kernel must not use the network"),
    Rule("environment", _CALL.format(r"(?:getenv|setenv|putenv|secure_getenv)"),
         "reads or changes the environment: a kernel's behaviour must depend on its arguments only"),
    Rule("host-time", _CALL.format(r"(?:clock_gettime|gettimeofday|time)") + r"|\bstd::chrono::",
         "reads the host clock: a kernel must not measure or detect its own timing", "warning"),
    Rule("inline-asm-host", r"\b__asm__\b\s*(?:volatile\s*)?\(\s*\"\s*syscall",
         "raw system call", "error"),
)

# Device-side calls that look like the host rules above but are fine in kernels.
_DEVICE_OK = {"printf", "assert", "__trap", "__brkpt"}


def strip_comments_and_strings(src: str) -> str:
    """Remove // and /* */ comments and blank string/char literals, keeping line numbers.

    #include lines keep their <...> / "..." target so include rules still apply.
    """
    out: List[str] = []
    i, n = 0, len(src)
    in_include = False
    while i < n:
        c = src[i]
        if c == "\n":
            in_include = False
            out.append(c)
            i += 1
            continue
        if c == "#" and _at_line_start(src, i):
            m = re.match(r"#\s*include\b", src[i:i + 40])
            in_include = bool(m)
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
            continue
        if c == "R" and src.startswith('R"', i):  # raw string literal R"delim( ... )delim"
            m = re.match(r'R"([^()\\ ]{0,16})\(', src[i:])
            if m:
                end = src.find(")" + m.group(1) + '"', i)
                end = n if end < 0 else end + len(m.group(1)) + 2
                out.append('""' + "".join("\n" for ch in src[i:end] if ch == "\n"))
                i = end
                continue
        if c in "\"'" and not in_include:
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(c + " " * max(0, min(j, n) - i - 1) + (c if j < n and src[j] == c else ""))
            i = j + 1 if j < n and src[j] == c else j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _at_line_start(src: str, i: int) -> bool:
    j = i - 1
    while j >= 0 and src[j] in " \t":
        j -= 1
    return j < 0 or src[j] == "\n"


def _launch_findings(code: str, path: str, lines: Sequence[str]) -> List[Finding]:
    """Kernel launches with <<<...>>> must pass a stream (the 4th config argument), not 0/nullptr."""
    out = []
    for m in re.finditer(r"<<<(.*?)>>>", code, re.DOTALL):
        args = _split_top_level(m.group(1))
        line = code.count("\n", 0, m.start()) + 1
        text = lines[line - 1].strip() if line - 1 < len(lines) else ""
        if len(args) < 4:
            out.append(Finding("default-stream", "error", path, line, text,
                               "kernel launched on the default stream: pass the ABI's stream as the 4th "
                               "launch argument (<<<grid, block, smem, stream>>>)"))
        elif args[3].strip() in ("0", "nullptr", "NULL", "0u", "cudaStreamLegacy", "cudaStreamPerThread"):
            out.append(Finding("default-stream", "error", path, line, text,
                               f"kernel launched on stream {args[3].strip()}: use the stream passed in"))
    return out


def _split_top_level(s: str) -> List[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def scan_source(src: str, path: str = "<candidate>") -> List[Finding]:
    """All findings in one source text."""
    code = strip_comments_and_strings(src)
    lines = src.splitlines()
    findings: List[Finding] = []
    seen: Set[Tuple[str, int]] = set()
    for r in RULES:
        for m in re.finditer(r.pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            name = m.group(0)
            if any(name.strip().startswith(ok) for ok in _DEVICE_OK):
                continue
            # member calls (obj.open(...), x->send(...)) and declarations of our own
            # helpers named like libc calls are not libc calls
            pre = code[max(0, m.start() - 2):m.start()]
            if r.pattern.startswith(r"\b") and (pre.endswith(".") or pre.endswith("->") or pre.endswith("::")) \
                    and r.rule not in ("torch",):
                continue
            if (r.rule, line) in seen:
                continue
            seen.add((r.rule, line))
            text = lines[line - 1].strip() if line - 1 < len(lines) else ""
            findings.append(Finding(r.rule, r.severity, path, line, text, r.reason))
    findings.extend(_launch_findings(code, path, lines))
    findings.sort(key=lambda f: (f.file, f.line, f.rule))
    return findings


_QINC = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def scan_file(path: Path, workspace_include_dirs: Iterable[Path] = ()) -> List[Finding]:
    """Scan a candidate and the quoted includes that resolve beside it (not production headers)."""
    path = Path(path)
    prod = [Path(d).resolve() for d in workspace_include_dirs]
    findings: List[Finding] = []
    todo, done = [path.resolve()], set()
    while todo:
        p = todo.pop()
        if p in done or not p.exists():
            continue
        done.add(p)
        text = p.read_text(errors="replace")
        findings.extend(scan_source(text, str(p)))
        for inc in _QINC.findall(text):
            cand = (p.parent / inc).resolve()
            if cand.exists() and not any(_under(cand, d) for d in prod):
                todo.append(cand)
    return findings


def _under(p: Path, d: Path) -> bool:
    try:
        p.relative_to(d)
        return True
    except ValueError:
        return False


def errors(findings: Iterable[Finding]) -> List[Finding]:
    return [f for f in findings if f.severity == "error"]


def summarize(findings: Sequence[Finding]) -> Optional[str]:
    """One line for the first rejecting finding (None when nothing rejects)."""
    errs = errors(findings)
    if not errs:
        return None
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"static check: {errs[0].one_line()}{more}"
