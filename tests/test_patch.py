"""patch/: discovery over the real sglang wheels, patch application in real SGLang modules
(on CPU, see sglang_cpu_env.py), counters, the kill switch, self-check, activation paths.

Where a real module is used: sglang 0.5.23's activation.py, layernorm.py,
attention/merge_state.py, kernels/ops/activation/activation.py and srt/plugins (imported
for real with stubbed heavy dependencies). Where a synthetic package is used, and why:
the start-up hook and `patch --serve` need `import sglang` / `python -m
sglang.launch_server` to run, and sglang/__init__.py cannot import without SGLang's full
dependency set, so those tests use a tiny package named `sglang` whose modules bind
`from sgl_kernel import silu_and_mul` the way SGLang's do.

No kernel is launched on CPU: the astra kernels are stood in for by torch code
(TorchBackend), and the one test that loads a real built kernel checks it is never called.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from astra_sglang.registry import get_op, op_names, op_part

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
STARTUP = ROOT / "patch" / "_startup"


def _env(extra=None, pythonpath=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRA_SGLANG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] + [str(TESTS)])
    env.update(extra or {})
    return env


def run_child(code: str, env=None, pythonpath=(), timeout=300):
    """Run `code` in a fresh interpreter; it prints one JSON line last. Returns (json, proc)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=_env(env, pythonpath), timeout=timeout, cwd=str(ROOT))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"child failed (rc {proc.returncode}):\nSTDOUT:\n{proc.stdout[-3000:]}\n"
                             f"STDERR:\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1]), proc


@pytest.fixture(scope="module")
def sglang_root(wheel_sources):
    return Path(wheel_sources["sglang"])


@pytest.fixture(scope="module")
def discovery(sglang_root):
    from astra_sglang.patch.discover import discover_for_specs
    from astra_sglang.registry import get_op, op_names

    return discover_for_specs([get_op(o) for o in op_names()], roots={"sglang": sglang_root / "sglang"})


@pytest.fixture(scope="module")
def discovery_0_5_17(sglang_0_5_17_source):
    from astra_sglang.patch.discover import discover_for_specs
    from astra_sglang.registry import get_op, op_names

    return discover_for_specs([get_op(o) for o in op_names()], roots={"sglang": Path(sglang_0_5_17_source) / "sglang"})


@pytest.fixture(params=["0.5.23", "0.5.17"])
def sglang_tree(request):
    """(root holding sglang/, its discovery) for both SGLang versions the project supports."""
    if request.param == "0.5.23":
        return request.getfixturevalue("sglang_root"), request.getfixturevalue("discovery")
    return Path(request.getfixturevalue("sglang_0_5_17_source")), request.getfixturevalue("discovery_0_5_17")


def _sites(disc, op, kind):
    return {(s.module, s.local_name) for s in disc.for_op(op, kind)}


# ---------------------------------------------------------------------- discovery
def test_discovery_finds_real_import_sites(discovery):
    assert discovery.versions["sglang"] == "0.5.23"
    silu = _sites(discovery, "silu_and_mul", "import_binding")
    # sglang/srt/layers/activation.py binds both production paths under aliases, at import time
    assert ("sglang.srt.layers.activation", "_sgl_silu_and_mul") in silu
    assert ("sglang.srt.layers.activation", "_jit_silu_and_mul") in silu
    assert ("sglang.srt.layers.moe.cutlass_moe", "silu_and_mul") in silu
    assert ("sglang.srt.layers.activation", "silu_and_mul") in _sites(discovery, "silu_and_mul", "definition")
    assert ("sglang.kernels.ops.activation.activation", "silu_and_mul") in _sites(discovery, "silu_and_mul", "definition")
    # imports inside function bodies: looked up at call time
    assert ("sglang.kernels.ops.activation", "jit_silu_and_mul") in _sites(discovery, "silu_and_mul", "call_time_import")
    # the JIT module factory of the production activation kernel
    assert ("sglang.kernels.ops.activation.activation", "activation_module") in _sites(discovery, "silu_and_mul", "jit_factory")
    # sglang/srt/layers/layernorm.py: `from sgl_kernel import (fused_add_rmsnorm, ...)` under `if _is_cuda ...`
    rms = [s for s in discovery.for_op("fused_add_rmsnorm", "import_binding") if s.module == "sglang.srt.layers.layernorm"]
    assert rms and rms[0].local_name == "fused_add_rmsnorm" and "_is_cuda" in rms[0].guard
    assert rms[0].path.endswith("sglang/srt/layers/layernorm.py")
    assert ("sglang.kernels.ops.layernorm.norm", "_jit_fused_add_rmsnorm_module") in _sites(
        discovery, "fused_add_rmsnorm", "jit_factory")
    merge = _sites(discovery, "merge_state", "import_binding")
    assert ("sglang.srt.layers.attention.merge_state", "merge_state_v2") in merge
    assert ("sglang.srt.layers.attention.flashattention_backend", "merge_state_v2") in merge


def test_discovery_roundtrips(discovery):
    from astra_sglang.patch.discover import Discovery

    assert Discovery.from_json(discovery.to_json()).sites == discovery.sites


def test_discovery_kinds_and_reexports(tmp_path):
    """Every kind of site on a small synthetic tree, including a re-export chain."""
    from astra_sglang.patch.discover import discover_for_specs
    from astra_sglang.registry import get_op

    pkg = tmp_path / "sglang"
    pkg.mkdir()
    files = {
        "__init__.py": "",
        "a.py": "if _is_cuda:\n    from sgl_kernel import silu_and_mul\n",
        "b.py": "from sglang.a import silu_and_mul as s2\n",
        "c.py": "from .b import s2\n",
        "d.py": "import sglang.a as A\ndef f(x):\n    return A.silu_and_mul(x)\n",
        "e.py": "def g(x):\n    from sgl_kernel import silu_and_mul\n    return silu_and_mul(x)\n",
        "f.py": "import torch\ndef h(x):\n    return torch.ops.sgl_kernel.silu_and_mul.default(x)\n",
        "unrelated.py": "silu_and_mul_clamp = 1\n",
    }
    for n, t in files.items():
        (pkg / n).write_text(t)
    d = discover_for_specs([get_op("silu_and_mul")], roots={"sglang": pkg})
    got = {(s.kind, s.module, s.local_name, s.guard) for s in d.sites}
    assert ("import_binding", "sglang.a", "silu_and_mul", "if _is_cuda") in got
    assert ("import_binding", "sglang.b", "s2", "") in got
    assert ("import_binding", "sglang.c", "s2", "") in got  # relative import of a re-export
    assert ("attribute_lookup", "sglang.d", "silu_and_mul", "") in got
    assert ("call_time_import", "sglang.e", "silu_and_mul", "") in got
    assert ("torch_op", "sglang.f", "silu_and_mul", "") in got
    assert {s.target for s in d.sites if s.kind != "torch_op"} == {"sgl_kernel:silu_and_mul"}
    assert d.files_scanned == 6  # unrelated.py is not parsed


def test_discovery_sglang_0_5_17(discovery_0_5_17):
    d = discovery_0_5_17
    assert d.versions["sglang"] == "0.5.17"
    silu = _sites(d, "silu_and_mul", "import_binding")
    assert ("sglang.srt.layers.activation", "_sgl_silu_and_mul") in silu
    assert ("sglang.srt.layers.activation", "_jit_silu_and_mul") in silu
    assert any(m == "sglang.srt.layers.layernorm" for m, _ in _sites(d, "fused_add_rmsnorm", "import_binding"))
    assert ("sglang.srt.layers.attention.merge_state", "merge_state_v2") in _sites(d, "merge_state", "import_binding")


@pytest.mark.parametrize("which", ["0.5.23", "0.5.17"])
def test_sglang_has_the_plugin_entry_point(which, request):
    """Both versions run `load_plugins()` (group sglang.srt.plugins) first thing in every scheduler process."""
    if which == "0.5.23":
        root = Path(request.getfixturevalue("wheel_sources")["sglang"])
    else:
        root = Path(request.getfixturevalue("sglang_0_5_17_source"))
    plugins = (root / "sglang/srt/plugins/__init__.py").read_text()
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in plugins
    sched = (root / "sglang/srt/managers/scheduler.py").read_text()
    body = sched[sched.index("def run_scheduler_process("):]
    assert "load_plugins()" in body[:1500]
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["sglang.srt.plugins"]
    assert eps == {"astra_sglang": "astra_sglang.patch.hook:sglang_plugin"}


