"""nvcc builds of baselines and candidates: SGLang's flags, a ninja file, a content-hashed cache.

Every kernel (baseline or candidate) is one .cu that includes production headers
from the workspace's src/ tree and exports the op's `astra_<op>` entry point.
It is built into a shared library with nvcc alone (no torch headers), so it
compiles in CI without a GPU and loads with ctypes on one.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import AstraError

# SGLang's JIT loader: arch.get_default_target_flags() + DEFAULT_CFLAGS + base_cuda_flags().
# (sglang/kernels/jit/utils/{arch.py,compile/paths.py,compile/toolchain.py}, 0.5.23)
_JIT = ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC"]
# sgl-kernel's CMake build (AOT), sgl-kernel/CMakeLists.txt SGL_KERNEL_CUDA_FLAGS as of
# sglang-kernel 0.4.10 (the build sglang 0.5.23 pins): C++17, -O3, -DNDEBUG, relaxed
# constexpr + extended lambdas, -maxrregcount=128, the FlashInfer dtype switches
# (BF16 and FP8 are CMake options, ON by default), the CUTLASS defines. The
# __CUDA_NO_HALF* macros torch's extension builders define are undefined so
# FlashInfer's headers compile (no torch header is on our compile path, so the -U
# flags only guarantee it). Fast math is arch-dependent: see ARCH_FLAGS.
_AOT = [
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "-DOPERATOR_NAMESPACE=sgl-kernel",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-maxrregcount=128",
    "-DFLASHINFER_ENABLE_F16",
    "-DFLASHINFER_ENABLE_BF16",
    "-DFLASHINFER_ENABLE_FP8",
    "-DFLASHINFER_ENABLE_FP8_E4M3",
    "-DFLASHINFER_ENABLE_FP8_E5M2",
    "-DCUTE_USE_PACKED_TUPLE=1",
    "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
    "-DCUTLASS_VERSIONS_GENERATED",
    "-DCUTLASS_TEST_LEVEL=0",
    "-DCUTLASS_TEST_ENABLE_CACHED_RESULTS=1",
    "-DCUTLASS_DEBUG_TRACE_LEVEL=0",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-Xcompiler",
    "-fPIC",
]
# FlashInfer's own JIT (flashinfer/jit/core.py gen_jit_spec + jit/cpp_ext.py
# build_cuda_cflags, flashinfer-python 0.7.2): what flashinfer.cascade.merge_state and
# flashinfer.norm's CUDA path compile with. (-static-global-template-stub=false, added
# for nvcc >= 12.8, only changes host-side stub linkage and is left out.)
_FLASHINFER_JIT = [
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "-use_fast_math",
    "--expt-relaxed-constexpr",
    "-DFLASHINFER_ENABLE_F16",
    "-DFLASHINFER_ENABLE_BF16",
    "-DFLASHINFER_ENABLE_FP8_E4M3",
    "-DFLASHINFER_ENABLE_FP8_E5M2",
    "-DFLASHINFER_ENABLE_FP8_E8M0",
    "-DFLASHINFER_ENABLE_FP4_E2M1",
    "-Xcompiler",
    "-fPIC",
]


def _aot_arch_flags(arch: "Arch") -> List[str]:
    # sgl_kernel/load_utils.py loads sm90/common_ops (built with -use_fast_math) only on
    # compute capability 9.0; every other GPU gets sm100/common_ops (precise math).
    return ["-use_fast_math"] if (arch.major, arch.minor) == (9, 0) else []


FLAG_PROFILES: Dict[str, List[str]] = {
    "sglang_jit": _JIT,
    "sgl_kernel_aot": _AOT,
    "flashinfer_jit": _FLASHINFER_JIT,
}
# Flags a profile adds as a function of the target arch.
ARCH_FLAGS: Dict[str, Callable[["Arch"], List[str]]] = {"sgl_kernel_aot": _aot_arch_flags}
# Where nvcc is looked for when neither CUDA_HOME/CUDA_PATH nor PATH has it.
FALLBACK_NVCC: Tuple[str, ...] = ("/usr/local/cuda/bin/nvcc",)


@dataclass(frozen=True)
class Arch:
    major: int
    minor: int

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"

    @property
    def sgl_cuda_arch(self) -> int:
        return self.major * 100 + self.minor * 10

    def gencode(self, profile: str) -> str:
        # SGLang's JIT targets the arch-specific 'a' variant on 9.x and 10.x+
        # (arch._cuda_arch_suffix); sgl-kernel's wheel is built for sm_90a too.
        suffix = "a" if self.major >= 9 else ""
        t = f"{self.major}{self.minor}{suffix}"
        return f"-gencode=arch=compute_{t},code=sm_{t}"


def parse_arch(text: str) -> Arch:
    m = re.fullmatch(r"(?:sm_?)?(\d+)(\d)a?|(\d+)\.(\d+)", text.strip().lower())
    if not m:
        raise AstraError(f"unsupported arch {text!r}; give it as sm_90 (or 9.0)")
    major, minor = (int(m.group(1)), int(m.group(2))) if m.group(1) else (int(m.group(3)), int(m.group(4)))
    if major < 8:
        raise AstraError(f"unsupported arch sm_{major}{minor}: SGLang's kernels need sm_80 or newer")
    return Arch(major, minor)


def query_gpu(fields: str) -> Optional[str]:
    """First GPU's `nvidia-smi --query-gpu=FIELDS` as one CSV line; None without a usable nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (subprocess.SubprocessError, OSError):
        return None
    return out[0].strip() if out and out[0].strip() else None


