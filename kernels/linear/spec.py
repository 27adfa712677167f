"""linear: an unquantized linear at decode sizes, out[t, n] = sum_k x[t, k] * weight[n, k].

x [tokens, in_features], weight [out_features, in_features] (the layer's parameter), out [tokens, out_features] in
the model dtype: fp32 accumulation, one rounding. At a few tokens this is a weight stream: every dense projection of
a decode step (qkv_proj, o_proj, gate_up_proj, down_proj; in MoE models the attention's) reads its whole weight once.

What SGLang runs (0.5.17 and 0.5.23, CUDA, an unquantized bf16 / fp16 model, no bias): QKVParallelLinear,
MergedColumnParallelLinear, ColumnParallelLinear and RowParallelLinear call `self.quant_method.apply(self, x, bias)`,
and UnquantizedLinearMethod.apply ends in `F.linear(x, layer.weight, bias)`: cuBLAS. At batch 1 on an H200 cuBLAS
streams the 16-50 MB projections of 8B-30B models at 1.7-3.0 TB/s (often split-K with a second reduction kernel),
against a ~4.3 TB/s copy ceiling (results/2026-11-26-h200/linear/). SGLang 0.5.23 has an opt-in Hopper GEMV of its
own for one token (`--bf16-gemm-backend gemv`); by default it runs cuBLAS, and the adapter leaves the opt-in alone.

Production is cuBLAS behind a torch call, which extract cannot turn into CUDA: the only variant is `installed`,
SGLang's UnquantizedLinearMethod.apply through the adapter (what a decode step pays per projection, eager and in CUDA
graphs).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes

# (model, ((projection, in_features, out_features), ...)) at TP 1 unless named: unquantized, bias-free projections
PROJECTION_MODELS: Tuple[Tuple[str, Tuple[Tuple[str, int, int], ...]], ...] = (
    ("llama-3-8b", (("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096))),
    ("qwen3-8b", (("qkv", 4096, 6144), ("gate_up", 4096, 24576), ("down", 12288, 4096))),
    ("qwen3-30b-a3b", (("qkv", 2048, 5120), ("o", 4096, 2048))),
    ("gemma-2-9b", (("qkv", 3584, 8192), ("o", 4096, 3584), ("gate_up", 3584, 28672), ("down", 14336, 3584))),
    # their down_proj rows (15360, 18944, 21504 inputs): 1.08-1.32x in context (2026-11-30), the adapter's bound then
    ("gemma-3-12b", (("qkv", 3840, 8192), ("o", 4096, 3840), ("gate_up", 3840, 30720), ("down", 15360, 3840))),
    ("qwen2.5-7b", (("o", 3584, 3584), ("gate_up", 3584, 37888), ("down", 18944, 3584))),   # qkv has a bias
    ("gemma-3-27b", (("o", 4096, 5376), ("down", 21504, 5376))),
    # Gemma-7B's 24576-wide down_proj: the evidence for MAX_IN_FEATURES 24576 at 1-2 tokens (2026-12-01)
    ("gemma-7b", (("down", 24576, 3072),)),
    ("llama-3-70b-tp2", (("qkv", 8192, 5120), ("o", 4096, 8192), ("gate_up", 8192, 28672), ("down", 14336, 8192))),
    ("llama-3-70b-tp8", (("qkv", 8192, 1280), ("o", 1024, 8192), ("gate_up", 8192, 7168), ("down", 3584, 8192))),
)
DECODE = (1, 2, 4, 8)


# validate's sample of the corpus misses the rows the adapter's widest bound rests on: these run in SGLang's layer too
VALIDATE_MIN_IN_FEATURES = 14337


def _corpus() -> Tuple[Shape, ...]:
    out = []
    for model, projections in PROJECTION_MODELS:
        for proj, k, n in projections:
            for t in DECODE:
                tags = ("decode", "validate") if k >= VALIDATE_MIN_IN_FEATURES and t <= 4 else ("decode",)
                out.append(Shape((t, k, n), tags, f"{model} {proj}"))
    return dedupe_shapes(out)


EDGE = (
    Shape((1, 8, 1), ("edge",), "one output of one vector"),
    Shape((3, 1002, 5), ("edge",), "in_features not a multiple of 8 (the scalar path)"),
    Shape((2, 2048, 130), ("edge",), "out_features not a multiple of the CTA's 4 rows"),
    Shape((11, 520, 96), ("edge",), "two token groups (8 + 3); in_features not a multiple of the 256-vector sweep"),
    Shape((3, 1032, 4808), ("edge",), "tensor-core path with 16-row CTAs (4808 / 16 = 300.5): a partial last tile and "
                                      "a partial 256-wide chunk"),
    Shape((7, 1544, 2500), ("edge",), "tensor-core path with 8-row CTAs (157 16-row tiles would be < 200), a partial "
                                      "last tile and a partial 256-wide chunk"),
    Shape((5, 2056, 200), ("edge",), "tensor-core path with a grid of 25 8-row CTAs"),
)


def scalars(dims) -> Dict[str, Any]:
    return {}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """normal: x ~ N(0, 1), weight ~ N(0, 1/in_features) (outputs ~ N(0, 1), as trained projections of normed
    activations and router gates give: moe_gate's inputs too); outlier: a few input channels of x 100x larger (the massive activations of real residual
    streams), which the fp32 sum must carry without losing the small terms."""
    import torch

    from astra_sglang.spec import torch_dtype

    t, k, n = dims
    x = torch.randn((t, k), generator=gen, device=device, dtype=torch.float32)
    if dist == "outlier":
        idx = torch.randint(0, k, (max(1, k // 256),), generator=gen, device=device)
        x[:, idx] *= 100.0
    w = torch.randn((n, k), generator=gen, device=device, dtype=torch.float32) / k ** 0.5
    td = torch_dtype(dtype)
    return {"x": x.to(td), "weight": w.to(td), "out": torch.empty((t, n), device=device, dtype=td)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    return {"out": inp["x"].to(torch.float64) @ inp["weight"].to(torch.float64).t()}


def bytes_moved(dims, dtype: str) -> int:
    t, k, n = dims
    return (t * k + n * k + t * n) * DTYPE_BYTES[dtype]


_LINEAR = "srt/layers/linear.py"
_UNQUANT = "srt/layers/quantization/unquant.py"
# the source fact both linear and moe_gate (whose gate's apply is this one) rely on
APPLY_ENDS_IN_F_LINEAR = (
    _UNQUANT, r"^        return F\.linear\(x, layer\.weight, bias\)\s*\n",
    "UnquantizedLinearMethod.apply ends in F.linear(x, layer.weight, bias) (cuBLAS) once the AMX, aiter and bf16 GEMM "
    "backend branches are not taken")

SPEC = OpSpec(
    name="linear",
    summary="unquantized linear at decode sizes: out = x @ weight^T (fp32 accumulation), every dense projection's "
            "weight-streaming GEMV",
    dim_names=("num_tokens", "in_features", "out_features"),
    abi=(
        AbiArg("x", "ptr", "in"),
        AbiArg("weight", "ptr", "in"),
        AbiArg("out", "ptr", "out"),
        AbiArg("num_tokens", "i64"),
        AbiArg("in_features", "i64"),
        AbiArg("out_features", "i64"),
        AbiArg("dtype", "i32"),
    ),
    variants=(
        Variant(
            name="installed",
            description="SGLang's unquantized linear: UnquantizedLinearMethod.apply -> F.linear (cuBLAS)",
            provenance="sglang/srt/layers/linear.py QKVParallelLinear / MergedColumnParallelLinear / "
            "RowParallelLinear.forward -> self.quant_method.apply(self, x, bias) -> "
            "sglang/srt/layers/quantization/unquant.py UnquantizedLinearMethod.apply -> F.linear (cuBLAS)",
            sources=(),
            launcher="",
            flag_profile="sglang_jit",
            source_facts=(
                (_UNQUANT, r"class UnquantizedLinearMethod\(LinearMethodBase\):",
                 "UnquantizedLinearMethod is the linear method of an unquantized layer"),
                (_UNQUANT, r"    def apply\(\s*self,\s*layer: torch\.nn\.Module,\s*x: torch\.Tensor,\s*"
                           r"bias: Optional\[torch\.Tensor\] = None,\s*\) -> torch\.Tensor:\s*"
                           r"if use_intel_amx_backend\(layer\):",
                 "UnquantizedLinearMethod.apply(self, layer, x, bias=None) -> tensor: the method patch replaces, its "
                 "first branch the Intel AMX one"),
                APPLY_ENDS_IN_F_LINEAR,
                (_LINEAR, r"output_parallel = self\.quant_method\.apply\(self, input_, bias\)",
                 "ColumnParallelLinear.forward (qkv_proj, gate_up_proj) calls quant_method.apply(self, x, bias)"),
                (_LINEAR, r"output_parallel = self\.quant_method\.apply\(\s*self, input_parallel, bias=bias_\s*\)",
                 "RowParallelLinear.forward (o_proj, down_proj) calls quant_method.apply(self, x, bias=...)"),
            ),
            dtypes=("fp16", "bf16"),
            requires_root="sglang_py",
            callable="sglang.srt.layers.quantization.unquant:UnquantizedLinearMethod.apply",
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
    replaces=("sglang.srt.layers.quantization.unquant:UnquantizedLinearMethod.apply",),
    # cuBLAS's Hopper GEMM kernels (nvjet) are every linear's, so SGLang's side is not attributed to this op by name;
    # astra's astra_lin:: kernels
    kernel_symbols=(r"astra_lin::",),
)