def test_dry_run_report(sglang_root):
    env = _env({"ASTRA_CACHE_DIR": str(sglang_root.parent / "patch-cache")}, [sglang_root])
    cmd = [sys.executable, "-m", "astra_sglang.cli", "patch", "--dry-run", "--", "--model-path", "/m", "--port", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "sglang 0.5.23" in out
    assert "sglang.srt.layers.layernorm" in out
    assert "_sgl_silu_and_mul" not in out  # silu_and_mul is off by default (its adapter's DEFAULT_OFF)
    # an op that is off by default is named to patch it; its sites are reported then
    ps = subprocess.run(cmd[:5] + ["--ops", "all,silu_and_mul"] + cmd[5:], capture_output=True, text=True, env=env,
                        timeout=300)
    assert ps.returncode == 0, ps.stderr
    assert "sglang.srt.layers.activation:62" in ps.stdout
    assert "_sgl_silu_and_mul <- sgl_kernel:silu_and_mul" in ps.stdout
    assert "activation_module() [elementwise/activation.cuh]" in ps.stdout and "routes run_activation" in ps.stdout
    from astra_sglang.patch import patchable_ops
    from astra_sglang.patch.config import default_ops

    # every op with an adapter, but those whose adapter says why they stay off by default
    assert f"ASTRA_SGLANG_OPS={','.join(default_ops(patchable_ops()))}" in out
    assert "-m sglang.launch_server --model-path /m --port 1" in out
    assert "nothing built, nothing started" in out
    pj = subprocess.run(cmd[:5] + ["--json", "--ops", "merge_state"], capture_output=True, text=True, env=env,
                        timeout=300)
    assert pj.returncode == 0, pj.stderr
    data = json.loads(pj.stdout)
    assert data["ops"] == ["merge_state"]
    assert any(s["module"] == "sglang.srt.layers.attention.merge_state" for s in data["discovery"]["sites"])


# ---------------------------------------------------------------------- real modules, patched
_REAL_PRELUDE = """
import json, os, sys
import sglang_cpu_env as E
E.install({root!r})
import torch
from astra_sglang.patch import apply_astra_kernels, revert_astra_kernels, counters
"""


def test_patch_real_modules_imported_before(sglang_tree, tmp_path):
    sglang_root, discovery = sglang_tree
    plan = tmp_path / "plan.json"  # what `patch --serve` hands its server: the JIT factories to wrap
    plan.write_text(discovery.to_json())
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import sglang.srt.layers.activation as A
import sglang.srt.layers.layernorm as L
import sglang.srt.layers.attention.merge_state as M
import sglang.kernels.ops.activation.activation as J
sk = sys.modules["sgl_kernel"]
orig = {{"A._sgl": A._sgl_silu_and_mul, "A._jit": A._jit_silu_and_mul, "A.silu": A.silu_and_mul,
        "L.rms": L.fused_add_rmsnorm, "M.v2": M.merge_state_v2, "J.silu": J.silu_and_mul,
        "J.factory": J.activation_module}}
A._jit_act_max_vec_bytes = 1 << 20   # route the layer to sgl_kernel (the JIT one cannot run on CPU)
L.is_batch_invariant_mode_enabled = lambda: False
p = apply_astra_kernels(backends=E.astra_standins(), counter_dir={str(tmp_path)!r}, propagate=False,
                        plan={str(plan)!r})
patched = {{k: getattr(v, "__astra_op__", None) for k, v in {{
    "A._sgl": A._sgl_silu_and_mul, "A._jit": A._jit_silu_and_mul, "A.silu": A.silu_and_mul,
    "L.rms": L.fused_add_rmsnorm, "M.v2": M.merge_state_v2, "J.silu": J.silu_and_mul,
    "J.factory": J.activation_module}}.items()}}
g = torch.Generator().manual_seed(0)
x = torch.randn(8, 64, generator=g)
y = A.SiluAndMul().forward_cuda(x)
ref = torch.nn.functional.silu(x[:, :32]) * x[:, 32:]
n = L.RMSNorm(64); n.weight.data.copy_(torch.rand(64, generator=g) + 0.5)
h, r = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g)
ho, ro = n.forward_cuda(h.clone(), r.clone())
s = h + r
href = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * n.weight.data
va, vb = torch.randn(8, 4, 16, generator=g), torch.randn(8, 4, 16, generator=g)
sa, sb = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
v, lse = M.merge_state(va, sa, vb, sb)
# the JIT factory: the module it returns routes run_activation("silu") to the astra op
xo = torch.empty(8, 32)
J.activation_module(torch.float32).run_activation(x, xo, "silu")
c = counters({str(tmp_path)!r})
summary = p.summary()
revert_astra_kernels()
from sglang.srt.plugins.hook_registry import HookRegistry
ours_left = [t for t, hs in HookRegistry._hooks.items() if any(s and s.plugin_name == "astra_sglang" for _, _, s in hs)]
restored = A._sgl_silu_and_mul is orig["A._sgl"] and L.fused_add_rmsnorm is orig["L.rms"] and \\
    M.merge_state_v2 is orig["M.v2"] and J.activation_module is orig["J.factory"] and A.silu_and_mul is orig["A.silu"]
print(json.dumps(dict(patched=patched, counters=c, restored=restored, sk_calls=sk.calls,
    silu_ok=bool(torch.allclose(y, ref, atol=1e-5)), rms_ok=bool(torch.allclose(ho, href, atol=1e-4))
    and bool(torch.allclose(ro, s)), merge_ok=bool(torch.allclose(lse, torch.logaddexp(sa, sb), atol=1e-5)),
    jit_ok=bool(torch.allclose(xo, ref, atol=1e-5)), ours_left=ours_left,
    via={{t: s["via"] for op in summary.values() for t, s in op["targets"].items() if s["state"] == "patched"}},
    rebound=summary["silu_and_mul"]["targets"]["sgl_kernel:silu_and_mul"]["rebound"])))
""")
    assert set(res["patched"].values()) >= {"silu_and_mul", "fused_add_rmsnorm", "merge_state"}
    assert all(v is not None for v in res["patched"].values()), res["patched"]
    assert "sglang.srt.layers.activation:_sgl_silu_and_mul" in res["rebound"]
    # SGLang's own HookRegistry replaced every target (and rebound the `from X import Y` copies)
    assert res["via"] and set(res["via"].values()) == {"sglang HookRegistry"}, res["via"]
    assert res["ours_left"] == []  # revert withdrew our hooks
    assert res["silu_ok"] and res["rms_ok"] and res["merge_ok"] and res["jit_ok"]
    c = res["counters"]
    # SiluAndMul once + the JIT module once; each first use self-checked against the original
    assert c["silu_and_mul"]["calls"] == 2 and c["silu_and_mul"]["checks_passed"] >= 1
    assert c["fused_add_rmsnorm"]["calls"] == 1 and c["fused_add_rmsnorm"]["checks_passed"] == 1
    assert c["merge_state"]["calls"] == 1 and c["merge_state"]["checks_passed"] == 1
    assert all(v["checks_failed"] == 0 and v["disabled"] == 0 for v in c.values())
    # the production stand-ins ran only inside the self-checks
    assert {k: n for k, n in res["sk_calls"].items() if n} == {"silu_and_mul": 1, "fused_add_rmsnorm": 1,
                                                                "merge_state_v2": 1}
    assert res["restored"]


def test_install_through_sglangs_registry_rebinds_an_alias_in_the_defining_module(sglang_root, tmp_path):
    """SGLang's REPLACE hook propagates to other modules' `from X import Y` copies but skips the defining module:
    topk.py's `biased_grouped_topk = biased_grouped_topk_gpu` (what select_experts calls) kept the original until
    install swept it too (validate reached no patched callable, 2026-11-27)."""
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + """
import types
from astra_sglang.patch.install import install, uninstall, VIA_SGLANG
m = types.ModuleType("astra_alias_probe")
def f(x):
    return "original"
m.f = m.g = f
sys.modules[m.__name__] = m
orig = m.f
def ours(x):
    return "ours"
inst = install(m, "f", orig, ours)
after = dict(via=inst.via, f=m.f(0), g=m.g(0), alias_rebound=f"{m.__name__}:g" in inst.rebound)
uninstall(inst)
print(json.dumps(dict(after=after, restored=m.f is orig and m.g is orig)))
""")
    assert res["after"] == {"via": "sglang HookRegistry", "f": "ours", "g": "ours", "alias_rebound": True}
    assert res["restored"]


def test_jit_factory_routes_only_the_ops_contract(sglang_root, discovery, tmp_path):
    """sglang.kernels.ops.layernorm.norm: the JIT fused_add_rmsnorm module built with
    cast_x_before_out_mul=False is routed to the astra op; the HF-parity build (True) is not."""
    plan = tmp_path / "plan.json"
    plan.write_text(discovery.to_json())
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import sglang.kernels.ops.layernorm.norm as N
real = N._jit_fused_add_rmsnorm_module
built = []
N._jit_fused_add_rmsnorm_module = lambda *a, **k: built.append((a, k)) or (_ for _ in ()).throw(RuntimeError("JIT"))
N._jit_fused_add_rmsnorm_module.__wrapped__ = real
apply_astra_kernels(["fused_add_rmsnorm"], backends=E.astra_standins(), counter_dir={str(tmp_path)!r},
                    propagate=False, self_check="off", plan={str(plan)!r})
x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.rand(64) + 0.5
s = x + r
N.fused_add_rmsnorm(x, r, w, 1e-6)                      # the public JIT entry, default build
ok = bool(torch.allclose(r, s)) and bool(torch.allclose(x, s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w, atol=1e-5))
try:
    N.fused_add_rmsnorm(x, r, w, 1e-6, cast_x_before_out_mul=True)
    hf = "astra"
except RuntimeError:
    hf = "original"
print(json.dumps(dict(ok=ok, hf=hf, built=len(built), c=counters({str(tmp_path)!r})["fused_add_rmsnorm"])))
""")
    assert res["ok"] and res["hf"] == "original" and res["built"] == 1
    assert res["c"]["calls"] == 1


