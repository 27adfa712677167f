"""astra-sglang: make SGLang's production GPU kernels faster and put them back."""
import os as _os

__version__ = "0.1.0"

# The stage folders (extract/, patch/, e2e/, kernels/) install as astra_sglang.<stage> (setup.py).
# Imported straight from a source checkout (PYTHONPATH=<checkout>, or an editable install whose
# mapping the local setuptools could not set up), they sit beside this package: adding the checkout
# root to the package path lets `astra_sglang.kernels` and the rest resolve to them, with no install.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "setup.py")) and _os.path.isfile(_os.path.join(_root, "kernels", "__init__.py")):
    __path__.append(_root)  # noqa: F821  (a package's __path__)
