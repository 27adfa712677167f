"""Run a callback right after a module's body executed, without replacing its loader.

Used by the import hook of the patcher (apply._ExecHook) and by the start-up hook
(_startup/sitecustomize.py). Kept free of heavy imports: the start-up hook loads it in
every Python process of a patched server.
"""
import sys


def spec_with_post_exec(finder, fullname, path, target, after, owner):
    """Find `fullname` with the meta-path finders other than `finder`, and make the found
    loader call after(module) once the module body ran.

    The wrap is set on the loader *instance* (exec_module attribute), so isinstance checks
    and resource readers still see the original loader class. A loader shared by many
    modules is wrapped once per `owner`.
    """
    spec = None
    for f in sys.meta_path:
        if f is finder or not hasattr(f, "find_spec"):
            continue
        spec = f.find_spec(fullname, path, target)
        if spec is not None:
            break
    if spec is None or spec.loader is None or isinstance(spec.loader, type):
        return spec
    inner = getattr(spec.loader, "exec_module", None)
    owners = getattr(inner, "__astra_owners__", frozenset())
    if inner is None or owner in owners:
        return spec

    def exec_module(module, _inner=inner):
        _inner(module)
        after(module)

    exec_module.__astra_owners__ = owners | {owner}
    try:
        spec.loader.exec_module = exec_module
    except (AttributeError, TypeError):
        pass
    return spec