def test_patch_real_modules_imported_after(sglang_root, tmp_path):
    """Apply first: modules imported later are rebound as they finish importing."""
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
p = apply_astra_kernels(["fused_add_rmsnorm", "merge_state"], backends=E.astra_standins(),
                        counter_dir={str(tmp_path)!r}, propagate=False, self_check="off")
assert "sglang.srt.layers.layernorm" not in sys.modules
import sglang.srt.layers.layernorm as L
import sglang.srt.layers.attention.merge_state as M
L.is_batch_invariant_mode_enabled = lambda: False
n = L.RMSNorm(32)
n.forward_cuda(torch.randn(3, 32), torch.randn(3, 32))
M.merge_state(torch.randn(2, 2, 8), torch.randn(2, 2), torch.randn(2, 2, 8), torch.randn(2, 2))
print(json.dumps(dict(rms=getattr(L.fused_add_rmsnorm, "__astra_op__", None),
                      via=getattr(L.fused_add_rmsnorm, "__astra_via__", None),
                      v2=getattr(M.merge_state_v2, "__astra_op__", None), counters=counters({str(tmp_path)!r}),
                      sk=sys.modules["sgl_kernel"].calls)))
""")
    assert res["rms"] == "fused_add_rmsnorm" and res["v2"] == "merge_state"
    assert res["via"] == "sglang HookRegistry"  # handed to SGLang's API when its module was imported
    assert res["counters"]["fused_add_rmsnorm"]["calls"] == 1 and res["counters"]["merge_state"]["calls"] == 1
    assert res["sk"]["fused_add_rmsnorm"] == 0 and res["sk"]["merge_state_v2"] == 0  # self_check off: no original ran


def test_self_check_mismatch_disables_the_op(sglang_root, tmp_path):
    res, proc = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import sglang.srt.layers.layernorm as L
L.is_batch_invariant_mode_enabled = lambda: False
apply_astra_kernels(["fused_add_rmsnorm"], backends=E.astra_standins(wrong={{"fused_add_rmsnorm"}}),
                    counter_dir={str(tmp_path)!r}, propagate=False)
g = torch.Generator().manual_seed(1)
n = L.RMSNorm(64)
h, r = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)
outs = [n.forward_cuda(h.clone(), r.clone()) for _ in range(3)]
s = h + r
ok = all(torch.allclose(o[1], s) and torch.allclose(o[0], s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6),
         atol=1e-4) for o in outs)
from astra_sglang.patch.counters import read_counters
st = read_counters({str(tmp_path)!r})[0].status["fused_add_rmsnorm"]
assert st["targets"]["sglang.srt.layers.layernorm:fused_add_rmsnorm"].startswith("patched"), st
print(json.dumps(dict(ok=ok, counters=counters({str(tmp_path)!r}), status=st)))
""")
    c = res["counters"]["fused_add_rmsnorm"]
    assert res["ok"], "a wrong kernel served tokens: the original's result must be returned"
    assert c["checks_failed"] == 1 and c["disabled"] == 1 and c["fallbacks"] == 2
    assert res["status"]["state"] == "disabled" and "residual" in res["status"]["reason"]
    assert "PATCH DISABLED for fused_add_rmsnorm" in proc.stderr


@pytest.mark.parametrize("drill,title,disabled", [
    ("fused_add_rmsnorm@TP1", "sglang::scheduler_TP1", True),      # the named rank: its self-check fails
    ("fused_add_rmsnorm@TP1", "sglang::scheduler_TP0", False),     # another rank: untouched
    ("silu_and_mul", "sglang::scheduler_TP1", False),              # another op
])
def test_fault_drill_fails_one_ranks_self_check(sglang_root, tmp_path, drill, title, disabled):
    """ASTRA_SGLANG_FAULT_DRILL: a correct kernel's output is corrupted after it ran, in the named rank
    only; the real failure path follows (mismatch, original's result served, op disabled, loudly)."""
    res, proc = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import astra_sglang.patch.counters
CNT = sys.modules["astra_sglang.patch.counters"]         # (the package exports a counters() function too)
CNT._title = lambda pid="self": {title!r}                      # as SGLang titles a scheduler process
import sglang.srt.layers.layernorm as L
L.is_batch_invariant_mode_enabled = lambda: False
apply_astra_kernels(["fused_add_rmsnorm"], backends=E.astra_standins(), counter_dir={str(tmp_path)!r},
                    propagate=False)
g = torch.Generator().manual_seed(1)
n = L.RMSNorm(64)
h, r = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g)
o = n.forward_cuda(h.clone(), r.clone())
s = h + r
ok = torch.allclose(o[1], s) and torch.allclose(o[0], s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6), atol=1e-4)
p = CNT.read_counters({str(tmp_path)!r})[0]
print(json.dumps(dict(ok=bool(ok), counters=counters({str(tmp_path)!r}), status=p.status["fused_add_rmsnorm"], rank=p.rank)))
""", env={"ASTRA_SGLANG_FAULT_DRILL": drill})
    c = res["counters"]["fused_add_rmsnorm"]
    assert res["ok"], "the drill must never serve a wrong result"
    assert res["rank"] == title.split("_")[-1]
    assert c["disabled"] == int(disabled) and c["checks_failed"] == int(disabled)
    assert c["checks_passed"] == int(not disabled)
    if disabled:
        assert res["status"]["state"] == "disabled" and "self-check mismatch" in res["status"]["reason"]
        assert f"PATCH DISABLED for fused_add_rmsnorm in pid" in proc.stderr and "(TP1)" in proc.stderr


def test_jit_silu_extra_arguments_fall_back(sglang_root, tmp_path):
    """The JIT silu_and_mul's MoE arguments, strided views and other dtypes are not the op's
    contract: SGLang's original gets those calls (on CPU it then raises, which shows it ran)."""
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import sglang.kernels.ops.activation.activation as J
apply_astra_kernels(["silu_and_mul"], backends=E.astra_standins(), counter_dir={str(tmp_path)!r}, propagate=False,
                    self_check="off")
x = torch.randn(4, 16)
reached_original = []
for args in [(x, None, torch.zeros(4, dtype=torch.int32), 1), (x.t().contiguous().t(),), (x.to(torch.int32),)]:
    try:
        J.silu_and_mul(*args)
        reached_original.append(False)
    except Exception:
        reached_original.append(True)   # SGLang's CUDA-only custom op refused the CPU call
y = J.silu_and_mul(x)
ok = bool(torch.allclose(y, torch.nn.functional.silu(x[:, :8]) * x[:, 8:], atol=1e-6))
print(json.dumps(dict(reached=reached_original, ok=ok, counters=counters({str(tmp_path)!r}))))
""")
    c = res["counters"]["silu_and_mul"]
    assert res["reached"] == [True, True, True] and res["ok"]
    assert c["calls"] == 1 and c["fallbacks"] == 3


def test_own_rebinding_only_where_hook_registry_cannot_reach(sglang_root, tmp_path):
    """SGLang's HookRegistry replaces the callables; astra's own identity rebinding does only what that
    API cannot: (1) undo (it has no revert: the originals come back everywhere and our hooks are
    withdrawn, so patching again in the same process applies again), (2) processes without it (no
    SGLang loaded, or an SGLang without the plugin API): setattr plus the same rebinding."""
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
from sglang.srt.plugins.hook_registry import HookRegistry
import sglang.srt.layers.activation as A
orig, sk = [A._sgl_silu_and_mul], sys.modules["sgl_kernel"]  # in a list: module globals get rebound
def state():
    return dict(op=getattr(A._sgl_silu_and_mul, "__astra_op__", None), via=getattr(sk.silu_and_mul, "__astra_via__", None),
                same=A._sgl_silu_and_mul is orig[0] and sk.silu_and_mul is orig[0],
                hooked="sgl_kernel.silu_and_mul" in HookRegistry._patched)
kw = dict(backends=E.astra_standins(), counter_dir={str(tmp_path)!r}, propagate=False, plan=False, self_check="off")
apply_astra_kernels(["silu_and_mul"], **kw)
first = state()
revert_astra_kernels()
reverted = state()
apply_astra_kernels(["silu_and_mul"], **kw)
print(json.dumps(dict(first=first, reverted=reverted, again=state())))
""")
    patched = {"op": "silu_and_mul", "via": "sglang HookRegistry", "same": False, "hooked": True}
    assert res["first"] == patched and res["again"] == patched
    assert res["reverted"] == {"op": None, "via": None, "same": True, "hooked": False}
    res, _ = run_child(f"""
import json, sys, torch
import sglang_cpu_env as E
fake = E.fake_production("fake_sk")
orig = [fake.silu_and_mul]  # in a list: module globals get rebound
user = type(sys)("fake_sk_user"); user.act = orig[0]; sys.modules["fake_sk_user"] = user  # `from fake_sk import ...`
from astra_sglang.patch import apply_astra_kernels, revert_astra_kernels
apply_astra_kernels(["silu_and_mul"], backends=E.astra_standins(), targets={{"silu_and_mul": ["fake_sk:silu_and_mul"]}},
                    counter_dir={str(tmp_path)!r}, propagate=False, plan=False)
via, user_op = fake.silu_and_mul.__astra_via__, getattr(user.act, "__astra_op__", None)
revert_astra_kernels()
print(json.dumps(dict(sglang="sglang" in sys.modules, via=via, user_op=user_op,
                      restored=fake.silu_and_mul is orig[0] and user.act is orig[0])))
""")
    assert res == {"sglang": False, "via": "astra", "user_op": "silu_and_mul", "restored": True}


