"""Deprecated import path: results and statistics live in astra_sglang.harness (results, stats)."""
from .harness.results import BenchReport, BenchRow, format_check  # noqa: F401
from .harness.stats import geomean, is_noise, median, pct_of_ceiling, percentile, spread  # noqa: F401
