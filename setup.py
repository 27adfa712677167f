"""Package discovery: each stage folder installs under astra_sglang, and every folder with an
__init__.py below it is a package, so a new op (kernels/<op>/) needs no edit here.
Metadata, dependencies and package data live in pyproject.toml."""
from pathlib import Path

from setuptools import setup

ROOTS = {
    "astra_sglang": "astra_sglang",
    "astra_sglang.extract": "extract",
    "astra_sglang.patch": "patch",
    "astra_sglang.e2e": "e2e",
    "astra_sglang.kernels": "kernels",
}


def find_packages():
    here = Path(__file__).resolve().parent
    pkgs = set()
    for pkg, folder in ROOTS.items():
        for init in (here / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(here / folder).parts
            pkgs.add(".".join((pkg,) + rel))
    return sorted(pkgs)


setup(package_dir=ROOTS, packages=find_packages())