# ---------------------------------------------------------------------- activation paths
def test_disable_switch(sglang_root, tmp_path):
    res, proc = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import sglang.srt.layers.attention.merge_state as M
before = M.merge_state_v2
p = apply_astra_kernels(backends=E.astra_standins(), counter_dir={str(tmp_path)!r}, propagate=False)
from astra_sglang.patch.hook import activate_from_env
from sglang.srt.plugins import load_plugins
load_plugins()   # SGLang's own plugin loader, which runs our entry point
print(json.dumps(dict(p=p is None, hook=activate_from_env() is None, same=M.merge_state_v2 is before,
                      files=os.listdir({str(tmp_path)!r}))))
""", env={"ASTRA_SGLANG_DISABLE": "1", "ASTRA_SGLANG_OPS": "all"})
    assert res == {"p": True, "hook": True, "same": True, "files": []}


@pytest.fixture(scope="module")
def silu_lib(tmp_path_factory):
    """kernels/silu_and_mul/kernel.cu built for sm_90 with nvcc (no GPU needed to build)."""
    from astra_sglang.build import find_nvcc

    try:
        find_nvcc()
    except Exception:
        pytest.skip("needs nvcc")
    mp = pytest.MonkeyPatch()
    mp.setenv("ASTRA_CACHE_DIR", str(tmp_path_factory.mktemp("patch-cache")))
    try:
        from astra_sglang.patch.apply import build_kernel

        return build_kernel("silu_and_mul", arch="sm_90")
    finally:
        mp.undo()


@pytest.mark.nvcc
def test_no_kernel_launch_on_cpu(silu_lib, tmp_path):
    """The real kernel library is loaded and patched in; CPU tensors never reach it."""
    res, _ = run_child(f"""
import json, sys, torch
import sglang_cpu_env as E
fake = E.fake_production("fake_sk")
from astra_sglang.patch import apply_astra_kernels, counters
p = apply_astra_kernels(["silu_and_mul"], libs={{"silu_and_mul": {str(silu_lib)!r}}},
                        targets={{"silu_and_mul": ["fake_sk:silu_and_mul"]}}, counter_dir={str(tmp_path)!r},
                        propagate=False, plan=False)
backend = p.states["silu_and_mul"].backend
launched = []
real_fn = backend.lib._fn
backend.lib._fn = lambda *a: launched.append(a) or real_fn(*a)
y = fake.silu_and_mul(torch.randn(4, 64))
print(json.dumps(dict(name=backend.name, launched=len(launched), c=counters({str(tmp_path)!r})["silu_and_mul"],
                      patched=getattr(fake.silu_and_mul, "__astra_op__", None), shape=list(y.shape))))
""")
    assert res["patched"] == "silu_and_mul" and "kernel" in res["name"]
    assert res["launched"] == 0 and res["c"]["calls"] == 0 and res["c"]["fallbacks"] == 1
    assert res["shape"] == [4, 32]


@pytest.mark.nvcc
def test_plugin_entry_point_activates_in_real_sglang(sglang_tree, silu_lib, tmp_path):
    """SGLang's real load_plugins() (as every scheduler process runs it) activates the patch from the env."""
    sglang_root, _ = sglang_tree
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + """
import sglang.srt.layers.activation as A
before = A._sgl_silu_and_mul
from sglang.srt.plugins import load_plugins
load_plugins()
import astra_sglang.patch as P
print(json.dumps(dict(op=getattr(A._sgl_silu_and_mul, "__astra_op__", None),
                      jit=getattr(A._jit_silu_and_mul, "__astra_op__", None), active=P.active_patcher() is not None)))
""", env={"ASTRA_SGLANG_OPS": "silu_and_mul", "ASTRA_SGLANG_LIBS": f"silu_and_mul={silu_lib}",
          "ASTRA_SGLANG_COUNTER_DIR": str(tmp_path), "ASTRA_SGLANG_PLAN": str(tmp_path / "none.json")})
    assert res == {"op": "silu_and_mul", "jit": "silu_and_mul", "active": True}
    assert list(tmp_path.glob("*.cnt"))


def _synthetic_sglang(root: Path, launch_calls: int = 3) -> Path:
    """A tiny package named `sglang` (the real one cannot `import sglang` on CPU CI) that
    binds the production callable at import time like SGLang's layers do."""
    (root / "sglang").mkdir(parents=True)
    (root / "sgl_kernel").mkdir()
    (root / "sgl_kernel" / "__init__.py").write_text(textwrap.dedent("""
        import torch
        def silu_and_mul(input, out=None):
            d = input.shape[-1] // 2
            out = input.new_empty(input.shape[:-1] + (d,)) if out is None else out
            out.copy_(torch.nn.functional.silu(input[..., :d]) * input[..., d:])
            return out
    """))
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "layer.py").write_text("from sgl_kernel import silu_and_mul as _act\n"
                                              "def forward(x):\n    return _act(x)\n")
    (root / "sglang" / "launch_server.py").write_text(textwrap.dedent(f"""
        import sys, torch
        import sglang.layer as layer
        print("patched:", getattr(layer._act, "__astra_op__", None), "args:", sys.argv[1:], flush=True)
        for _ in range({launch_calls}):
            layer.forward(torch.randn(2, 8))
    """))
    return root


@pytest.mark.nvcc
def test_startup_hook_activates_spawned_processes(silu_lib, tmp_path):
    pkg = _synthetic_sglang(tmp_path / "pkg")
    cdir = tmp_path / "cnt"
    res, _ = run_child(f"""
import json, multiprocessing as mp, subprocess, sys, os
from astra_sglang.patch import apply_astra_kernels
apply_astra_kernels(["silu_and_mul"], libs={{"silu_and_mul": {str(silu_lib)!r}}},
                    targets={{"silu_and_mul": ["sgl_kernel:silu_and_mul"]}}, counter_dir={str(cdir)!r}, plan=False)
# a fresh interpreter with the exported environment, as SGLang spawns its schedulers
code = "import sglang.layer as l, json; print(json.dumps(getattr(l._act, '__astra_op__', None)))"
out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
print(json.dumps(dict(child=out.stdout.strip(), err=out.stderr[-2000:], ops=os.environ["ASTRA_SGLANG_OPS"],
                      pp=os.environ["PYTHONPATH"].split(os.pathsep)[0])))
""", pythonpath=[pkg])
    assert res["ops"] == "silu_and_mul" and res["pp"] == str(STARTUP)
    assert res["child"] == '"silu_and_mul"', res["err"]
    # the targets= extension is process-local: the child patched sgl_kernel through the spec's own list
    assert len(list(cdir.glob("*.cnt"))) == 2


def test_counters_readable_from_another_process_and_per_fork(tmp_path):
    cdir = tmp_path / "cnt"
    res, proc = run_child(f"""
import json, os, sys, torch
import sglang_cpu_env as E
fake = E.fake_production("fake_sk")
from astra_sglang.patch import apply_astra_kernels
apply_astra_kernels(["silu_and_mul"], backends=E.astra_standins(), targets={{"silu_and_mul": ["fake_sk:silu_and_mul"]}},
                    counter_dir={str(cdir)!r}, propagate=False, plan=False)
for _ in range(5):
    fake.silu_and_mul(torch.randn(3, 16))
pid = os.fork()
if pid == 0:
    for _ in range(2):
        fake.silu_and_mul(torch.randn(3, 16))
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps(dict(parent=os.getpid(), child=pid)))
""")
    from astra_sglang.patch import read_counters, totals
    from astra_sglang.patch.counters import format_table

    procs = {p.pid: p for p in read_counters(cdir)}
    assert set(procs) == {res["parent"], res["child"]}
    assert procs[res["parent"]].counts["silu_and_mul"]["calls"] == 5
    assert procs[res["child"]].counts["silu_and_mul"]["calls"] == 2  # the fork counts in its own file
    assert procs[res["parent"]].status["silu_and_mul"]["state"] == "patched"
    assert not procs[res["parent"]].alive
    assert totals(cdir)["silu_and_mul"]["calls"] == 7
    assert "silu_and_mul" in format_table(list(procs.values()))


