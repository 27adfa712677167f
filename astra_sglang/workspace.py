"""Deprecated import path: workspaces live in astra_sglang.build.workspace."""
from .build.workspace import DEFAULT_ROOT, Workspace, open_workspace  # noqa: F401
