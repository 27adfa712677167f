"""Static checks on a candidate's CUDA source, before it is built or run.

A candidate is one .cu behind the op's ABI. It must do its work on the stream it is
handed (CUDA-graph capture, no hidden ordering), never synchronize the host, never
pull in torch/ATen (it must build with nvcc alone), never touch files, processes or
the network, and never be able to tell a check from a timing run: no capture or
graph queries, no stream attributes, no L2 persistence, no device limits, no clocks
or timers, no driver entry points that would let a call escape this list.
Each finding names the rule, the line and the reason.

RULES is the one list of what is rejected and why. Most rules are regexes on the
source with comments removed and string literals blanked, so a rule mentioned in a
comment or a message is not a finding; `target="string"` rules read the text of
string literals instead (inline PTX such as "mov.u64 %0, %%globaltimer;"), and
`target="stream"` rules are structural checks of where each launch's stream comes
from (_stream_findings). Quoted includes that resolve next to the candidate (not
the workspace's production headers) are scanned too.

What gets scanned: every candidate (check, bench, optimize's compile), including
optimize's round 0, which is a copy of the extracted baseline.cu; the production
headers under the workspace's include dirs are not (they hold framework glue such as
tvm-ffi's stream lookup and trtllm's capture query). tests/test_static_checks.py holds
the shipped kernels, the launch templates and every extracted baseline to these rules:
a rule that fires on them is wrong. L2 eviction hints inside one kernel
(createpolicy ... L2::evict_last) stay allowed: production SGLang kernels use them.

Static checks are the first line only: a kernel can always hide what it does from a
regex. What they cannot see (a result cache keyed by pointer, a stream dropped
through a helper's argument) the dynamic checks catch: check runs the candidate the
way bench does and bench re-checks what it timed (tests/bad_candidates/README.md).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple


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
    pattern: str  # regex; what it is matched against depends on `target`
    reason: str  # why the rule exists, shown with every finding ("{}": the construct found)
    severity: str = "error"
    target: str = "code"  # "code": comment-free, string-blanked source; "string": string literals
    # (adjacent ones joined); "stream": a structural check in _stream_findings, keyed by `check`
    check: str = ""


_CALL = r"\b{}\s*\("
# Stream arguments that are not the caller's stream (0 and friends are the legacy default stream).
_CONST_STREAMS = ("0", "0u", "0U", "0l", "0L", "nullptr", "NULL", "{}", "cudaStreamLegacy", "cudaStreamPerThread",
                  "cudaStreamDefault", "CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD")

RULES: Tuple[Rule, ...] = (
    # --- torch / ATen: the candidate must build with nvcc alone --------------------
    Rule("torch", r"#\s*include\s*[<\"](?:torch|ATen|c10|caffe2)/",
         "includes torch/ATen headers: a candidate must build with nvcc alone (no libtorch)"),
    Rule("torch", r"\b(?:at|torch|c10)::",
         "uses the torch/ATen C++ API: a candidate must build with nvcc alone (no libtorch)"),
    # --- streams: all work on the ABI's stream ----------------------------------------
    Rule("stream-create", _CALL.format(r"(?:cudaStreamCreate\w*|cuStreamCreate\w*)"),
         "creates a CUDA stream: all work must run on the stream passed in (graph capture, ordering)"),
    Rule("event-create", _CALL.format(r"(?:cudaEventCreate\w*|cuEventCreate\w*)"),
         "creates a CUDA event: all work must run on the stream passed in, with no cross-stream sync"),
    Rule("stream-other", r"\b(?:cudaStreamPerThread|cudaStreamLegacy|cudaStreamDefault|CU_STREAM_PER_THREAD|"
                         r"CU_STREAM_LEGACY|_*CUDA_API_PER_THREAD_DEFAULT_STREAM)\b",
         "uses a stream other than the one passed in"),
    Rule("default-stream", r"<<<(.*?)>>> with fewer than 4 arguments",
         "kernel launched on the default stream: pass the ABI's stream as the 4th launch argument "
         "(<<<grid, block, smem, stream>>>)", target="stream", check="launch-missing"),
    Rule("default-stream", r"<<<grid, block, smem, CONSTANT>>>",
         "kernel launched on stream {}: use the stream passed in", target="stream", check="launch-constant"),
    Rule("launch-stream", r"<<<..., S>>> | cfg.stream = S | cudaLaunch*Kernel(..., S) | cudaMem*Async(..., S)",
         "work enqueued on `{}`, which is not the stream passed in: hand the ABI's cudaStream_t down as a "
         "parameter and launch on it unchanged", target="stream", check="launch-origin"),
    Rule("launch-stream", r"cudaLaunchConfig_t NAME with no NAME.stream = S",
         "launch config `{}` never gets a stream (an unset cudaLaunchConfig_t.stream is the legacy default "
         "stream): set .stream to the stream passed in", target="stream", check="config-stream"),
    Rule("launch-stream", r"STREAM_PARAM = ...",
         "overwrites the stream parameter `{}`: launch on the stream passed in", target="stream",
         check="stream-reassigned"),
    Rule("stream-forged", r"\(\s*(?:const\s+)?cudaStream_t\s*\)\s*(?!const\b|noexcept\b|override\b)[\w(&*+\-!~]"
                          r"|\b(?:reinterpret_cast|static_cast|const_cast|bit_cast)\s*<\s*(?:const\s+)?cudaStream_t\s*>"
                          r"|(?<!->)(?<!-> )\bcudaStream_t\s*(?:\(\s*[^)]*\)|\{[^}]*\})"
                          r"|\bcudaStream_t\s+(?:const\s+)?\w+\s*(?:=\s*(?:0[uUlL]*|nullptr|NULL|\{\s*\})\s*;"
                          r"|\{\s*(?:0|nullptr|NULL)?\s*\}\s*;)",
         "makes a stream handle from a constant or a cast (0 is the legacy default stream, 2 the per-thread "
         "one): all work must run on the stream passed in"),
    Rule("stream-state", r"\b(?:static|thread_local)\s+(?:const\s+)?cudaStream_t\b"
                         r"|\bstd::\w*(?:map|set|hash)\s*<\s*(?:const\s+)?cudaStream_t\b",
         "keeps stream handles across calls: which stream a call comes on tells a check from a timed run"),
    Rule("stream-unused", r"f(..., cudaStream_t S) { ...no S... }",
         "ignores its cudaStream_t parameter `{}`: whatever it launches runs on some other stream", target="stream",
         check="stream-unused"),
    Rule("stream-compare", r"S == x | S != x | !S | if (S) | S ? | (uintptr_t)S | &S",
         "looks at the value of the stream handle `{}`: which stream a call comes on tells a check from a timed "
         "run; a kernel's work may depend on its data only", target="stream", check="stream-compare"),
    # --- CUDA graphs and capture: bench times captured graphs ---------------------------
    Rule("capture-query", r"\b(?:cu(?:da)?StreamIsCapturing|cu(?:da)?StreamGetCaptureInfo\w*|"
                          r"cu(?:da)?ThreadExchangeStreamCaptureMode|cudaStreamCaptureStatus\w*|"
                          r"CU_STREAM_CAPTURE_STATUS\w*|cudaStreamCaptureMode\w*|CU_STREAM_CAPTURE_MODE\w*)\b",
         "asks whether the stream is being captured into a CUDA graph: bench times captured graphs, so a kernel "
         "that knows can do less work exactly when it is timed"),
    Rule("graph-capture", r"\b(?:cu(?:da)?StreamBeginCapture\w*|cu(?:da)?StreamEndCapture\w*|"
                          r"cu(?:da)?StreamUpdateCaptureDependencies\w*|cudaGraph\w+|cuGraph\w+|cu(?:da)?UserObject\w*|"
                          r"cu(?:da)?DeviceGraphMemTrim|cu(?:da)?Device(?:Get|Set)GraphMemAttribute)\b",
         "manipulates CUDA graphs/capture: the caller owns capture; launch plainly on the given stream (graph "
         "APIs also tell a kernel whether it is being captured, i.e. timed)"),
    # --- stream attributes, L2 persistence, device limits: the memory system is not the kernel's --
    Rule("l2-persist", r"\b(?:\w*[Aa]ccessPolicyWindow\w*|hitRatio|hitProp|missProp|cudaAccessProperty\w*|"
                       r"CU_ACCESS_PROPERTY\w*|\w*[Pp]ersistingL2\w*|CU_LIMIT_PERSISTING_L2_CACHE_SIZE|"
                       r"apply_access_property|discard_memory)\b|\baccess_property\s*::\s*persisting\b",
         "sets an L2 access-policy window or persisting-L2 carve-out: lines stay in L2 across calls (a timed run is "
         "no longer L2-cold), and the setting outlives the call and takes L2 from the kernels around it"),
    Rule("stream-attribute", r"\b(?:cu(?:da)?StreamGet\w+|cu(?:da)?StreamSetAttribute\w*|cu(?:da)?StreamCopyAttributes|"
                             r"cudaStreamAttr\w*|CU_STREAM_ATTRIBUTE\w*)\b",
         "reads or sets the stream's attributes (flags, priority, id, capture state, L2 access policy, "
         "synchronization policy): they tell a check from a timed run, and what is set outlives the call"),
    Rule("device-limit", r"\b(?:cu(?:da)?(?:Device|Thread|Ctx)(?:Set|Get)Limit|cudaLimit\w+|CU_LIMIT_\w+)\b",
         "reads or sets a device limit (stack, printf FIFO, malloc heap, L2 fetch granularity, persisting L2): "
         "device-wide state that outlives the call and changes the kernels around it"),
    Rule("device-state", _CALL.format(r"(?:cudaSetDevice|cudaDeviceReset|cudaDeviceSetCacheConfig|"
                                       r"cudaDeviceSetSharedMemConfig|cudaSetDeviceFlags|cudaDeviceSetMemPool|"
                                       r"cudaDeviceGetDefaultMemPool|cudaMemPool\w+|cudaDeviceEnablePeerAccess|"
                                       r"cudaDeviceDisablePeerAccess|cudaDeviceFlushGPUDirectRDMAWrites|cudaMemAdvise|"
                                       r"cudaMemPrefetchAsync|cudaIpc\w+|cudaCtx\w+)"),
         "changes device-wide or memory-system state (device, cache config, memory pools, peer access, page "
         "placement, IPC): a kernel may only launch work on the stream it is given"),
    # --- time: a kernel must not measure or detect its own timing ----------------------------
    Rule("device-timer", _CALL.format(r"(?:clock|clock64|__clock64|__globaltimer|get_sreg_clock\w*|"
                                       r"get_sreg_globaltimer\w*|get_sreg_pm\w*)"),
         "reads a GPU clock or timer: a kernel could measure its own timing and do less work when it is timed "
         "(production reads timers only for multi-GPU spin-wait timeouts, which no astra op has)"),
    Rule("device-timer", r"%{1,2}(?:clock(?:64|_hi)?|globaltimer(?:_lo|_hi)?|pm[0-7](?:_64)?)\b",
         "inline PTX reads a GPU clock, timer or performance counter: a kernel could measure its own timing "
         "and do less work when it is timed", target="string"),
    Rule("host-time", _CALL.format(r"(?:clock_gettime|gettimeofday|time|timespec_get|rdtsc|__rdtsc)")
         + r"|\bstd::chrono::|\bcuda::std::chrono\b",
         "reads a clock: a kernel must not measure or detect its own timing (host calls are far apart in check "
         "and back to back when bench captures)"),
    Rule("event-timing", r"\b(?:cu(?:da)?EventRecord\w*|cu(?:da)?EventElapsedTime\w*|cuEventQuery|"
                         r"cu(?:da)?EventSynchronize)\b",
         "records or reads CUDA events: a kernel must not time itself or order against work outside its stream"),
    Rule("profiler", r"#\s*include\s*[<\"]cupti|\bcupti\w*\s*\(|\bcu(?:da)?Profiler(?:Start|Stop)\b",
         "uses the profiler (CUPTI, cudaProfilerStart/Stop): a kernel can see that it is being measured"),
    # --- run-time lookups that would escape this list ----------------------------------------
    Rule("driver-entry", r"\b(?:cuGetProcAddress\w*|cudaGetDriverEntryPoint\w*)\b",
         "looks up driver functions by name at run time: a call behind it escapes every rule in this list "
         "(capture queries, stream attributes, L2 policy)"),
    Rule("driver-api", r"\bcu(?!C[a-z]|GetError)[A-Z]\w*\s*\(",
         "calls the CUDA driver API: candidates use the runtime API only, so every call is visible to these "
         "rules (driver calls query capture, set stream and L2 attributes, launch on other streams)"),
    Rule("module-load", r"\b(?:cudaLibraryLoad\w*|cudaLibraryGet\w*|cudaGetKernel|cudaGetFuncBySymbol|"
                        r"cudaKernelSetAttributeForDevice|cuModule\w+|cuLibrary\w+)\b",
         "loads or looks up code at run time: the kernel that runs must be the one in the candidate's source"),
    # --- host synchronization and memory ------------------------------------------------
    Rule("host-sync", _CALL.format(r"(?:cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|"
                                    r"cudaStreamQuery|cudaEventQuery|cuCtxSynchronize|cuStreamSynchronize|"
                                    r"cudaThreadSynchronize)"),
         "synchronizes the host with the device: breaks graph capture and serializes the caller"),
    Rule("host-sync", _CALL.format(r"(?:cudaMemcpy|cudaMemcpy2D|cudaMemcpy3D|cudaMemcpyToSymbol|"
                                    r"cudaMemcpyFromSymbol|cudaMemset|cudaMemset2D|cudaMemcpyPeer)"),
         "synchronous memcpy/memset: blocks the host and is not on the given stream (use the *Async form)"),
    Rule("host-sync", _CALL.format(r"cudaStreamWaitEvent"),
         "waits on an event: all work must run on the one stream passed in"),
    Rule("host-copy", r"\b(?:cudaMemcpyHostToDevice|cudaMemcpyDeviceToHost|cudaMemcpyHostToHost|cudaMemcpyDefault|"
                      r"cudaMemcpy(?:To|From)Symbol\w*Async|cudaHostGetDevicePointer|cudaHostUnregister)\b",
         "copies between host and device in the call (cudaMemcpyDefault infers it from the pointers): a host "
         "round trip that lets host code see device state, and pageable copies fail under capture (a capture "
         "probe); pass everything as kernel arguments, copy device to device with cudaMemcpyDeviceToDevice"),
    Rule("token-paste", r"\b(?:cu|cuda|CU)\w*\s*##|##\s*\w*?(?:Capturing|Capture\w*|Graph\w*|"
                        r"Attribute|Limit|Persisting\w*|ProcAddress|EntryPoint|timer\w*|clock\w*)\b",
         "builds a CUDA API name by token pasting: every call must be visible to these rules"),
    Rule("alloc", _CALL.format(r"(?:cudaMalloc\w*|cudaHostAlloc|cudaFree\w*|cudaMalloc3D\w*|cuMemAlloc\w*|"
                                r"cuMemFree\w*|cudaHostRegister)"),
         "allocates or frees memory in the call: synchronizes the device (or, async, is a pool the caller does "
         "not own), and lets a kernel keep state (results cached between calls)"),
    Rule("managed-memory", r"\b__managed__\b|\bcudaMallocManaged\b",
         "managed memory migrates pages between host and device behind the caller's back: a kernel reads and "
         "writes only the buffers it is handed"),
    Rule("device-global", r"(?m)^[ \t]*(?:static[ \t]+)?__device__[ \t]+(?!__forceinline__|__noinline__|inline\b|"
                          r"static\b|constexpr\b|const\b|void\b)[^(;{]*?\b\w+[ \t]*(?:\[[^\]]*\][ \t]*)*(?:=[^;]*)?;",
         "a mutable __device__ global keeps state between calls (a result cache, a call counter, the last call's "
         "time): a kernel's work must depend on its arguments only", "warning"),
    Rule("host-callback", _CALL.format(r"(?:cudaLaunchHostFunc|cudaStreamAddCallback|cuLaunchHostFunc)"),
         "runs a host callback on the stream: serializes the stream with the host"),
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
                                  r"pthread_create|atexit|sleep|usleep|nanosleep|syscall)"),
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
    Rule("inline-asm-host", r"^\s*(?:syscall|sysenter|int\s+\$?0x80|rdtsc\w*)\b",
         "host inline assembly makes a raw system call or reads the time-stamp counter", target="string"),
)

# Rules about libc/POSIX names: obj.open(...), p->send(...), std::remove(...) are not those calls.
_LIBC_RULES = {"file-io", "process", "network", "environment", "host-time"}

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


def string_literals(src: str) -> Iterator[Tuple[int, str]]:
    """(offset, text) of each run of adjacent string literals outside comments ("a" "b" -> "ab").

    Inline PTX lives in strings, which the code rules never see; the escapes are kept as written."""
    i, n = 0, len(src)
    run_start, run = -1, []

    def flush():
        nonlocal run_start, run
        if run:
            yield run_start, "".join(run)
        run_start, run = -1, []

    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        c = src[i]
        m = re.match(r'(?:u8|[uUL])?R"([^()\\ ]{0,16})\(', src[i:i + 24]) if c in "RuUL" else None
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            close = ")" + m.group(1) + '"'
            end = src.find(close, i + m.end())
            end = n if end < 0 else end
            run_start = i if run_start < 0 else run_start
            run.append(src[i + m.end():end])
            i = end + len(close)
            continue
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"' and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            run_start = i if run_start < 0 else run_start
            run.append(src[i + 1:j])
            i = j + 1
            continue
        if c == "'":  # a char literal, not a string ('"' must not open one)
            j = i + 1
            while j < n and src[j] != "'" and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            yield from flush()
            i = j + 1
            continue
        if not c.isspace():
            yield from flush()
        i += 1
    yield from flush()


# ------------------------------------------------------------------ where each launch's stream comes from

_PARAM = re.compile(r"\s*(?:\[\[[^\]]*\]\]\s*)?(?:const\s+)?cudaStream_t\s*(?:const\s+)?(\w+)?\s*(?:=.*)?\Z", re.S)
_DEF_TAIL = re.compile(r"\s*(?:(?:const|noexcept|override|final|mutable)\b\s*)*(?:->\s*[\w:<>,*&\s]+?)?\s*\{")


def _match_close(code: str, i: int, open_: str, close: str) -> int:
    """Index of the bracket closing code[i] (== open_), or -1."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_:
            depth += 1
        elif code[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _enclosing_paren(code: str, i: int) -> int:
    depth = 0
    for j in range(i - 1, -1, -1):
        ch = code[j]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                return j
            depth -= 1
        elif ch in ";{}" and depth == 0:
            return -1
    return -1


def _split_top(s: str, opens: str, closes: str) -> List[str]:
    """Split on commas outside the given bracket pairs."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in opens:
            depth += 1
        elif ch in closes:
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _split_args(s: str) -> List[str]:
    """Top-level comma split ((), [], {} nest; <> do not: `a < b` is common in arguments)."""
    return _split_top(s, "([{", ")]}")


def _split_launch(s: str) -> List[str]:
    """<<<grid, block, smem, stream>>>: template arguments nest here (k<T, std::max(1, 2)>)."""
    return _split_top(s, "([{<", ")]}>")


def _stream_params(code: str) -> Tuple[Set[str], List[Tuple[int, Optional[str], int, int]]]:
    """Names of cudaStream_t parameters, and the definitions: (offset, name or None, body start, body end)."""
    names: Set[str] = set()
    defs: List[Tuple[int, Optional[str], int, int]] = []
    seen_lists: Set[int] = set()
    for m in re.finditer(r"\bcudaStream_t\b", code):
        o = _enclosing_paren(code, m.start())
        if o < 0 or o in seen_lists:
            continue
        seen_lists.add(o)
        c = _match_close(code, o, "(", ")")
        if c < 0:
            continue
        tail = _DEF_TAIL.match(code, c + 1)
        body = (tail.end() - 1, _match_close(code, tail.end() - 1, "{", "}")) if tail else None
        for p in _split_args(code[o + 1:c]):
            pm = _PARAM.match(p)
            if not pm:
                continue
            if pm.group(1):
                names.add(pm.group(1))
            if body and body[1] > 0:
                defs.append((o, pm.group(1), body[0], body[1]))
    # locals copied from a parameter (cudaStream_t s = stream;) are that stream too
    for _ in range(2):
        for m in re.finditer(r"\b(?:cudaStream_t|auto)\s*(?:const\s*)?&?\s*(\w+)\s*(?:=\s*|\{\s*|\(\s*)(\w+)\s*[)}]?\s*;",
                             code):
            if m.group(2) in names:
                names.add(m.group(1))
    return names, defs


def _stream_findings(code: str) -> Iterator[Tuple[str, int, str]]:
    """(check, offset, what was found) for every structural stream rule (Rule.check)."""
    names, defs = _stream_params(code)

    def origin(expr: str, at: int) -> Iterator[Tuple[str, int, str]]:
        e = expr.strip()
        if e in _CONST_STREAMS:
            yield "launch-constant", at, e
        elif e not in names:
            yield "launch-origin", at, e

    for m in re.finditer(r"<<<(.*?)>>>", code, re.DOTALL):
        args = _split_launch(m.group(1))
        if len(args) < 4:
            yield "launch-missing", m.start(), ""
        else:
            yield from origin(args[3], m.start())
    for m in re.finditer(r"(?:\.|->)\s*h?[sS]tream\s*=(?!=)\s*([^;]+);", code):
        yield from origin(m.group(1), m.start())
    for m in re.finditer(r"\b(?:cudaLaunchKernel|cudaLaunchCooperativeKernel|cudaMem\w*Async)\s*\(", code):
        c = _match_close(code, m.end() - 1, "(", ")")
        args = _split_args(code[m.end():c]) if c > 0 else []
        if args and m.group(0).startswith("cudaMem") and re.match(r"\d|cudaMemcpy\w+\Z", args[-1]):  # left off
            yield "launch-origin", m.start(), "the default stream (no stream argument)"
        elif args:
            yield from origin(args[-1], m.start())
    for m in re.finditer(r"\bcudaLaunchConfig_t\s+(\w+)\s*(=\s*)?(\{)?"
                         r"|\bauto\s+(\w+)\s*=\s*(?:::)?cudaLaunchConfig_t\s*\{\s*\}", code):
        name, init = m.group(1) or m.group(4), ""
        w = re.escape(name)
        # only configs that are launched and filled here (not from a helper: NAME(make(...)), NAME = make(...))
        if not re.search(rf"\bcudaLaunchKernelEx\w*\s*\(\s*&\s*{w}\b", code) or \
                re.search(rf"\b{w}\s*\(|\b{w}\s*=\s*(?!\{{)\S", code):
            continue
        if m.group(3):
            c = _match_close(code, m.end() - 1, "{", "}")
            init = code[m.end():c] if c > 0 else ""
        if init.strip():
            d = re.search(r"\.\s*stream\s*=\s*([^,}]+)", init)
            args = _split_args(init)
            if d or len(args) >= 4:  # designated, or positional {grid, block, smem, stream, ...}
                yield from origin(d.group(1) if d else args[3], m.start())
                continue
        if not re.search(rf"\b{re.escape(name)}\s*(?:\.|->)\s*stream\s*=", code):
            yield "config-stream", m.start(), name
    for _, name, b0, b1 in defs:  # inside the function that was handed the stream (names are per function)
        if not name:
            continue
        body = code[b0:b1]
        local = {name} | {m.group(1) for m in re.finditer(
            rf"\b(?:cudaStream_t|auto)\s*(?:const\s*)?&?\s*(\w+)\s*(?:=\s*|\{{\s*|\(\s*){re.escape(name)}\s*[)}}]?\s*;", body)}
        for s in sorted(local):
            w = re.escape(s)
            # a statement `s = ...;` (a declaration `T s = ...` has a type before the name)
            for m in re.finditer(rf"(?:^|(?<=[;{{}}(),]))\s*\b{w}\s*(?:[-+*/|&^]|<<|>>)?=(?!=)", body, re.M):
                yield "stream-reassigned", b0 + m.start() + len(m.group(0)) - len(m.group(0).lstrip()), s
            cmp = (rf"(?<![\w.>])\b{w}\s*(?:==|!=|\?|&&|\|\|)|(?:==|!=|&&|\|\||!)\s*\b{w}\b(?!\s*\()"
                   rf"|\bif\s*\(\s*{w}\s*\)|\bswitch\s*\(\s*{w}\s*\)"
                   rf"|\b(?:reinterpret_cast|static_cast|bit_cast)\s*<\s*(?!(?:const\s+)?cudaStream_t\s*>)[^>]*>\s*\(\s*{w}\s*\)"
                   rf"|\(\s*(?:const\s+)?(?:u?intptr_t|size_t|u?int64_t|u?int32_t|unsigned|long|int|"
                   rf"unsigned\s+long(?:\s+long)?|long\s+long|void\s*\*|char\s*\*)\s*\)\s*{w}\b"
                   rf"|(?<![&\w])&\s*{w}\b")
            for m in re.finditer(cmp, body):
                yield "stream-compare", b0 + m.start(), s
    for o, name, b0, b1 in defs:
        body = code[b0:b1]
        uses = len(re.findall(rf"(?<!\.)(?<!->)\b{re.escape(name)}\b", body)) if name else 0  # not cfg.stream
        voids = len(re.findall(rf"(?:\(\s*void\s*\)|static_cast\s*<\s*void\s*>\s*\()\s*{re.escape(name)}\b",
                               body)) if name else 0
        if uses - voids <= 0:
            yield "stream-unused", o, name or "(unnamed)"


# ------------------------------------------------------------------ scanning

_BY_CHECK = {r.check: r for r in RULES if r.target == "stream"}


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def scan_source(src: str, path: str = "<candidate>") -> List[Finding]:
    """All findings in one source text."""
    code = strip_comments_and_strings(src)
    lines = src.splitlines()
    findings: List[Finding] = []
    seen: Set[Tuple[str, int]] = set()

    def add(r: Rule, line: int, detail: str = "") -> None:
        if (r.rule, line) in seen:
            return
        seen.add((r.rule, line))
        reason = r.reason.format(detail) if "{}" in r.reason else r.reason
        text = lines[line - 1].strip() if line - 1 < len(lines) else ""
        findings.append(Finding(r.rule, r.severity, path, line, text, reason))

    strings = None
    for r in RULES:
        if r.target == "code":
            for m in re.finditer(r.pattern, code):
                name = m.group(0)
                if any(name.strip().startswith(ok) for ok in _DEVICE_OK):
                    continue
                # member calls (obj.open(...), x->send(...)) and namespaced helpers (std::remove)
                # named like libc calls are not libc calls; CUDA API names are never excused
                pre = code[max(0, m.start() - 3):m.start()]
                # `#define cudaStreamPerThread hipStreamPerThread` (production's ROCm shims) uses nothing
                if re.match(r"[ \t]*#[ \t]*define[ \t]+\w+[ \t]+hip\w*[ \t]*$",
                            code[code.rfind("\n", 0, m.start()) + 1:code.find("\n", m.start()) % (len(code) + 1)]):
                    continue
                if r.rule in _LIBC_RULES and (pre.endswith(".") or pre.endswith("->") or (
                        re.search(r"\w::$", pre) and r.rule != "host-time")):  # std::time is time
                    continue
                add(r, _line_of(code, m.start()))
        elif r.target == "string":
            if strings is None:
                strings = list(string_literals(src))
            for off, text in strings:
                if re.search(r.pattern, text, re.M):
                    add(r, _line_of(src, off))
    for check, off, detail in _stream_findings(code):
        add(_BY_CHECK[check], _line_of(code, off), detail)
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


_RANK: Dict[str, int] = {}
for _i, _r in enumerate(RULES):
    _RANK.setdefault(_r.rule, _i)


def summarize(findings: Sequence[Finding]) -> Optional[str]:
    """One line for the most telling rejecting finding (None when nothing rejects).

    RULES is in order of how much a finding says: a created stream is named before the
    unused stream parameter it leaves behind."""
    errs = sorted(errors(findings), key=lambda f: (_RANK.get(f.rule, len(RULES)), f.file, f.line))
    if not errs:
        return None
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"static check: {errs[0].one_line()}{more}"
