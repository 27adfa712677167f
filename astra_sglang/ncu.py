"""Deprecated import path: Nsight Compute profiling lives in astra_sglang.harness.ncu."""
from .harness.ncu import ProfilerUnavailable, format_profile, profile  # noqa: F401
