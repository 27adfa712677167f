"""The SGLang layer `validate` drives for this op: the attention backends' merge_state helper."""


def run_layer(inp, dims, scalars):
    from sglang.srt.layers.attention.merge_state import merge_state

    v, s = merge_state(inp["v_a"], inp["s_a"], inp["v_b"], inp["s_b"])
    return {"v_out": v, "s_out": s}
