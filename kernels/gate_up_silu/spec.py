"""gate_up_silu: a FUSED op. A dense MLP's gate_up projection and its SiLU-and-mul at decode sizes, in one launch:

    g[t, k] = T( sum_h x[t, h] * weight[k, h] ),   u[t, k] = T( sum_h x[t, h] * weight[I + k, h] )
    out[t, k] = T( silu(g[t, k]) * u[t, k] )                         fp32 math, rounded to the model dtype T

x [tokens, H] is the MLP's input, weight [2I, H] gate_up_proj's (gate rows 0..I-1, then the up rows; per rank under
tensor parallelism: MergedColumnParallelLinear's weight_loader puts shard i at rows sum(output_sizes[:i]) / tp, so a
rank holds [I/tp gate; I/tp up]), out [tokens, I] the activation down_proj reads. g and u are each rounded to T
before the activation, as the GEMM writes them for silu_and_mul to read, so the op computes what SGLang's two steps
compute; only the [tokens, 2I] round trip through memory and one launch go.

What SGLang runs (0.5.17 and 0.5.23, CUDA, an unquantized bf16 / fp16 model): LlamaMLP.forward and Qwen2MLP.forward
(Qwen3's dense MLP is Qwen2MLP imported as Qwen3MLP) call gate_up_proj (MergedColumnParallelLinear.forward ->
UnquantizedLinearMethod.apply -> F.linear: cuBLAS, or astra's linear where it is on and takes the shape), then
SiluAndMul.forward_cuda (the JIT ActivationKernel, op silu_and_mul), then down_proj. Production is the first two back
to back; a speedup of this op is over their SUM. The adapter keeps the down_proj call as SGLang makes it.

Production is cuBLAS followed by a JIT kernel behind torch, which extract cannot turn into one CUDA source: the only
variant is `installed`, the MLP forward through the adapter, whose `sequence` runs F.linear and SGLang's silu_and_mul
on the op's tensors (patch/adapters.py).

Every shape here has I a multiple of 8: SGLang's silu_and_mul takes no other width on these paths (its JIT kernel
needs I % 8 == 0 for fp16 / bf16, and the sgl_kernel fallback refused 3 x 1002 as "The pointers must be multiple of
16 bytes" on the H200, results/2026-11-27-h200/session7/sdp/), so production could not be checked there. With I a
multiple of 8 and kPairs 2 or 4, the kernel's partial last CTA never occurs; it stays guarded (kernel.cu).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from astra_sglang.families.activation import act_fn
from astra_sglang.kernels.linear import spec as _linear_spec
from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes

# (model, hidden H, intermediate I, TP degrees): dense MLPs SGLang runs as LlamaMLP / Qwen2MLP (Qwen3 dense). TP > 1
# rows are the per-rank intermediate widths I / tp (the hidden size is not sharded in gate_up_proj).
MLP_MODELS: Tuple[Tuple[str, int, int, Tuple[int, ...]], ...] = (
    ("qwen3-8b", 4096, 12288, (1,)),
    ("llama-3-8b", 4096, 14336, (1,)),
    ("qwen3-4b", 2560, 9728, (1,)),
    ("qwen3-1.7b", 2048, 6144, (1,)),
    ("llama-3.2-1b", 2048, 8192, (1,)),
    ("llama-3-70b", 8192, 28672, (2, 4, 8)),
)
DECODE = (1, 2)


def corpus(models: Sequence[Tuple[str, int, int, Tuple[int, ...]]]) -> Tuple[Shape, ...]:
    """(model, H, I, TP degrees) rows -> the decode shapes (1 and 2 tokens, the per-rank I / tp); gate_up_gelu_tanh's
    too."""
    out = []
    for model, hidden, inter, tps in models:
        for tp in tps:
            for t in DECODE:
                out.append(Shape((t, hidden, inter // tp), ("decode",), f"{model} tp{tp}"))
    return dedupe_shapes(out)


def model_dims(cfg: Dict[str, Any], tokens: int, tp: int = 1) -> Optional[Tuple[int, ...]]:
    """(tokens, H, I / tp) of a dense model's MLP from its config.json (the profile's speedup lookup); None for a MoE
    config, whose expert MLPs are not this op's. gate_up_gelu_tanh's too."""
    h, inter = int(cfg.get("hidden_size") or 0), int(cfg.get("intermediate_size") or 0)
    if not h or not inter or cfg.get("num_experts") or cfg.get("n_routed_experts") or inter % max(tp, 1):
        return None
    return (tokens, h, inter // max(tp, 1))


# (tokens, H, I); every I a multiple of 8 (the module docstring says why). gate_up_gelu_tanh's too
EDGE = (
    Shape((1, 8, 8), ("edge",), "one vector per row, the narrowest activation SGLang's act-and-mul kernels take"),
    Shape((3, 1002, 40), ("edge",), "hidden not a multiple of 8 (the scalar path); 3 tokens"),
    Shape((1, 2056, 264), ("edge",), "hidden not a multiple of the 256-vector sweep (a partial last stride)"),
    Shape((2, 4104, 1000), ("edge",), "a partial last stride at 2 tokens; I / kPairs CTAs not a multiple of 8"),
    Shape((7, 520, 96), ("edge",), "two token groups (4 + 3): more tokens than the adapter takes, still correct"),
)


def scalars(dims) -> Dict[str, Any]:
    return {}


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """normal: x ~ N(0, 1) (a normed hidden state), weight ~ N(0, 1/H), so g and u ~ N(0, 1); outlier: a few input
    channels of x 100x larger (linear's: the massive activations of real residual streams), g and u then reach
    tens, silu runs deep into both tails and the activation into the hundreds (finite in fp16)."""
    import torch

    from astra_sglang.spec import torch_dtype

    t, h, k = dims
    x = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
    if dist == "outlier":
        idx = torch.randint(0, h, (max(1, h // 256),), generator=gen, device=device)
        x[:, idx] *= 100.0
    w = torch.randn((2 * k, h), generator=gen, device=device, dtype=torch.float32) / h ** 0.5
    td = torch_dtype(dtype)
    return {"x": x.to(td), "weight": w.to(td), "out": torch.empty((t, k), device=device, dtype=td)}


def infer_model_dtype(*tensors):
    """The dtype SGLang's GEMM and silu_and_mul write in, where no one said it: the inputs' own, or, for fp64 copies,
    the one their values came from (every bf16 value survives a trip through bf16; a tensor of fp16 values, 10
    mantissa bits, essentially never does: 1 in 8 of them per element). None: no rounding. The harness passes the
    dtype instead (`model_dtype`, spec.py's reference contract), so an fp16 input whose values all happen to be
    bf16-representable is not rounded as bf16 there."""
    import torch

    dt = tensors[0].dtype
    if dt in (torch.float16, torch.bfloat16):
        return dt
    if dt == torch.float32:
        return None
    vals = torch.cat([t.reshape(-1) for t in tensors])
    vals = vals[torch.isfinite(vals)]  # inf / NaN survive either trip or none
    for cand in (torch.bfloat16, torch.float16):
        if torch.equal(vals.to(cand).to(vals.dtype), vals):
            return cand
    return None


def reference_for(act: str):
    """The fp64 reference of a fused gate_up + `act`-and-mul (act as ModelConfig.act names it: silu, gelu_tanh)."""

    def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any], model_dtype=None) -> Dict[str, Any]:
        import torch

        k = int(dims[2])
        x, w = inp["x"], inp["weight"]
        # the harness says the dtype (its fp64 copies lose it); a direct call with model tensors infers it
        dt = model_dtype if model_dtype in (torch.float16, torch.bfloat16) else infer_model_dtype(x, w)

        def rnd(v):
            return v.to(dt).to(torch.float64) if dt is not None else v

        gu = x.to(torch.float64) @ w.to(torch.float64).t()
        g, u = rnd(gu[:, :k]), rnd(gu[:, k:])
        return {"out": rnd(act_fn(act)(g) * u)}

    reference.__doc__ = (f"fp64 g and u, each rounded to the model dtype (the GEMM's output), fp64 {act}(g) * u "
                         "rounded to it again (the activation's output), back in fp64.")
    return reference


reference = reference_for("silu")


def bytes_moved(dims, dtype: str) -> int:
    """The fused op's own traffic: x once, the weight once, out once (production also writes and re-reads the
    [tokens, 2I] gate_up output)."""
    t, h, k = dims
    return (t * h + 2 * k * h + t * k) * DTYPE_BYTES[dtype]


_LLAMA = "srt/models/llama.py"
_QWEN2 = "srt/models/qwen2.py"
_QWEN3 = "srt/models/qwen3.py"
_ACT = "srt/layers/activation.py"
_LINEAR = "srt/layers/linear.py"

ABI = (
    AbiArg("x", "ptr", "in"),
    AbiArg("weight", "ptr", "in"),      # [2 * out_features, in_features]: gate rows, then up rows
    AbiArg("out", "ptr", "out"),        # [num_tokens, out_features]: the activation
    AbiArg("num_tokens", "i64"),
    AbiArg("in_features", "i64"),       # H: the MLP's hidden size
    AbiArg("out_features", "i64"),      # I: the (per-rank) intermediate width
    AbiArg("dtype", "i32"),
)
# What the adapter relies on in gate_up_proj's forward, whichever MLP calls it
GATE_UP_FACTS = (
    (_LINEAR, r"output_parallel = self\.quant_method\.apply\(self, input_, bias\)",
     "ColumnParallelLinear.forward (gate_up_proj) calls quant_method.apply(self, x, bias)"),
    _linear_spec.APPLY_ENDS_IN_F_LINEAR,
)


def installed_variant(*, description: str, provenance: str, facts, callable: str) -> Variant:
    """The one variant of a fused gate_up + activation op: SGLang's MLP forward (`callable`) through the adapter,
    whose `sequence` runs F.linear and SGLang's activation on the op's tensors (gate_up_gelu_tanh's too)."""
    return Variant(
        name="installed",
        description=description,
        provenance=provenance,
        sources=(),
        launcher="",
        flag_profile="sglang_jit",
        # the activation's math as SGLang's JIT activation builds it on sm_90 (fast math: silu's exp and division,
        # gelu_tanh's tanhf as tanh.approx.f32), and the flush-to-zero that comes with it, so the rounded
        # activation matches production's bits
        extra_flags=("--use_fast_math",),
        source_facts=(*facts, *GATE_UP_FACTS),
        dtypes=("fp16", "bf16"),
        requires_root="sglang_py",
        callable=callable,
    )


def fused_mlp_spec(*, name: str, summary: str, act: str, variant: Variant, corpus: Tuple[Shape, ...],
                   replaces: Tuple[str, ...], kernel_symbols: Tuple[str, ...]) -> OpSpec:
    """A fused gate_up GEMV + act-and-mul op: this op's ABI, inputs, bytes, edge shapes and tolerance, the
    reference of `act` (gate_up_gelu_tanh's too)."""
    return OpSpec(
        name=name,
        summary=summary,
        dim_names=("num_tokens", "in_features", "out_features"),
        abi=ABI,
        variants=(variant,),
        default_variant=lambda roots: variant.name,
        dtypes=("fp16", "bf16"),
        corpus=corpus,
        edge_shapes=EDGE,
        tolerance=Tolerance(k=2.0),  # linear's
        make_inputs=make_inputs,
        reference=reference_for(act),
        scalars=scalars,
        bytes_moved=bytes_moved,
        distributions=("normal", "outlier"),
        replaces=replaces,
        # only astra's kernel: SGLang's two are a cuBLAS GEMM and an activation kernel. No `fuses`: the profile
        # cannot tell the gate_up projection's GEMM from linear's other projections by name, so it cannot count
        # their sum for this op
        kernel_symbols=kernel_symbols,
    )


SPEC = fused_mlp_spec(
    name="gate_up_silu",
    summary="FUSED gate_up_proj GEMV + SiLU-and-mul epilogue of a dense MLP at 1-2 decode tokens (replaces the gate_up "
            "projection's cuBLAS GEMM, then SGLang's silu_and_mul kernel; speedups are over the sum of the two)",
    act="silu",
    variant=installed_variant(
        description="SGLang's dense MLP up to down_proj: gate_up_proj's UnquantizedLinearMethod.apply -> F.linear "
        "(cuBLAS), then SiluAndMul.forward_cuda (the JIT ActivationKernel)",
        provenance="sglang/srt/models/llama.py LlamaMLP.forward / srt/models/qwen2.py Qwen2MLP.forward (Qwen3's "
        "dense MLP) -> self.gate_up_proj(x) -> MergedColumnParallelLinear (ColumnParallelLinear.forward) -> "
        "UnquantizedLinearMethod.apply -> F.linear (cuBLAS); then self.act_fn(gate_up) -> "
        "SiluAndMul.forward_cuda -> srt/layers/activation.py silu_and_mul (JIT csrc/elementwise/activation.cuh)",
        facts=(
            (_LLAMA, r"class LlamaMLP\(nn\.Module\):",
             "LlamaMLP is the dense MLP of Llama models (the method patch replaces)"),
            (_LLAMA, r"^    def forward\(\s*self,\s*x,\s*forward_batch=None,?\s*\):",
             "LlamaMLP.forward(self, x, forward_batch=None)"),
            (_LLAMA, r"^ +gate_up, _ = self\.gate_up_proj\(x\)\n",
             "LlamaMLP.forward: gate_up_proj on the input (the GEMM this op does)"),
            (_LLAMA, r"^ +x = self\.act_fn\(gate_up\)\n", "LlamaMLP.forward: act_fn on gate_up_proj's output"),
            (_LLAMA, r"^        x, _ = self\.down_proj\(x\)\n        return x$",
             "LlamaMLP.forward ends in down_proj(x) on the activation (the replacement calls it the same way)"),
            (_QWEN2, r"class Qwen2MLP\(nn\.Module\):", "Qwen2MLP is the dense MLP of Qwen2 / Qwen3 models"),
            (_QWEN2, r"^        x, _ = self\.down_proj\(x, forward_batch=forward_batch\)\n        return x$",
             "Qwen2MLP.forward ends in down_proj(x, forward_batch=forward_batch) (the replacement calls it the "
             "same way)"),
            (_QWEN3, r"^from sglang\.srt\.models\.qwen2 import Qwen2MLP as Qwen3MLP$",
             "dense Qwen3's MLP is Qwen2MLP"),
            (_ACT, r"def forward_cuda\(self, x: torch\.Tensor\) -> torch\.Tensor:\s*d = x\.shape\[-1\] // 2\s*"
                   r"output_shape = x\.shape\[:-1\] \+ \(d,\)\s*"
                   r"out = torch\.empty\(output_shape, dtype=x\.dtype, device=x\.device\)\s*"
                   r"silu_and_mul\(x, out\)\s*return out",
             "SiluAndMul.forward_cuda: silu_and_mul of the two halves into a new [..., d] tensor of the input's "
             "dtype"),
        ),
        callable="sglang.srt.models.llama:LlamaMLP.forward",
    ),
    corpus=corpus(MLP_MODELS),
    replaces=("sglang.srt.models.llama:LlamaMLP.forward", "sglang.srt.models.qwen2:Qwen2MLP.forward"),
    kernel_symbols=(r"astra_gus::",),
)