def test_torch_compile_sees_one_custom_op(tmp_path):
    res, _ = run_child(f"""
import json, sys, torch
import sglang_cpu_env as E
fake = E.fake_production("fake_sk")
from astra_sglang.patch import apply_astra_kernels, counters
apply_astra_kernels(["fused_add_rmsnorm"], backends=E.astra_standins(),
                    targets={{"fused_add_rmsnorm": ["fake_sk:fused_add_rmsnorm"]}}, counter_dir={str(tmp_path)!r},
                    propagate=False, plan=False)
graphs = []
def backend(gm, example_inputs):
    graphs.append(str(gm.graph))
    return gm.forward
def layer(x, r, w):
    x = x * 2
    fake.fused_add_rmsnorm(x, r, w, 1e-6, enable_pdl=True)
    return x + 1, r
x, r, w = torch.randn(4, 32), torch.randn(4, 32), torch.rand(32) + 0.5
want = layer(x.clone(), r.clone(), w)
got = torch.compile(layer, backend=backend, fullgraph=True)(x.clone(), r.clone(), w)
print(json.dumps(dict(ok=all(torch.allclose(a, b, atol=1e-5) for a, b in zip(want, got)),
                      graph="astra_sglang.fused_add_rmsnorm" in graphs[0], n=len(graphs),
                      op=hasattr(torch.ops.astra_sglang, "fused_add_rmsnorm"), c=counters({str(tmp_path)!r}))))
""")
    assert res["op"] and res["graph"] and res["n"] == 1 and res["ok"]
    # eager call (self-checked) + the compiled graph's call of the custom op
    assert res["c"]["fused_add_rmsnorm"]["calls"] == 2


# ---------------------------------------------------------------------- validate, CLI
def _torch_silu_and_mul():
    """A fresh stand-in for SGLang's silu_and_mul on CPU (sgl_kernel's signature). Fresh, because the patch
    replaces every reference to the function object it targets."""
    import torch

    def silu_and_mul(input, out=None):
        d = input.shape[-1] // 2
        out = input.new_empty(input.shape[:-1] + (d,)) if out is None else out
        out.copy_((torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()).to(out.dtype))
        return out

    return silu_and_mul


def test_validate_logic_on_cpu():
    import sglang_cpu_env as E
    from astra_sglang.patch.validate import format_results, validate

    mod = type(sys)("fake_validate_sk")
    sys.modules["fake_validate_sk"] = mod
    mod.silu_and_mul = _torch_silu_and_mul()
    unpatched = _torch_silu_and_mul()  # a layer that never calls through the patched module
    layer = {"silu_and_mul": lambda inp, dims, sc: {"out": mod.silu_and_mul(inp["input"])}}
    kw = dict(device="cpu", layers=layer, targets={"silu_and_mul": ["fake_validate_sk:silu_and_mul"]},
              shapes="4x64,3x1001", dtypes=["fp32", "bf16"])
    try:
        good = validate(["silu_and_mul"], backends=E.astra_standins(), **kw)
        bad = validate(["silu_and_mul"], backends=E.astra_standins(wrong={"silu_and_mul"}), **kw)
        never = validate(["silu_and_mul"], backends=E.astra_standins(),
                         **{**kw, "layers": {"silu_and_mul": lambda inp, d, s: {"out": unpatched(inp["input"])}}})
    finally:
        del sys.modules["fake_validate_sk"]
    assert good and all(c.status == "PASS" and c.calls == 1 for c in good), format_results(good)
    assert all(c.status == "FAIL" for c in bad) and "err" in bad[0].detail
    assert any(c.status == "FAIL" for c in never) and "reached the astra kernel" in format_results(never)


def test_max_tokens_keeps_larger_calls_with_sglang_and_validate_says_so(monkeypatch):
    """An adapter's max_tokens (linear's, moe_gate's: where SGLang's own kernel or route is faster in
    context) hands larger calls to SGLang's original, and validate reports them n/a, not FAIL."""
    import dataclasses

    import sglang_cpu_env as E
    from astra_sglang.patch.validate import format_results, validate
    from astra_sglang.registry import op_part

    mod = type(sys)("fake_capped_sk")
    sys.modules["fake_capped_sk"] = mod
    mod.silu_and_mul = _torch_silu_and_mul()
    ad = op_part("silu_and_mul", "adapter")
    monkeypatch.setattr(ad, "ADAPTER", dataclasses.replace(ad.ADAPTER, max_tokens=3))
    layer = {"silu_and_mul": lambda inp, dims, sc: {"out": mod.silu_and_mul(inp["input"])}}
    try:
        cases = validate(["silu_and_mul"], backends=E.astra_standins(), device="cpu", layers=layer,
                         targets={"silu_and_mul": ["fake_capped_sk:silu_and_mul"]}, shapes="2x64,4x64",
                         dtypes=["fp32"])
    finally:
        del sys.modules["fake_capped_sk"]
    text = format_results(cases)
    by = {c.dims: c for c in cases}
    assert by[(2, 64)].status == "PASS" and by[(2, 64)].calls == 1, text
    assert by[(4, 64)].status == "n/a" and "by design" in by[(4, 64)].detail and by[(4, 64)].fallbacks == 1, text


def test_validate_names_why_a_patched_call_went_back_to_sglang(monkeypatch):
    """A case whose call reached the patch and fell back says why (moe_grouped_router's 30 FAILs on the H200,
    2026-11-27, said only "handed the call back"; the reason, "empty tensor", took a CPU reconstruction)."""
    import dataclasses

    import sglang_cpu_env as E
    from astra_sglang.patch.validate import format_results, validate
    from astra_sglang.registry import op_part

    mod = type(sys)("fake_declining_sk")
    sys.modules["fake_declining_sk"] = mod
    mod.silu_and_mul = _torch_silu_and_mul()
    ad = op_part("silu_and_mul", "adapter")
    monkeypatch.setattr(ad, "ADAPTER", dataclasses.replace(ad.ADAPTER, normalize=lambda c: "the test declines it"))
    layer = {"silu_and_mul": lambda inp, dims, sc: {"out": mod.silu_and_mul(inp["input"])}}
    try:
        cases = validate(["silu_and_mul"], backends=E.astra_standins(), device="cpu", layers=layer,
                         targets={"silu_and_mul": ["fake_declining_sk:silu_and_mul"]}, shapes="4x64",
                         dtypes=["fp32"])
    finally:
        del sys.modules["fake_declining_sk"]
    assert cases and all(c.status == "FAIL" and c.detail.endswith(": the test declines it") for c in cases), \
        format_results(cases)


def test_validate_marks_shapes_sglang_refuses_as_na():
    """sgl_kernel's silu_and_mul raises for halves that are not 16-byte aligned (seen on the H200
    with 0.5.17): validate reports those shapes n/a and still validates the others."""
    import sglang_cpu_env as E
    import validate_crashing_layers as VL
    from astra_sglang.patch.validate import format_results, validate

    cases = validate(["silu_and_mul"], device="cpu", layers=VL.LAYERS, backends=E.astra_standins(),
                     targets={"silu_and_mul": ["validate_crashing_layers:silu_and_mul"]},
                     shapes="4x64,2x72", dtypes=["fp32"], isolate=False)
    text = format_results(cases)
    assert all(c.status == "PASS" for c in cases if c.dims == (4, 64)), text
    refused = [c for c in cases if c.dims == (2, 72)]
    assert refused and all(c.status == "n/a" and "refuses" in c.detail for c in refused), text


def test_validate_isolates_a_crashing_original(monkeypatch):
    """An original that kills its process on one shape (sglang 0.5.17's sgl_kernel silu_and_mul
    faults with a misaligned address on the H200) costs that case only: n/a with the crash as its
    reason; the cases after it are still validated."""
    import sglang_cpu_env as E
    import validate_crashing_layers as VL
    from astra_sglang.patch.validate import format_results, validate

    # the unpatched pass runs in child processes that import the layers module by name
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", tests_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cases = validate(["silu_and_mul"], device="cpu", layers=VL.LAYERS, backends=E.astra_standins(),
                     targets={"silu_and_mul": ["validate_crashing_layers:silu_and_mul"]},
                     shapes="4x64,3x1001,2x72,5x128", dtypes=["fp32"],
                     isolate="validate_crashing_layers:LAYERS")
    by = {}
    for c in cases:
        by.setdefault(c.dims, []).append(c)
    text = format_results(cases)
    assert all(c.status == "n/a" and "crashed" in c.detail for c in by[(3, 1001)]), text
    assert all(c.status == "n/a" and "refuses" in c.detail for c in by[(2, 72)]), text
    assert all(c.status == "PASS" for d in [(4, 64), (5, 128)] for c in by[d]), text


