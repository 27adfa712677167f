"""add_rmsnorm_linear: a FUSED op. A dense decoder layer's fused add + RMSNorm and the decode GEMV that reads its
output, in one launch (input_layernorm -> qkv_proj; the same pair is post_attention_layernorm -> gate_up_proj):

    s = x + residual (fp32);  residual_out = T(s)
    normed = T( s * rsqrt(mean(s^2) + eps) * norm_weight )                FlashInfer's FusedAddRMSNorm, its order
    out[t, n] = T( sum_k normed[t, k] * weight[n, k] )                     linear's GEMV (fp32 sum) on normed

x, residual [tokens, H] (the decoder layer's hidden states and residual), norm_weight [H] (the RMSNorm's), weight
[N, H] (the projection's, per rank under tensor parallelism), out [tokens, N], residual_out and normed [tokens, H].
normed is rounded to T before the GEMV, as SGLang's norm stores it for the projection to read, so the op computes what
SGLang's two steps compute; only the norm's launch and the normed row's round trip go. Unlike SGLang's norm the op is
out of place: x and residual are only read (every CTA of the GEMV reads them; one CTA writes residual_out and normed).

What SGLang runs (0.5.17, CUDA, an unquantized bf16 / fp16 Llama / Qwen3): LlamaDecoderLayer.forward calls
input_layernorm(hidden_states, residual) (RMSNorm.forward_cuda -> sgl_kernel.fused_add_rmsnorm, in place), then
self_attn, whose forward_prepare_native calls qkv_proj(hidden_states) (QKVParallelLinear -> ColumnParallelLinear.forward
-> UnquantizedLinearMethod.apply -> F.linear: cuBLAS, or astra's linear where it is on and takes the shape). Production
is those two back to back; a speedup of this op is over their SUM (bench against production's norm + cuBLAS; the norm
+ astra linear is a second baseline, RESULTS.md says how).

Production is a FlashInfer kernel then cuBLAS behind torch, which extract cannot turn into one CUDA source: the only
variant is `installed`, LlamaDecoderLayer.forward through the adapter, whose `sequence` runs SGLang's fused_add_rmsnorm
and F.linear on the op's tensors (kernels/gate_up_silu/spec.py's pattern). Its source facts are 0.5.17's: 0.5.23
rewrote LlamaDecoderLayer.forward around attn_boundary / ffn_boundary (extract there fails on the facts, loudly).

Scope (kernel.cu): 1-2 tokens per launch (more tokens are more launches), H a multiple of 8 and at most 8192
(FlashInfer's threads then own one vector each), fp16 / bf16, no bias.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from astra_sglang.families import rmsnorm
from astra_sglang.families.qkv import NORM_ROPE_TOLERANCE
from astra_sglang.kernels.linear import spec as _linear_spec
from astra_sglang.spec import DTYPE_BYTES, AbiArg, OpSpec, Shape, Tolerance, Variant, dedupe_shapes, torch_dtype

EPS = 1e-5  # Llama-3's rms_norm_eps (Qwen3: 1e-6); the ABI takes it per call
MAX_HIDDEN = 8192  # kernel.cu's kMaxIters x 256 vectors of 8

# (model, hidden H, ((site, N at TP 1), ...), TP degrees): qkv = (heads + 2 kv_heads) x head_dim, gate_up = 2 x
# intermediate; TP > 1 rows are per rank (N / tp; H is not sharded in these column-parallel projections)
MODELS: Tuple[Tuple[str, int, Tuple[Tuple[str, int], ...], Tuple[int, ...]], ...] = (
    ("llama-3-8b", 4096, (("qkv", 6144), ("gate_up", 28672)), (1,)),
    ("qwen3-8b", 4096, (("qkv", 6144), ("gate_up", 24576)), (1,)),
    ("qwen3-4b", 2560, (("qkv", 6144), ("gate_up", 19456)), (1,)),
    ("qwen3-14b", 5120, (("qkv", 7168), ("gate_up", 34816)), (1,)),
    ("qwen3-32b", 5120, (("qkv", 10240), ("gate_up", 51200)), (1, 2)),
    ("llama-3-70b", 8192, (("qkv", 10240), ("gate_up", 57344)), (2, 4, 8)),
)
DECODE = (1, 2)


def _corpus() -> Tuple[Shape, ...]:
    out = []
    for model, h, sites, tps in MODELS:
        for tp in tps:
            for site, n in sites:
                for t in DECODE:
                    out.append(Shape((t, h, n // tp), ("decode",), f"{model} tp{tp} {site}"))
    return dedupe_shapes(out)


EDGE = (
    Shape((1, 8, 4), ("edge",), "one vector per row; one CTA"),
    Shape((2, 1000, 130), ("edge",), "125 vectors: FlashInfer's last warp partial; out_features not a multiple of 4"),
    Shape((1, 2056, 264), ("edge",), "257 vectors: a second sweep of one vector"),
    Shape((3, 4104, 96), ("edge",), "3 tokens: two launches (2 + 1); 513 vectors: a third sweep of one vector"),
    Shape((2, 8192, 8), ("edge",), "the widest row: 1024 vectors, four full sweeps"),
)


def scalars(dims) -> Dict[str, Any]:
    return {"eps": EPS}


_norm_inputs = rmsnorm.make_inputs_for(True, 0.0)  # input, residual, weight: the norm family's distributions


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    """x, residual and norm_weight as the fused norm's inputs (rmsnorm.DISTRIBUTIONS: normal, large with outliers,
    uniform); weight ~ N(0, 1/H) as linear's, so out ~ N(0, 1)."""
    import torch

    t, h, n = dims
    inp = _norm_inputs((t, h), dtype, gen, dist, device)
    td = torch_dtype(dtype)
    w = torch.randn((n, h), generator=gen, device=device, dtype=torch.float32) / h ** 0.5
    return {"x": inp["input"], "residual": inp["residual"], "norm_weight": inp["weight"], "weight": w.to(td),
            "out": torch.empty((t, n), device=device, dtype=td),
            "residual_out": torch.empty((t, h), device=device, dtype=td),
            "normed": torch.empty((t, h), device=device, dtype=td)}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any], model_dtype=None) -> Dict[str, Any]:
    """fp64 of the whole sequence with production's one intermediate rounding: the normed row rounded to the model
    dtype (the tensor SGLang's norm writes in place and the projection reads), the GEMV on it; residual_out and
    normed unrounded (the harness compares them in the dtype)."""
    import torch

    from astra_sglang.kernels.gate_up_silu.spec import infer_model_dtype

    x, r = inp["x"], inp["residual"]
    dt = model_dtype if model_dtype in (torch.float16, torch.bfloat16) else infer_model_dtype(x, r)
    s = x.double() + r.double()
    normed = s * rmsnorm.rms(s, float(scalars.get("eps", EPS))) * inp["norm_weight"].double()
    y = normed.to(dt).double() if dt is not None else normed
    return {"out": y @ inp["weight"].double().t(), "residual_out": s, "normed": normed}


