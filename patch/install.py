"""Putting a replacement in place of one callable on its module, and taking it out again.

Through SGLang's HookRegistry where the loaded SGLang has it (a REPLACE hook, which also rebinds
stale `from X import Y` copies); our own identity rebinding only for what that API cannot do:
undo, and processes without it. patch/README.md ("What gets replaced") says why each.
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, List

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


def owner(module: types.ModuleType, name: str):
    """(object holding the attribute, attribute) for `name` on `module`: a module global ("f"), or a class's
    method ("Class.method", the layer methods fused ops replace)."""
    obj = module
    *path, attr = name.split(".")
    for p in path:
        obj = getattr(obj, p)
    return obj, attr


def lookup(module: types.ModuleType, name: str) -> Any:
    """module.name, following "Class.method"; None where any step is missing."""
    try:
        obj, attr = owner(module, name)
    except AttributeError:
        return None
    return getattr(obj, attr, None)


def holders(obj: Any) -> List[str]:
    """Every "module:name" global in sys.modules bound to `obj`."""
    out = []
    for name, m in list(sys.modules.items()):
        if isinstance(m, types.ModuleType):
            out += [f"{name}:{k}" for k, v in list(getattr(m, "__dict__", {}).items()) if v is obj]
    return out


def sweep(old: Any, new: Any) -> None:
    """Bind `new` wherever a module global is `old`."""
    for h in holders(old):
        mod, k = h.split(":", 1)
        try:
            setattr(sys.modules[mod], k, new)
        except (AttributeError, TypeError):
            pass


@dataclass
class Installed:
    module: types.ModuleType
    name: str
    original: Any
    replacement: Any  # ours
    bound: Any  # what module.name now holds: ours, or HookRegistry's wrapper around ours
    via: str = VIA_ASTRA
    rebound: List[str] = field(default_factory=list)  # other "module:name" now bound to it


def install(module: types.ModuleType, name: str, original: Any, replacement: Any) -> Installed:
    """Bind `replacement` as module.name and wherever `original` is bound."""
    inst = Installed(module, name, original, replacement, replacement)
    hr = hook_registry()
    if hr is not None:
        registry, source, kind = hr
        # apply_hooks() also applies hooks other plugins registered, which SGLang's load_plugins
        # would apply a moment later; an applied target is never applied twice
        registry.register(f"{module.__name__}.{name}", replacement, kind.REPLACE,
                          source=source("astra_sglang", "astra-sglang"))
        registry.apply_hooks()
        if lookup(module, name) is not original:
            inst.bound, inst.via = lookup(module, name), VIA_SGLANG
            # SGLang's REPLACE wrapper is functools.wraps(original) in a module without torch: our resolved
            # signature must travel, or torch.library.infer_schema fails on it (see apply.resolve_signature)
            inst.bound.__dict__.update({k: v for k, v in vars(replacement).items()
                                        if k.startswith("__astra_") or k == "__signature__"})
        else:  # SGLang could not apply it (and logged why): do it ourselves
            _withdraw(inst)
    if inst.via == VIA_ASTRA:
        setattr(*owner(module, name), replacement)
        sweep(original, replacement)
    else:
        # SGLang's propagation skips the defining module: an alias there (topk.py's
        # `biased_grouped_topk = biased_grouped_topk_gpu`, what select_experts calls) kept the original
        sweep(original, inst.bound)
    inst.bound.__astra_via__ = inst.via
    inst.rebound = [h for h in holders(inst.bound) if h != f"{module.__name__}:{name}"]
    return inst


def uninstall(inst: Installed) -> None:
    """Bind the original again wherever the installed object is; withdraw our hook."""
    sweep(inst.bound, inst.original)
    obj, attr = owner(inst.module, inst.name)
    if getattr(obj, attr, None) is inst.bound:  # a class's method: no module global held it
        setattr(obj, attr, inst.original)
    if inst.via == VIA_SGLANG:
        _withdraw(inst)


def _withdraw(inst: Installed) -> None:
    """Take our REPLACE hook out of HookRegistry, which has no public undo (its two class attributes are
    all its state), so that installing the target again in this process applies again."""
    hr = hook_registry()
    dotted = f"{inst.module.__name__}.{inst.name}"
    hooks = hr[0]._hooks.get(dotted) if hr else None
    if hooks is not None:
        hooks[:] = [h for h in hooks if h[1] is not inst.replacement]
        if not hooks:
            del hr[0]._hooks[dotted]
            hr[0]._patched.discard(dotted)