def test_validate_stops_running_an_op_whose_layer_crashes_the_same_way_on_every_shape(monkeypatch):
    """A layer that cannot run at all (every case kills its process the same way: a missing runtime config cost
    5 minutes of GPU time on 2026-11-26) is not restarted once per case: after CRASH_STREAK identical crashes
    over more than one shape, the op's remaining cases are n/a, not run. Crashes on one shape only (each of its
    distributions) do not stop the op."""
    import sglang_cpu_env as E
    import validate_crashing_layers as VL
    from astra_sglang.patch.validate import CRASH_STREAK, format_results, validate

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", tests_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    progress = []
    cases = validate(["silu_and_mul"], device="cpu", layers=VL.LAYERS, backends=E.astra_standins(),
                     targets={"silu_and_mul": ["validate_crashing_layers:silu_and_mul"]},
                     shapes="3x1001,5x1003,2x1005,4x64", dtypes=["fp32"],
                     isolate="validate_crashing_layers:LAYERS", progress=progress.append)
    text = format_results(cases)
    crashed = [c for c in cases if "crashed on this shape" in c.detail]
    skipped = [c for c in cases if c.detail.startswith("not run")]
    per_shape = sum(c.dims == (3, 1001) for c in cases)
    assert per_shape + 1 >= CRASH_STREAK, text  # the first shape alone does not stop it
    # one crash on the second shape completes the streak (the op's first n/a case then reads FAIL: no case of it
    # reached the astra kernel)
    assert len(crashed) + sum(c.status == "FAIL" for c in cases) == per_shape + 1, text
    assert [c.dims for c in crashed][-1] == (5, 1003), text
    assert {c.dims for c in skipped} == {(5, 1003), (2, 1005), (4, 64)} and all(c.status == "n/a" for c in skipped)
    assert any("remaining case(s) are not run" in m for m in progress)


def test_validate_runs_sglangs_own_layers(sglang_tree, tmp_path):
    """validate's SGLang layer calls (SiluAndMul, RMSNorm with residual, merge_state) on the real
    modules of both versions, on CPU: unpatched they reach the sgl_kernel stand-ins, patched the
    astra stand-ins."""
    sglang_root, _ = sglang_tree
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + """
import sglang.srt.layers.activation as A
import sglang.srt.layers.layernorm as L
A._jit_act_max_vec_bytes = 1 << 20
L.is_batch_invariant_mode_enabled = lambda: False
from astra_sglang.patch.validate import format_results, validate
out = {}
for op, shapes in [("silu_and_mul", "5x64,2x1001"), ("fused_add_rmsnorm", "3x128,1x4100"), ("merge_state", "4x3x16")]:
    cases = validate([op], device="cpu", backends=E.astra_standins(), shapes=shapes, dtypes=["fp32", "bf16"])
    out[op] = [c.status for c in cases]
    print(format_results(cases), file=sys.stderr)
print(json.dumps(out))
""")
    for op, statuses in res.items():
        assert statuses and set(statuses) == {"PASS"}, (op, statuses)


def test_a_torch_custom_op_s_signature_comes_from_its_schema():
    """inspect reads a torch op as (*args, **kwargs); its schema has the function's names, defaults and keyword-only
    marks, which is what the Binder needs (0.5.17 registers store_cache and the rope kernels this way)."""
    import inspect

    torch = pytest.importorskip("torch")
    from astra_sglang.patch.adapters import Binder, callable_signature, torch_op_schema
    from astra_sglang.registry import get_op, op_part

    # 0.5.17's store_cache, as its register_custom_op infers the schema
    lib = torch.library.Library("astra_sig_probe", "FRAGMENT")
    lib.define("store_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, *, "
               "SymInt row_bytes=0, SymInt v_row_bytes=0, SymInt num_split=0, SymInt size_limit=0, "
               "SymInt reserved_skip_index=0) -> ()")
    op = torch.ops.astra_sig_probe.store_cache
    assert str(inspect.signature(op)).startswith("(*args")  # what made such targets unsupported
    sig = callable_signature(op)
    assert str(sig) == ("(k, v, k_cache, v_cache, indices, *, row_bytes=0, v_row_bytes=0, num_split=0, "
                        "size_limit=0, reserved_skip_index=0)")
    assert torch_op_schema(op.default) is not None and torch_op_schema(lambda x: x) is None
    assert callable_signature(lambda a, *, b=1: a) == inspect.signature(lambda a, *, b=1: a)
    # kv_store's adapter binds the op as it binds the Python function it was made from
    def store_cache(k, v, k_cache, v_cache, indices, *, row_bytes=0, v_row_bytes=0, num_split=0, size_limit=0,
                    reserved_skip_index=0):
        pass

    ad, spec = op_part("kv_store", "adapter").ADAPTER, get_op("kv_store")
    binder, plain = Binder(op, ad, spec), Binder(store_cache, ad, spec)
    assert binder.ok and plain.ok and binder.from_schema and not plain.from_schema, (binder.problem, plain.problem)
    assert (binder.params, binder.positional, binder.defaults) == (plain.params, plain.positional, plain.defaults)


def test_torch_custom_op_targets_are_patched_and_rope_store_is_reached(sglang_tree, tmp_path, request):
    """rope_store's one GPU validate (2026-11-26) read "SGLang's layer reached no patched callable" on every shape:
    in 0.5.17, register_custom_op leaves a torch op (OpOverloadPacket) under apply_rope_inplace_with_kvcache,
    apply_rope_inplace and store_cache, which inspect reads as (*args, **kwargs), so the patch called them
    unsupported and never installed rope_store, kv_store or rope's second target. Their signatures now come from the
    op's schema. On CPU, both versions' real rope.py and kvcache.py: every such target is patched, and the call
    RotaryEmbedding.forward_cuda makes (rope.py's apply_rope_with_cos_sin_cache_inplace with a fused_set_kv_buffer_arg,
    views of q / k rows, the pool's caches) reaches rope_store and stores the rotated k at each token's slot."""
    sglang_root, discovery = sglang_tree
    plan = tmp_path / "plan.json"
    plan.write_text(discovery.to_json())
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
import sglang.kernels.ops.attention.rope as R
import sglang.kernels.ops.kvcache.kvcache as KV
from astra_sglang.harness.inputs import make_case_inputs
from astra_sglang.registry import get_op
spec = get_op("rope_store")
dims = (16, 8, 2, 128, 1536, 1536, 1536)  # q, k, v rows in buffers wider than their heads
t, hq, hk, d = dims[:4]
inp = make_case_inputs(spec, dims, "bf16", "normal", 0, "cpu")
orig = dict(rs=R.apply_rope_inplace_with_kvcache, r=R.apply_rope_inplace, kv=KV.store_cache)
p = apply_astra_kernels(["rope_store", "rope", "kv_store"], backends=E.astra_standins(),
                        counter_dir={str(tmp_path)!r}, propagate=False, self_check="off", plan={str(plan)!r})
states = {{t: s["state"] for op in p.summary().values() for t, s in op["targets"].items()}}
kc = inp["k_cache"].clone()
arg = R.FusedSetKVBufferArg(value=inp["v"][:, : hk * d], k_buffer=kc, v_buffer=inp["v_cache"].clone(),
                            cache_loc=inp["out_loc"])
R.apply_rope_with_cos_sin_cache_inplace(positions=inp["positions"], q=inp["q"][:, : hq * d].view(t, hq, d),
                                        k=inp["k"][:, : hk * d].view(t, hk, d), cos_sin_cache=inp["cos_sin_cache"],
                                        is_neox=True, fused_args=arg)
c = counters({str(tmp_path)!r}).get("rope_store", {{}})
why = p.states["rope_store"].last_fallback
revert_astra_kernels()
restored = R.apply_rope_inplace_with_kvcache is orig["rs"] and R.apply_rope_inplace is orig["r"] and \\
    KV.store_cache is orig["kv"]
loc = inp["out_loc"].long()
print(json.dumps(dict(calls=c.get("calls", 0), fallbacks=c.get("fallbacks", 0), why=why, states=states,
                      stored=bool((kc.float()[loc] != inp["k_cache"].float()[loc]).any()), restored=restored,
                      torch_ops=[k for k, v in orig.items() if type(v).__name__ == "OpOverloadPacket"])))