def bytes_moved(dims, dtype: str) -> int:
    """The fused op's own traffic: x and residual read once, norm_weight and weight once, out, residual_out and normed
    written once (production also writes the normed row in place and reads it back: 2 t H more)."""
    t, h, n = dims
    return (2 * t * h + h + n * h + t * n + 2 * t * h) * DTYPE_BYTES[dtype]


_LLAMA = "srt/models/llama.py"
_LAYERNORM = "srt/layers/layernorm.py"
_LINEAR = "srt/layers/linear.py"
TARGET = "sglang.srt.models.llama:LlamaDecoderLayer.forward"

ABI = (
    AbiArg("x", "ptr", "in"),              # [num_tokens, in_features]: the layer's hidden states (read only)
    AbiArg("residual", "ptr", "in"),       # [num_tokens, in_features] (read only)
    AbiArg("norm_weight", "ptr", "in"),    # [in_features]: input_layernorm's weight
    AbiArg("weight", "ptr", "in"),         # [out_features, in_features]: qkv_proj's
    AbiArg("out", "ptr", "out"),           # [num_tokens, out_features]: the projection
    AbiArg("residual_out", "ptr", "out"),  # [num_tokens, in_features]: T(x + residual)
    AbiArg("normed", "ptr", "out"),        # [num_tokens, in_features]: the norm's output (what SGLang leaves in x)
    AbiArg("num_tokens", "i64"),
    AbiArg("in_features", "i64"),          # H: the hidden size
    AbiArg("out_features", "i64"),         # N: the (per-rank) projection width
    AbiArg("eps", "f64"),
    AbiArg("dtype", "i32"),
)

