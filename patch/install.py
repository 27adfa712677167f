"""Putting a replacement in place of one callable on its module, and taking it out again.

Through SGLang's own plugin API where the loaded SGLang has it (0.5.17 and 0.5.23:
`sglang.srt.plugins.hook_registry.HookRegistry`): a REPLACE hook on the dotted target, which
sets the module attribute and also rebinds every stale `from X import Y` reference in the
loaded modules. Our own identity rebinding (`sweep`) is kept only for what that API cannot do:

- undo: HookRegistry has no revert. `uninstall` binds the original again wherever the
  installed object is bound and withdraws our hook, so a later install applies again;
- no HookRegistry in the process: an SGLang without the plugin API, `sglang` not imported
  yet (the Python API called before `import sglang`), or a package named `sglang` that is
  not SGLang's (the tests' synthetic one). Then: setattr on the module and the same sweep.

*When* a target is installed stays with the patcher (apply.py): now for a loaded module, or
when its module finishes importing. HookRegistry resolves a target by importing it, which the
start-up hook cannot allow while `import sglang` is still running.
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, List, Tuple

VIA_SGLANG = "sglang HookRegistry"
VIA_ASTRA = "astra"


def hook_registry():
    """(HookRegistry, HookSource, HookType) of the loaded SGLang, or None. Never imports SGLang itself."""
    if "sglang" not in sys.modules:
        return None
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType
    except Exception:  # no plugin API in this SGLang (or not SGLang's package)
        return None
    return HookRegistry, HookSource, HookType


def holders(obj: Any) -> List[Tuple[types.ModuleType, str]]:
    """Every (module, global name) in sys.modules bound to `obj`."""
    out = []
    for m in list(sys.modules.values()):
        if not isinstance(m, types.ModuleType):
            continue
        try:
            ns = vars(m)
        except TypeError:
            continue
        out += [(m, k) for k, v in list(ns.items()) if v is obj]
    return out


def sweep(old: Any, new: Any) -> None:
    """Bind `new` wherever a module global is `old`."""
    for m, k in holders(old):
        try:
            setattr(m, k, new)
        except (AttributeError, TypeError):
            pass


@dataclass
class Installed:
    module: types.ModuleType
    name: str
    original: Any
    replacement: Any  # ours
    bound: Any  # what the module attribute now holds: ours, or HookRegistry's wrapper around ours
    via: str
    rebound: List[str] = field(default_factory=list)  # other "module:name" now bound to it

    @property
    def dotted(self) -> str:
        return f"{self.module.__name__}.{self.name}"


def install(module: types.ModuleType, name: str, original: Any, replacement: Any) -> Installed:
    """Bind `replacement` as module.name and wherever `original` is bound."""
    inst = Installed(module, name, original, replacement, replacement, VIA_ASTRA)
    hr = hook_registry()
    if hr is not None:
        registry, source, kind = hr
        # apply_hooks() also applies hooks other plugins registered and SGLang would apply
        # a moment later (load_plugins ends with it); applied targets are never applied twice
        registry.register(inst.dotted, replacement, kind.REPLACE, source=source("astra_sglang", "astra-sglang"))
        registry.apply_hooks()
        bound = getattr(module, name, None)
        if bound is not original:
            inst.bound, inst.via = bound, VIA_SGLANG
        else:  # SGLang could not apply it (it logged why): do it ourselves
            _withdraw(inst)
    if inst.via == VIA_ASTRA:
        setattr(module, name, replacement)
        sweep(original, replacement)
    for attr, val in vars(replacement).items():  # __astra_op__ etc. also on HookRegistry's wrapper
        if attr.startswith("__astra_") and inst.bound is not replacement:
            setattr(inst.bound, attr, val)
    inst.bound.__astra_via__ = inst.via
    inst.rebound = [f"{m.__name__}:{k}" for m, k in holders(inst.bound) if m is not module]
    return inst


def uninstall(inst: Installed) -> None:
    """Bind the original again wherever the installed object is; withdraw our hook."""
    if getattr(inst.module, inst.name, None) is inst.bound:
        setattr(inst.module, inst.name, inst.original)
    sweep(inst.bound, inst.original)
    if inst.via == VIA_SGLANG:
        _withdraw(inst)


def _withdraw(inst: Installed) -> None:
    """Take our REPLACE hook out of HookRegistry (its two class attributes are all its state; it has
    no public undo), so that installing the target again in this process applies again."""
    hr = hook_registry()
    if hr is None:
        return
    registry = hr[0]
    hooks = registry._hooks.get(inst.dotted)
    if hooks is not None:
        hooks[:] = [h for h in hooks if h[1] is not inst.replacement]
        if not hooks:
            del registry._hooks[inst.dotted]
            registry._patched.discard(inst.dotted)