""")
    assert res["calls"] == 1 and res["fallbacks"] == 0, res
    assert res["stored"] and res["restored"], res
    # every target these three ops name in rope.py / kvcache.py is patched, torch custom op (0.5.17) or function
    want = {"sglang.kernels.ops.attention.rope:apply_rope_inplace_with_kvcache",
            "sglang.kernels.ops.attention.rope:apply_rope_inplace",
            "sglang.kernels.ops.attention.rope:apply_rope_with_cos_sin_cache_inplace",
            "sglang.kernels.ops.kvcache.kvcache:store_cache"}
    assert {t: st for t, st in res["states"].items() if t in want} == dict.fromkeys(want, "patched"), res["states"]
    if request.node.callspec.params["sglang_tree"] == "0.5.17":
        assert set(res["torch_ops"]) == {"rs", "r", "kv"}, res  # what made them unsupported before


def test_validate_constructs_layers_outside_a_server():
    from astra_sglang.patch.layers import construct

    class Base:
        def __init__(self):
            self.base = True

    class NeedsContext(Base):
        def __init__(self):
            super().__init__()
            raise ValueError("config namespace 'exec' not published")

    obj = construct(NeedsContext)
    assert isinstance(obj, NeedsContext) and obj.base


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "astra_sglang.cli", *args], capture_output=True, text=True,
                          env=_env(env), timeout=120)


def test_cli_bad_input_one_line_nonzero(tmp_path):
    p = _cli("patch")
    assert p.returncode == 2 and "give --serve" in p.stderr
    p = _cli("patch", "--dry-run", "--ops", "bogus")
    assert p.returncode == 2 and "unknown op(s) bogus; known ops:" in p.stderr
    p = _cli("patch", "--serve", "--ops", "none")
    assert p.returncode == 2 and "no server arguments" in p.stderr
    p = _cli("patch", "--counters", str(tmp_path / "nope"))
    assert p.returncode == 2 and "no such directory" in p.stderr
    p = _cli("patch", "--dry-run", "--candidate", "silu_and_mul=/no/such.cu", "--ops", "silu_and_mul")
    assert p.returncode == 2 and "no such file" in p.stderr
    for p in [_cli("patch", "--dry-run", "--ops", "bogus")]:
        assert len([l for l in p.stderr.splitlines() if l.strip()]) == 1


@pytest.mark.nvcc
def test_serve_plumbing_and_never_ran(silu_lib, tmp_path):
    """`patch --serve` on a synthetic `sglang.launch_server`: the server process is patched through the
    start-up hook, CPU calls never reach the CUDA kernel, so it refuses to report success (exit 3);
    `--ops none` runs the same server unpatched."""
    pkg = _synthetic_sglang(tmp_path / "pkg")
    cache = tmp_path / "cache"
    (cache / "patch" / "silu_and_mul").mkdir(parents=True)
    import shutil

    shutil.copy(silu_lib, cache / "patch" / "silu_and_mul" / Path(silu_lib).name)
    env = {"PYTHONPATH": os.pathsep.join([str(pkg), str(TESTS)]), "ASTRA_CACHE_DIR": str(cache)}
    cdir = tmp_path / "cnt"
    p = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "patch", "--serve", "--ops", "silu_and_mul",
                        "--arch", "sm_90", "--sglang-src", str(pkg), "--counter-dir", str(cdir), "--", "--port", "1"],
                       capture_output=True, text=True, env={**_env(), **env}, timeout=300)
    assert "patched: silu_and_mul args: ['--port', '1']" in p.stdout, p.stderr
    assert p.returncode == 3 and "never ran (0 astra kernel calls): silu_and_mul" in p.stderr
    from astra_sglang.patch import totals

    assert totals(cdir)["silu_and_mul"]["fallbacks"] == 3
    shown = _cli("patch", "--counters", str(cdir))
    assert shown.returncode == 0 and "silu_and_mul" in shown.stdout and "fallbacks" in shown.stdout
    p = subprocess.run([sys.executable, "-m", "astra_sglang.cli", "patch", "--serve", "--ops", "none", "--", "--x"],
                       capture_output=True, text=True, env={**_env(), **env}, timeout=300)
    assert p.returncode == 0 and "patched: None args: ['--x']" in p.stdout, p.stderr


def test_server_side_reads_the_plan_without_libcst(discovery, tmp_path):
    """Server processes only read the CLI's plan: libcst (a CLI-side dependency) is not imported."""
    plan = tmp_path / "plan.json"
    plan.write_text(discovery.to_json())
    res, _ = run_child(f"""
import json, sys
sys.modules["libcst"] = None   # any import of libcst now fails
import sglang_cpu_env as E
from astra_sglang.patch import apply_astra_kernels
p = apply_astra_kernels(["silu_and_mul"], backends=E.astra_standins(), counter_dir={str(tmp_path)!r},
                        propagate=False, plan={str(plan)!r})
print(json.dumps(dict(factories=sorted(m + ":" + f for _, m, f, _ in p.factories))))
""")
    assert "sglang.kernels.ops.activation.activation:activation_module" in res["factories"]


def test_validate_default_dtypes_are_per_op():
    """No --dtypes: fp16/bf16 where the op has them, the op's own otherwise (moe_align is int32 only);
    a named dtype an op lacks is an error that names it."""
    from astra_sglang.errors import AstraError
    from astra_sglang.patch.validate import build_cases

    cases = build_cases(["silu_and_mul", "moe_align", "moe_grouped_router"], None, "decode")
    by_op = {}
    for c in cases:
        by_op.setdefault(c.op, set()).add(c.dtype)
    # DeepSeek-V3's router gets fp32 logits in serving (its serving_dtypes), whatever the model's dtype
    assert by_op == {"silu_and_mul": {"fp16", "bf16"}, "moe_align": {"int32"}, "moe_grouped_router": {"fp32"}}
    with pytest.raises(AstraError, match="moe_align has no dtype fp16"):
        build_cases(["moe_align"], ["fp16"], "decode")


def test_merge_state_leaves_the_token_counts_it_loses_in_context_to_sglang():
    """0.84x in context at 64 and 256 tokens on the H200: those calls stay SGLang's (a fallback with its
    reason); 1-16 tokens (1.84-1.88x) and prefill sizes are routed."""
    torch = pytest.importorskip("torch")
    from astra_sglang.kernels.merge_state.adapter import _merge_normalize

    def call(t):
        v = torch.zeros(t, 8, 128, dtype=torch.bfloat16)
        s = torch.zeros(t, 8)
        return _merge_normalize({"v_a": v, "s_a": s, "v_b": v.clone(), "s_b": s.clone(),
                                 "v_out": v.clone(), "s_out": s.clone()})

    for t in (64, 256):
        assert isinstance(call(t), str) and "slower than SGLang's kernel in context" in call(t)
    for t in (1, 16, 1024):
        assert not isinstance(call(t), str), t


@pytest.mark.parametrize("op", op_names())
def test_validate_default_shapes_exist_for_every_op(op):
    """`validate` with no --shapes: paper shapes where the op has them, else a decode/prefill sample (the MoE
    ops have no paper shapes; validate stopped with "no shapes tagged 'paper'" on the H200, 2026-11-24)."""
    from astra_sglang.patch.validate import validation_shapes

    spec = get_op(op)
    shapes = validation_shapes(spec, "validate")
    assert shapes and all("largest" not in s.tags for s in shapes)
    assert any("decode" in s.tags or "paper" in s.tags for s in shapes)


def test_validate_takes_the_rows_linears_widest_bound_rests_on():
    """The decode sample missed linear's down_proj rows past 14336 inputs (the evidence for MAX_IN_FEATURES 21504,
    2026-11-30, and 24576, 2026-12-01): every bound the adapter takes up to its widest now runs in SGLang's layer."""
    from astra_sglang.patch.validate import validation_shapes
    from kernels.linear.adapter import MAX_IN_FEATURES

    dims = {s.dims for s in validation_shapes(get_op("linear"), "validate")}
    for k, n in ((15360, 3840), (18944, 3584), (21504, 5376), (24576, 3072)):
        assert {(1, k, n), (2, k, n), (4, k, n)} <= dims
    assert max(k for _, k, _ in dims) == MAX_IN_FEATURES


def test_disable_after_capture_says_the_graphs_keep_astras_kernel(tmp_path, capsys):
    """A disable reaches the eager path only: graphs captured before it keep astra's kernel (seen on the H200,
    2026-11-24, moe_align). The message says so when something was captured, and not otherwise."""
    from astra_sglang.patch.counters import CounterFile
    from astra_sglang.patch.ops import OpState

    class Backend:
        devices, dtypes = ("cpu",), ("fp16", "bf16")

    spec = get_op("silu_and_mul")
    ad = op_part("silu_and_mul", "adapter").ADAPTER
    for captured in (False, True):
        st = OpState(spec, ad, Backend(), CounterFile(tmp_path / str(captured), ["silu_and_mul"]))
        st.captured = captured
        st.disable("self-check mismatch (test)")
        err = capsys.readouterr().err
        assert "PATCH DISABLED for silu_and_mul" in err
        assert ("CUDA graphs captured before this keep astra's kernel" in err) is captured


def test_ops_all_does_not_fail_on_ops_the_model_never_calls():
    """`patch --serve --ops all` on Qwen3-30B-A3B exited 3 because gelu_and_mul & co. never ran (H200,
    2026-11-26): under "all" an op with neither astra nor fallback calls is noted, not a failure; a named
    op that never ran, or one that only fell back, still is."""
    from astra_sglang.patch.cli import never_ran

    tot = {"fused_add_rmsnorm": {"calls": 10}, "gelu_and_mul": {"calls": 0, "fallbacks": 0},
           "moe_combine": {"calls": 0, "fallbacks": 5}}
    ops = ["fused_add_rmsnorm", "gelu_and_mul", "moe_combine", "merge_state"]
    assert never_ran(ops, tot, all_requested=True) == (["moe_combine"], ["gelu_and_mul", "merge_state"])
    assert never_ran(ops, tot, all_requested=False) == (["gelu_and_mul", "moe_combine", "merge_state"], [])


