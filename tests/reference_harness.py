"""The check harness run on CPU for an op, with the op's own fp64 reference behind the ABI as both candidate and
production: make_inputs, the guard regions, in-place roles, scalars and the tolerance rule fit together. Shared by
the per-op tests (tests/test_op_*.py, tests/test_ops_rope_kv.py); no kernel runs."""
import torch


def reference_impl(spec):
    """An ABI implementation from the spec's reference (what a built kernel would write), for CPU runs."""

    def impl(tensors, dims, dtype, scalars, stream=None):
        ins = {a.name: tensors[a.name] for a in spec.abi if a.ctype == "ptr"}
        for n, r in spec.reference({n: x.double() for n, x in ins.items()}, dims, scalars).items():
            tensors[n].copy_(r.to(tensors[n].dtype))
        return 0

    return impl


def run_edge_cases_on_cpu(spec) -> None:
    """Every edge shape and the first corpus shape, every dtype and distribution (the re-run included), through
    oracle.run_case on CPU; asserts no failure and every comparison ok."""
    from astra_sglang.harness.guards import GuardedSet
    from astra_sglang.harness.oracle import run_case

    impl = reference_impl(spec)
    for shape in list(spec.edge_shapes) + [spec.corpus[0]]:
        for dt in spec.dtypes:
            protos = spec.make_inputs(shape.dims, dt, torch.Generator().manual_seed(1), spec.distributions[0],
                                      device="cpu")
            bc, bp = GuardedSet(spec, protos, "cpu", 1024), GuardedSet(spec, protos, "cpu", 1024)
            for run, dist in enumerate(spec.distributions):
                details, failures, _ = run_case(spec, impl, impl, bc, bp, shape.dims, dt, dist, 7, "cpu",
                                                run_index=run)
                assert not failures, failures
                assert details and all(d["ok"] for d in details)