INSTALLED = Variant(
    name="installed",
    description="SGLang 0.5.17's LlamaDecoderLayer.forward up to qkv_proj: input_layernorm's RMSNorm.forward_cuda -> "
    "sgl_kernel.fused_add_rmsnorm (in place), then qkv_proj's UnquantizedLinearMethod.apply -> F.linear (cuBLAS)",
    provenance="sglang/srt/models/llama.py LlamaDecoderLayer.forward -> self.input_layernorm(hidden_states, residual) "
    "-> srt/layers/layernorm.py RMSNorm.forward_cuda -> fused_add_rmsnorm (sgl_kernel -> FlashInfer FusedAddRMSNorm); "
    "then self.self_attn(...) -> LlamaAttention.forward_prepare_native -> self.qkv_proj(hidden_states) -> "
    "QKVParallelLinear (ColumnParallelLinear.forward) -> UnquantizedLinearMethod.apply -> F.linear (cuBLAS)",
    sources=(),
    launcher="",
    flag_profile="sglang_jit",
    # the norm's math as sgl-kernel's sm_90 build compiles it (fast math: div.approx / rsqrt.approx, flush to zero),
    # so the normed row's bits are production's (kernels/fused_add_rmsnorm is built the same way)
    extra_flags=("--use_fast_math",),
    source_facts=(
        (_LLAMA, r"class LlamaDecoderLayer\(nn\.Module\):", "LlamaDecoderLayer is the decoder layer patch replaces"),
        (_LLAMA, r"    def forward\(\s*self,\s*positions: torch\.Tensor,\s*hidden_states: torch\.Tensor,\s*"
                 r"forward_batch: ForwardBatch,\s*residual: Optional\[torch\.Tensor\],\s*\)",
         "LlamaDecoderLayer.forward(self, positions, hidden_states, forward_batch, residual) (0.5.17's signature)"),
        (_LLAMA, r"            hidden_states, residual = self\.input_layernorm\(hidden_states, residual\)\n"
                 r"        hidden_states = self\.self_attn\(\n            positions=positions,\n"
                 r"            hidden_states=hidden_states,\n            forward_batch=forward_batch,\n        \)\n",
         "LlamaDecoderLayer.forward: input_layernorm(hidden_states, residual), then self_attn on its output"),
        (_LLAMA, r"        hidden_states, residual = self\.post_attention_layernorm\(hidden_states, residual\)\n"
                 r"        hidden_states = self\.mlp\(hidden_states\)\n        return hidden_states, residual\n",
         "LlamaDecoderLayer.forward ends in post_attention_layernorm, mlp, return (hidden, residual): the rest the "
         "replacement runs as the method does"),
        (_LLAMA, r"    def forward_prepare_native\(self, positions, hidden_states\):\n"
                 r"        qkv, _ = self\.qkv_proj\(hidden_states\)\n",
         "LlamaAttention.forward_prepare_native: qkv_proj on the attention's hidden_states first"),
        (_LAYERNORM, r"            fused_add_rmsnorm\(x, residual, self\.weight\.data, self\.variance_epsilon\)\n"
                     r"            return x, residual\n",
         "RMSNorm.forward_cuda with a residual: fused_add_rmsnorm(x, residual, weight, eps) in place"),
        (_LINEAR, r"output_parallel = self\.quant_method\.apply\(self, input_, bias\)",
         "ColumnParallelLinear.forward (qkv_proj) calls quant_method.apply(self, x, bias)"),
        _linear_spec.APPLY_ENDS_IN_F_LINEAR,
    ),
    dtypes=("fp16", "bf16"),
    requires_root="sglang_py",
    callable=TARGET,
)

# Production keeps the normed row in the dtype and the GEMV reads it: where the fp32 normed value sits at a rounding
# boundary, production's and the oracle's roundings differ by an ulp, as in the other ops that keep a rounded
# intermediate (gemma_post_attention_norms, the fused q/k norm + rope ops): their floors (families/qkv.py). The
# test checks that a float32 emulation of production passes them.
TOLERANCE: Tolerance = NORM_ROPE_TOLERANCE

SPEC = OpSpec(
    name="add_rmsnorm_linear",
    summary="FUSED fused_add_rmsnorm + the decode GEMV that reads it (input_layernorm -> qkv_proj) at 1-2 tokens, out "
    "of place; speedups are over the sum of SGLang's norm and cuBLAS GEMM",
    dim_names=("num_tokens", "in_features", "out_features"),
    abi=ABI,
    variants=(INSTALLED,),
    default_variant=lambda roots: "installed",
    dtypes=("fp16", "bf16"),
    corpus=_corpus(),
    edge_shapes=EDGE,
    tolerance=TOLERANCE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=scalars,
    bytes_moved=bytes_moved,
    distributions=rmsnorm.DISTRIBUTIONS,
    replaces=(TARGET,),
    # only astra's kernel: SGLang's two are fused_add_rmsnorm's (attributed to that op) and a cuBLAS GEMM. No `fuses`:
    # the profile cannot tell which of fused_add_rmsnorm's calls feed a projection this op takes
    kernel_symbols=(r"astra_arl::",),
)