def detect_arch() -> Arch:
    """The local GPU's compute capability, via nvidia-smi (no torch needed)."""
    cap = query_gpu("compute_cap")
    if cap:
        return parse_arch(cap)
    raise AstraError("no GPU found to detect the arch from; pass --arch sm_90 to build without a GPU")


def find_nvcc() -> str:
    cand = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cand and (Path(cand) / "bin" / "nvcc").exists():
        return str(Path(cand) / "bin" / "nvcc")
    path = shutil.which("nvcc") or next((p for p in FALLBACK_NVCC if Path(p).exists()), None)
    if not path:
        raise AstraError("nvcc not found: install the CUDA toolkit (nvcc ≥ 12.4) or set CUDA_HOME")
    return path


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def compile_flags(profile: str, arch: Arch, extra: Sequence[str] = ()) -> List[str]:
    if profile not in FLAG_PROFILES:
        raise AstraError(f"unknown flag profile {profile!r}")
    arch_flags = ARCH_FLAGS[profile](arch) if profile in ARCH_FLAGS else []
    return [f"-DSGL_CUDA_ARCH={arch.sgl_cuda_arch}", arch.gencode(profile), *FLAG_PROFILES[profile], *arch_flags, *extra]


_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.MULTILINE)


def hash_tree(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p).encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@dataclass
class BuildResult:
    ok: bool
    library: Optional[Path]
    seconds: float
    cached: bool
    log: str
    command: List[str]


def ninja_text(nvcc: str, flags: Sequence[str], includes: Sequence[str], out: str, source: str, comment: str) -> str:
    """A ninja file that builds `source` into the shared library `out` with nvcc."""
    def q(s: str) -> str:
        return s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")

    return (
        f"# {comment}\n"
        f"nvcc = {nvcc}\n"
        f"flags = {' '.join(flags)} {' '.join('-I' + i for i in includes)}\n"
        "rule nvcc_shared\n"
        "  command = $nvcc $flags -shared $in -o $out\n"
        "  description = nvcc $in\n"
        f"build {q(out)}: nvcc_shared {q(source)}\n"
        f"default {q(out)}\n"
    )


def build_shared(
    source: Path,
    include_dirs: Sequence[Path],
    flags: Sequence[str],
    cache_dir: Path,
    closure_hash: str,
    timeout: float = 600.0,
) -> BuildResult:
    """Compile `source` into a shared library, reusing a cached build of identical inputs.

    The cache key covers the source text, the workspace's include-closure hash, the
    flags and the nvcc version, so any change rebuilds and nothing else does.
    """
    nvcc = find_nvcc()
    source = Path(source).resolve()
    key_src = "\n".join(
        [source.read_text(errors="replace"), closure_hash, " ".join(flags), nvcc_version(nvcc)]
        + [str(Path(i).resolve()) for i in include_dirs]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    cache_dir.mkdir(parents=True, exist_ok=True)
    lib = cache_dir / f"{source.stem}-{key}.so"
    if lib.exists():
        return BuildResult(True, lib, 0.0, True, "", [])
    includes = [str(Path(i).resolve()) for i in include_dirs]
    tmp = cache_dir / f".{lib.name}.{os.getpid()}.tmp.so"
    cmd = [nvcc, *flags, *("-I" + i for i in includes), "-shared", str(source), "-o", str(tmp)]
    # how this cached library was built, rerunnable by hand
    (cache_dir / f"{lib.stem}.ninja").write_text(
        ninja_text(nvcc, flags, includes, str(lib), str(source), "generated by astra-sglang: one shared library per kernel source"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return BuildResult(False, None, time.perf_counter() - t0, False, f"nvcc timed out after {timeout:.0f}s", cmd)
    dt = time.perf_counter() - t0
    log = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return BuildResult(False, None, dt, False, log, cmd)
    os.replace(tmp, lib)  # atomic: concurrent builders never see half a library
    return BuildResult(True, lib, dt, False, log, cmd)


def first_error_line(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()
    return (log.strip().splitlines() or ["unknown build failure"])[0]