def test_layer_write_back_skips_an_output_that_is_its_destination():
    """A layer that rotated q in place returns q itself; at one token copy_ refuses a tensor onto its own memory
    (seen on the H200 with 0.5.17's RotaryEmbedding), so validate's layers write back only real copies."""
    import torch

    from astra_sglang.patch.layers import write_back

    q = torch.zeros(1, 8)
    write_back(q, q.view(1, 2, 4))  # aliased: nothing to do, no error
    write_back(q, torch.ones(1, 2, 4))
    assert torch.equal(q, torch.ones(1, 8))


def test_build_kernels_runs_the_builds_side_by_side_and_keeps_each_failure(monkeypatch):
    """A patched server's start built its 19 kernels one after another (115 s on an H200 node, 2026-11-28): the builds
    now overlap; a kernel that fails is that op's AstraError, and progress still comes in the order of the ops."""
    import threading
    import time

    from astra_sglang.errors import AstraError
    from astra_sglang.patch import apply

    live, most, lock = [0], [0], threading.Lock()

    def fake_build(op, candidate=None, arch=None):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        if op == "bad":
            raise AstraError("bad.cu does not compile for sm_90: error: x")
        return Path(f"/cache/{op}-{candidate or 'kernel'}.so")

    monkeypatch.setattr(apply, "build_kernel", fake_build)
    seen = []
    out = apply.build_kernels(["a", "bad", "c", "d"], {"c": "cand.cu"}, progress=lambda op, lib, s: seen.append(op))
    assert seen == ["a", "bad", "c", "d"] and out["a"] == Path("/cache/a-kernel.so")
    assert out["c"] == Path("/cache/c-cand.cu.so") and isinstance(out["bad"], AstraError)
    assert most[0] > 1 or (os.cpu_count() or 1) == 1
    assert apply.build_kernels([]) == {}


def test_patch_serve_builds_while_it_scans_sglang_and_checks_the_source_first(monkeypatch, capsys, tmp_path):
    """`patch --serve` starts the kernel builds, then scans SGLang's sources for call sites in the meantime (both
    ~20-30 s cold); a --sglang-src with no sglang in it is one error line before any build starts."""
    import threading

    from cli_run import one_error, run_cli

    from astra_sglang.patch import apply, cli as patch_cli

    building, scanning, order = threading.Event(), threading.Event(), []

    def fake_builds(ops, candidates=None, arch=None, progress=None):
        order.append("build")
        building.set()
        assert scanning.wait(10), "the scan did not run while the builds did"
        out = {op: Path(f"/cache/{op}.so") for op in ops}
        for op in ops:
            progress(op, out[op], 1.5)
        return out

    class Disc:
        def for_op(self, op):
            return [] if op == "rmsnorm" else [object()]

        def to_json(self):
            return "{}"

    def fake_discovery(ops, src):
        order.append("scan")
        scanning.set()
        assert building.wait(10), "the builds did not run while the scan did"
        return Disc()

    monkeypatch.setattr(apply, "build_kernels", fake_builds)
    monkeypatch.setattr(patch_cli, "_discovery", fake_discovery)
    monkeypatch.setattr(patch_cli, "_run_forwarding_signals", lambda cmd, env: 0)
    monkeypatch.setattr(patch_cli, "read_counters", lambda d: [], raising=False)
    (tmp_path / "src" / "sglang").mkdir(parents=True)
    (tmp_path / "src" / "sglang" / "__init__.py").write_text("")
    code, _, err = run_cli(["patch", "--serve", "--ops", "silu_and_mul,rmsnorm", "--sglang-src", str(tmp_path / "src"),
                            "--counter-dir", str(tmp_path / "cnt"), "--arch", "sm_90", "--python", "python-x",
                            "--", "--port", "1"], capsys)
    assert sorted(order) == ["build", "scan"]
    assert "silu_and_mul: kernels/silu_and_mul/kernel.cu -> /cache/silu_and_mul.so (1.5s)" in err
    assert "WARNING rmsnorm: no call site" in err and "WARNING silu_and_mul" not in err

    order.clear()
    code, _, err = run_cli(["patch", "--serve", "--ops", "silu_and_mul", "--sglang-src", str(tmp_path / "none"),
                            "--arch", "sm_90", "--python", "python-x", "--", "--port", "1"], capsys)
    assert code == 2 and order == []
    one_error(err, "--sglang-src", "no sglang package there")


def test_another_servers_python_is_scanned_for_its_own_sglang(tmp_path, monkeypatch, capsys):
    """`patch --serve --python OTHER`: the plan's call sites come from the SGLang that OTHER imports (it may be another
    version than this CLI's), found without importing it; a Python without sglang, or one that cannot run, is one
    error line before any build."""
    import stat

    from astra_sglang.errors import AstraError
    from astra_sglang.patch import apply, cli as patch_cli
    from cli_run import one_error, run_cli

    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('imported: find_spec must not run the package')\n")
    other = tmp_path / "python-other"
    other.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    other.chmod(other.stat().st_mode | stat.S_IEXEC)
    assert patch_cli._server_sglang(str(other), None) == pkg
    assert patch_cli._server_sglang(sys.executable, None) is None                 # this Python: its own SGLang
    assert patch_cli._server_sglang(str(other), tmp_path / "src") == tmp_path / "src"   # --sglang-src wins

    bare = tmp_path / "python-bare"
    bare.write_text(f"#!/bin/sh\ncd {tmp_path} && PYTHONPATH= exec {sys.executable} -I \"$@\"\n")
    bare.chmod(bare.stat().st_mode | stat.S_IEXEC)
    if subprocess.run([str(bare), "-c", patch_cli._FIND_SGLANG], capture_output=True, text=True).stdout.strip():
        pytest.skip("the interpreter itself has sglang in its site-packages")
    with pytest.raises(AstraError, match="sglang is not installed there"):
        patch_cli._server_sglang(str(bare), None)
    nsp = tmp_path / "nsp"
    (nsp / "sglang").mkdir(parents=True)    # a bare sglang/ dir on the path: a namespace package, not SGLang
    bare_nsp = tmp_path / "python-nsp"
    bare_nsp.write_text(f"#!/bin/sh\ncd {nsp} && PYTHONPATH= exec {sys.executable} \"$@\"\n")
    bare_nsp.chmod(bare_nsp.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(AstraError, match="sglang is not installed there"):
        patch_cli._server_sglang(str(bare_nsp), None)
    with pytest.raises(AstraError, match="cannot run it"):
        patch_cli._server_sglang(str(tmp_path / "no-such-python"), None)

    seen = []
    monkeypatch.setattr(apply, "build_kernels", lambda *a, **k: seen.append("build") or {})
    monkeypatch.setattr(patch_cli, "_discovery", lambda ops, src: seen.append(src) or None)
    code, _, err = run_cli(["patch", "--serve", "--ops", "silu_and_mul", "--arch", "sm_90", "--python", str(bare),
                            "--", "--port", "1"], capsys)
    assert code == 2 and seen == []
    one_error(err, f"--python {bare}", "sglang is not installed there")


def test_a_plan_found_in_process_is_exported_to_the_processes_sglang_spawns(sglang_tree, tmp_path):
    """apply_astra_kernels(propagate=True) with a discovery of its own (not a plan file) writes it beside the counters,
    one file a process, and exports its path, so SGLang's spawned schedulers load it instead of scanning SGLang again
    (libcst there); a later apply without a plan exports none."""
    sglang_root, discovery = sglang_tree
    (tmp_path / "given.json").write_text(discovery.to_json())
    res, _ = run_child(_REAL_PRELUDE.format(root=str(sglang_root)) + f"""
from astra_sglang.patch import config as C
from astra_sglang.patch.discover import Discovery
disc = Discovery.from_json(open({str(tmp_path / 'given.json')!r}).read())
apply_astra_kernels(["fused_add_rmsnorm"], backends=E.astra_standins(), counter_dir={str(tmp_path / 'c')!r},
                    propagate=True, self_check="off", plan=disc)
path = os.environ.get(C.ENV_PLAN)
same = Discovery.from_json(open(path).read()).to_json() == disc.to_json()
revert_astra_kernels()
apply_astra_kernels(["fused_add_rmsnorm"], backends=E.astra_standins(), counter_dir={str(tmp_path / 'c')!r},
                    propagate=True, self_check="off", plan=False)   # no plan now: none exported
print(json.dumps(dict(path=path, same=same, pid=os.getpid(), after=os.environ.get(C.ENV_PLAN))))
""")
    assert res["path"] == str(tmp_path / "c" / f"plan.{res['pid']}.json") and res["same"] and not res["after"]
    assert not list((tmp_path / "c").glob("*.tmp"))   # written whole, then renamed
