"""Deprecated import path: the check lives in astra_sglang.harness (check, checkjob, numerics, ...)."""
from .harness.cases import case_plan, select_shapes, workspace_dtypes  # noqa: F401
from .harness.check import GRAPH_SETS, check_candidate  # noqa: F401
from .harness.checkjob import DEFAULT_TIMEOUT, MAX_FAILURES, CheckRun, run_check, run_check_job  # noqa: F401
from .harness.guards import GUARD_BYTES, GuardedSet  # noqa: F401
from .harness.impl import Impl  # noqa: F401
from .harness.inputs import from_prod_abi, make_case_inputs, reference_kwargs, to_prod_abi  # noqa: F401
from .harness.numerics import (BASELINE_SLACK, count_poison, dtype_name, nonfinite_mismatch, poison_,  # noqa: F401
                               rel_err, tolerance)
from .harness.oracle import FatalCaseError, run_case  # noqa: F401
from .harness.results import CheckResult  # noqa: F401
from .harness.sanitize import parse_sanitizer_log, sanitize_run, sanitizer_shapes  # noqa: F401
