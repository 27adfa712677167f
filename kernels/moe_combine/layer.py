"""The SGLang code `validate` drives for this op: fused_moe's combine as fused_experts_impl runs it on CUDA,
through the module's own selector and callables (looked up on the module at call time, so the patch is what
runs). The rest of fused_experts_impl (routing, the two grouped GEMMs) needs weights and a runtime context and
only produces the input; the spec's input stands in for intermediate_cache3."""


def run_layer(inp, dims, scalars):
    import torch
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm

    x, out = inp["input"], inp["output"]
    t, k, h = dims
    s = float(scalars.get("routed_scaling_factor", 1.0))
    with torch.no_grad():
        if k == 2 and s == 1.0:
            torch.add(x[:, 0], x[:, 1], out=out)  # SGLang's own branch; nothing to patch (validate: n/a)
        elif fm._use_moe_sum_reduce_torch_compile(t):
            pdl = getattr(fm, "is_arch_support_pdl", None)  # 0.5.23: the Triton kernel on PDL archs
            if pdl is not None and pdl():
                fm.moe_sum_reduce_triton(x, out, s)
            else:
                fm.moe_sum_reduce_torch_compile(x, out, s)
        else:
            fm.moe_sum_reduce(x, out, s)
    return {"output": out}
