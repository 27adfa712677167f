"""moe_gate: the MoE router's logits GEMM at decode sizes, out[t, e] = sum_h x[t, h] * weight[e, h].

x [tokens, hidden] (the post-attention norm's output), weight [experts, hidden] (the gate's parameter), out
[tokens, experts] in the model dtype: fp32 accumulation, one rounding. It feeds the top-k router (moe_router).

What SGLang runs (0.5.17 and 0.5.23, CUDA, an unquantized gate): Qwen3-MoE, Qwen2-MoE and Mixtral build `self.gate =
ReplicatedLinear(hidden_size, num_experts, bias=False)` and call `router_logits, _ = self.gate(hidden_states)`;
ReplicatedLinear.forward -> UnquantizedLinearMethod.apply -> `F.linear(x, layer.weight, bias)`: cuBLAS. On Hopper at
batch 1 cuBLAS tiles a [1, 2048] x [2048, 128] product into a few CTAs of 64 outputs that each stream 256 KB of
weights: 5-9 us per layer for 0.5 MB (the Qwen3-30B-A3B decode profile, results/2026-11-26-h200/). DeepSeek-V3 has
its own router GEMM kernel (dsv3_router_gemm) and gpt-oss's router has a bias: neither is this op.

Production is cuBLAS behind a torch call, which extract cannot turn into CUDA: the only variant is `installed`, SGLang's
ReplicatedLinear.forward through the adapter (what a decode step pays per layer, eager and in CUDA graphs).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

# x [tokens, hidden] by weight [experts, hidden] is linear's contract on (tokens, in_features, out_features): its
# inputs (weight ~ N(0, 1/hidden): logits ~ N(0, 1), as a trained gate gives), fp64 reference, bytes and the fact
# that apply ends in F.linear serve here
from astra_sglang.kernels.linear.spec import APPLY_ENDS_IN_F_LINEAR, bytes_moved, make_inputs, reference
from astra_sglang.spec import AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes

# (name, hidden, experts): models whose gate is an unquantized, bias-free ReplicatedLinear
GATE_MODELS: Tuple[Tuple[str, int, int], ...] = (
    ("qwen3-30b-a3b", 2048, 128),
    ("qwen3-235b-a22b", 4096, 128),
    ("qwen2-57b-a14b", 3584, 64),
    ("qwen1.5-moe-a2.7b", 2048, 60),
    ("mixtral-8x7b", 4096, 8),
)
DECODE = (1, 8, 32, 64)
PREFILL = (256, 1024)
MAX_HIDDEN = 8192  # the shipped kernel holds a row slice in one warp's registers


def _corpus() -> Tuple[Shape, ...]:
    out = []
    for name, h, e in GATE_MODELS:
        for t in DECODE + PREFILL:
            out.append(Shape((t, h, e), ("decode" if t in DECODE else "prefill",), name))
    return dedupe_shapes(out)


EDGE = (
    Shape((1, 2048, 1), ("edge",), "one expert"),
    Shape((3, 1002, 5), ("edge",), "hidden not a multiple of 8 (the scalar path)"),
    Shape((17, 2048, 128), ("edge",), "a token count that is not a chunk multiple"),
    Shape((2, 8192, 16), ("edge", "largest-row"), "the widest row the shipped kernel takes"),
    Shape((40, 4096, 130), ("edge",), "x chunks of 8 tokens, experts not a multiple of the CTA's 4 rows"),
)


def scalars(dims) -> Dict[str, Any]:
    return {}


_QWEN3_MOE = "srt/models/qwen3_moe.py"
_LINEAR = "srt/layers/linear.py"

SPEC = OpSpec(
    name="moe_gate",
    summary="MoE router logits GEMM at decode sizes: out = x @ weight^T (fp32 accumulation), the gate before top-k",
    dim_names=("num_tokens", "hidden", "num_experts"),
    abi=(
        AbiArg("x", "ptr", "in"),
        AbiArg("weight", "ptr", "in"),
        AbiArg("out", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("hidden", "i64"),
        AbiArg("num_experts", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="installed",
            description="SGLang's ReplicatedLinear gate: UnquantizedLinearMethod.apply -> F.linear (cuBLAS)",
            provenance="sglang/srt/models/qwen3_moe.py Qwen3MoeSparseMoeBlock: self.gate = ReplicatedLinear(hidden, "
            "num_experts, bias=False) -> sglang/srt/layers/linear.py ReplicatedLinear.forward -> "
            "sglang/srt/layers/quantization/unquant.py UnquantizedLinearMethod.apply -> F.linear (cuBLAS)",
            sources=(),
            launcher="",
            flag_profile="sglang_jit",
            source_facts=(
                (_QWEN3_MOE, r"self\.gate = ReplicatedLinear\(\s*config\.hidden_size,\s*config\.num_experts,\s*"
                             r"bias=False,",
                 "Qwen3-MoE's gate is a bias-free ReplicatedLinear(hidden_size, num_experts)"),
                (_QWEN3_MOE, r"router_logits, _ = self\.gate\(hidden_states\)",
                 "the MoE block calls the gate on its hidden states for the router logits"),
                (_LINEAR, r"def forward\(self, x: torch\.Tensor\) -> Tuple\[torch\.Tensor, Optional\[torch\.Tensor\]\]:"
                          r"\s*bias = self\.bias if not self\.skip_bias_add else None\s*"
                          r"assert self\.quant_method is not None\s*"
                          r"output = self\.quant_method\.apply\(self, x, bias\)\s*"
                          r"output_bias = self\.bias if self\.skip_bias_add else None\s*return output, output_bias",
                 "ReplicatedLinear.forward(x) -> (quant_method.apply(self, x, bias), output bias): the method "
                 "patch replaces and the pair it returns"),
                APPLY_ENDS_IN_F_LINEAR,
            ),
            dtypes=("fp16", "bf16"),
            requires_root="sglang_py",
            callable="sglang.srt.layers.linear:ReplicatedLinear.forward",
        ),
    ),
    default_variant=lambda roots: "installed",
    dtypes=("fp16", "bf16"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=Tolerance(k=2.0),
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "outlier"),
    replaces=("sglang.srt.layers.linear:ReplicatedLinear.forward",),
    # cuBLAS's Hopper GEMM kernels (nvjet) are every linear's, so SGLang's side is not attributed to this op by name;
    # astra's astra_moeg:: kernel
    kernel_symbols=(r"astra_moeg::",),
)
