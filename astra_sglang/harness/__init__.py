"""The harness: check and bench, one concern a module, in dependency order (no cycles):

  stats      medians, spreads, the one geomean
  results    CheckResult, BenchRow, BenchReport (JSON, table, plot)
  numerics   the error metric, tolerance rule, poison
  guards     guarded buffers
  cases      shapes, dtypes, distribution plans, seeds
  inputs     fresh inputs; the production variant's conventions
  impl       a built library or a Python stand-in behind one call
  oracle     one case: run both, compare everything
  timer      CUDA-graph timing, copy ceiling, launch floor, in-context timing
  graphcheck the candidate checked the way it is timed (in a graph, on a stream behind work)
  worker     the child process every GPU job runs in
  checkjob   the check job (worker side) and run_check
  sanitize   compute-sanitizer
  check      check_candidate: static checks, build, the check job, sanitizer
  bench      bench: timing, in-context timing, the timed graph re-checked, impossible numbers refused
  ncu        Nsight Compute for one shape
  cli        the `check` and `bench` commands

Modules import torch lazily: everything here imports on a machine without it.
"""
