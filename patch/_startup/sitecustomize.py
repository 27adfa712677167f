"""astra-sglang start-up hook (put this directory first on PYTHONPATH; the CLI does).

Inert unless ASTRA_SGLANG_OPS is set and ASTRA_SGLANG_DISABLE is not. Then it waits for
`sglang` to be imported and activates the patch right after (astra_sglang.patch.hook),
so only SGLang's processes pay for it. Another sitecustomize later on sys.path (a
distribution's, a virtualenv's) still runs: this one chains to it.
"""
import os
import sys


def _astra_install():
    if not os.environ.get("ASTRA_SGLANG_OPS"):
        return
    if os.environ.get("ASTRA_SGLANG_DISABLE", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return
    if os.environ.get("ASTRA_SGLANG_OPS", "").strip().lower() == "none":
        return

    try:
        from astra_sglang.patch._posthook import spec_with_post_exec
    except Exception as e:  # astra_sglang not importable here: say so, run unpatched
        sys.stderr.write(f"astra-sglang: start-up hook cannot import astra_sglang ({e!r}); SGLang runs UNPATCHED\n")
        return

    def _activate(module):
        try:
            from astra_sglang.patch.hook import activate_from_env
        except Exception as e:
            sys.stderr.write(f"astra-sglang: start-up hook cannot import astra_sglang ({e!r}); SGLang runs UNPATCHED\n")
            return
        activate_from_env("start-up hook")

    class _AstraSGLangStartup:
        """Finds nothing; after `sglang` finished importing, activates the patch once."""

        def __init__(self):
            self.done = False

        def find_spec(self, fullname, path=None, target=None):
            if self.done or fullname != "sglang":
                return None
            self.done = True
            return spec_with_post_exec(self, fullname, path, target, _activate, owner="startup")

    if "sglang" in sys.modules:
        _activate(sys.modules["sglang"])
        return
    sys.meta_path.insert(0, _AstraSGLangStartup())


def _astra_chain():
    """Run the next sitecustomize on sys.path, which this file shadows."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.getcwd()) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.origin and os.path.abspath(spec.origin) != os.path.abspath(__file__):
            mod = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(mod)
            except Exception as e:
                sys.stderr.write(f"astra-sglang: the chained sitecustomize {spec.origin} failed: {e!r}\n")
            return


_astra_install()
_astra_chain()
