"""Include-closure scan: ROCm branches skipped, the compiler's quoted/angled lookup order,
external headers recorded rather than copied."""
from __future__ import annotations

from pathlib import Path

import pytest

from astra_sglang.errors import AstraError
from astra_sglang.extract.closure import compute_closure, scan_include_directives, scan_includes
from astra_sglang.extract.sources import Root


def test_rocm_branches_are_skipped():
    text = """
#include "always.h"
#ifdef USE_ROCM
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif
#ifndef USE_ROCM
#include "cuda_only.cuh"
#else
#include "hip_only.cuh"
#endif
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#include "amd1.h"
#elif defined(SOMETHING_ELSE)
#include "other.h"
#else
#include "cuda2.h"
#endif
#if !defined(USE_ROCM)
#include "cuda3.h"
#endif
#if USE_ROCM
#include "amd2.h"
#endif
#if defined(USE_ROCM) && FOO
#include "compound.h"
#endif
  #  include   "spaced.h"
"""
    assert scan_includes(text) == [
        "always.h",
        "cuda_runtime.h",  # #else of #ifdef USE_ROCM
        "cuda_only.cuh",  # #ifndef USE_ROCM
        "other.h",  # an #elif on another macro is not the ROCm side
        "cuda2.h",  # #else of a HIP condition
        "cuda3.h",  # #if !defined(USE_ROCM)
        "compound.h",  # a compound condition is kept: copying too much is safe, too little is not
        "spaced.h",
    ]


def test_nested_conditionals_inside_rocm_branch():
    text = """
#ifdef USE_ROCM
#if 1
#include "deep_amd.h"
#endif
#include "amd.h"
#endif
#include "after.h"
"""
    assert scan_includes(text) == ["after.h"]


def test_directive_kinds():
    assert scan_include_directives('#include "a.h"\n#include <b.h>\n') == [("a.h", False), ("b.h", True)]


def _tree(tmp: Path, files: dict) -> None:
    for rel, text in files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_quoted_finds_sibling_first_angled_skips_it(tmp_path):
    _tree(tmp_path, {
        "r1/inc/lib/top.h": '#include "util.h"\n#include <util.h>\n#include <cuda_runtime.h>\n',
        "r1/inc/lib/util.h": "// sibling of top.h\n",
        "r1/inc/util.h": "// on the include path\n",
    })
    r1 = Root("r1", tmp_path / "r1", ("inc",))
    cl = compute_closure([(r1, "inc/lib/top.h")], [r1])
    assert ("r1", "inc/lib/util.h") in cl.files  # quoted: the including file's directory first
    assert ("r1", "inc/util.h") in cl.files  # angled: only the include path
    assert "cuda_runtime.h" in cl.external and not any("cuda_runtime" in k[1] for k in cl.files)


def test_roots_searched_in_order_and_externals_recorded(tmp_path):
    _tree(tmp_path, {
        "a/include/k.cuh": '#include "common.h"\n#include "only_b.h"\n#include <cublasLt.h>\n',
        "a/include/sub/common.h": "",
        "b/common.h": "// b's copy\n",
        "b/only_b.h": '#include "nested/deep.h"\n',
        "b/nested/deep.h": "#include <vector>\n",
        "a/include/common.h": "// a's copy\n",
    })
    a = Root("a", tmp_path / "a", ("include",))
    b = Root("b", tmp_path / "b", (".",))
    cl = compute_closure([(a, "include/k.cuh")], [a, b])
    assert ("a", "include/common.h") in cl.files and ("b", "common.h") not in cl.files
    assert ("b", "only_b.h") in cl.files and ("b", "nested/deep.h") in cl.files
    assert {"cublasLt.h", "vector"} <= cl.external
    # the other order: b's copy wins for an include that is not relative to the includer
    cl2 = compute_closure([(b, "only_b.h")], [b, a])
    assert ("b", "nested/deep.h") in cl2.files


def test_missing_start_file_is_a_clear_error(tmp_path):
    r = Root("r", tmp_path, (".",), "9.9", "wheel-dir")
    with pytest.raises(AstraError, match="not found under"):
        compute_closure([(r, "nope.cuh")], [r])
