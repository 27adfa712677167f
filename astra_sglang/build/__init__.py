"""The build: one concern a module, in dependency order (no cycles), after SGLang's
`kernels/jit/utils/compile/`:

  arch       the GPU target (compute capability; nvidia-smi, no torch)
  flags      SGLang's compile flags per build profile; the flags every kernel of an op gets
  nvcc       the toolchain: nvcc, its version, the ninja file, the first error line
  cache      the one cache root ($ASTRA_CACHE_DIR) and content-hashed builds in it
  loader     ctypes calls through the astra ABI
  workspace  one extracted op: sources, flags, manifest, builds
"""
from .arch import Arch, detect_arch, parse_arch, query_gpu
from .cache import ENV_CACHE, BuildResult, build_shared, cache_root, hash_tree
from .flags import ARCH_FLAGS, FLAG_PROFILES, compile_flags, kernel_flags
from .nvcc import find_nvcc, first_error_line, ninja_text, nvcc_version

__all__ = [
    "Arch", "detect_arch", "parse_arch", "query_gpu", "ENV_CACHE", "BuildResult", "build_shared", "cache_root",
    "hash_tree", "ARCH_FLAGS", "FLAG_PROFILES", "compile_flags", "kernel_flags", "find_nvcc", "first_error_line",
    "ninja_text", "nvcc_version",
]
