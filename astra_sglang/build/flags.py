"""SGLang's compile flags per build profile (its JIT, sgl-kernel's AOT CMake, FlashInfer's JIT)."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

from ..errors import AstraError
from .arch import Arch

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


def compile_flags(profile: str, arch: Arch, extra: Sequence[str] = ()) -> List[str]:
    if profile not in FLAG_PROFILES:
        raise AstraError(f"unknown flag profile {profile!r}")
    arch_flags = ARCH_FLAGS[profile](arch) if profile in ARCH_FLAGS else []
    return [f"-DSGL_CUDA_ARCH={arch.sgl_cuda_arch}", arch.gencode(profile), *FLAG_PROFILES[profile], *arch_flags, *extra]


def kernel_flags(spec, arch: Arch) -> List[str]:
    """The flags a kernel behind `spec`'s ABI is built with, everywhere (check, bench, patch): those of
    the production variant a wheel install extracts by default (the workspace's manifest holds the same)."""
    wheel_roots = {s.root for v in spec.variants if not v.requires_root for s in v.sources}
    wheel_roots |= {r for v in spec.variants if not v.requires_root for r in v.include_roots}
    v = spec.variant(spec.default_variant({r: True for r in wheel_roots}))
    return compile_flags(v.flag_profile, arch, v.extra_flags)
