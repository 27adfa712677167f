"""Deprecated import path: bench lives in astra_sglang.harness (bench, timer)."""
from .harness.bench import bench, run_bench_job  # noqa: F401
from .harness.timer import (DEFAULT_REPLAYS, HELPERS_CU, L2_FACTOR, build_helpers, ceiling_key,  # noqa: F401
                            graph_of, load_cached_ceiling, plan_calls, plan_sets, store_ceiling, time_graphs)
