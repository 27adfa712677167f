"""The gated MLP activations: out[t, i] = act(x[t, i]) * x[t, d + i] for an input x of [tokens, 2d].

silu_and_mul, gelu_and_mul and gelu_tanh_and_mul differ only in `act`: in SGLang they are one JIT template
(activation.cuh ActivationKernel over ActivationKind, the sgl-kernel FlashInfer act_and_mul_kernel for
unaligned widths). Their ABI, inputs, reference, bytes moved, JIT variant and corpus rules are built here.
`act` is named as ModelConfig.act names it, so a corpus can only draw from models that run the op.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ..models import DECODE_TOKENS, PREFILL_TOKENS, model
from ..sites import mlp_activation_sites
from ..spec import DTYPE_BYTES, OpSpec, Shape, SourceFile, Tolerance, Variant, dedupe_shapes, torch_dtype
from . import abi

DIM_NAMES = ("num_tokens", "hidden")
DTYPES = ("fp16", "bf16", "fp32")
ABI = abi((("out", "out"), ("input", "in")), DIM_NAMES)
DISTRIBUTIONS = ("normal", "large", "uniform")
JIT_HEADER = "csrc/elementwise/activation.cuh"
FLASHINFER_HEADER = "flashinfer/activation.cuh"

# What every op's JIT launcher relies on in activation.cuh (the op adds its ActivationKind facts after these).
JIT_FACTS = (
    (JIT_HEADER, r"static constexpr auto kBlockSize = (?P<BLOCK_SIZE>\d+u?);",
     "ActivationKernel::kBlockSize (threads per block)"),
    (JIT_HEADER, r"__global__ void act_and_mul_kernel\(const __grid_constant__ ActivationParams params\)",
     "act_and_mul_kernel takes ActivationParams by value"),
    (JIT_HEADER, r"num_blocks = div_ceil\(static_cast<uint32_t>\(num_total_items\), kBlockSize\)",
     "grid = div_ceil(tokens * hidden / kVecSize, kBlockSize)"),
)
# The unaligned-hidden fallback, in either form FlashInfer has shipped: 0.7 templates act_and_mul_kernel on the
# vector width and bounds it (__launch_bounds__(256)); 0.6 (sgl-kernel of SGLang 0.5.17) always loads 16 bytes.
# ACT_VEC_PARAM is ", uint32_t vec_size" or "": the launcher takes the matching branch.
FALLBACK_FACT = (
    FLASHINFER_HEADER,
    r"template <typename T, float \(\*Activation\)\(const float&\)(?P<ACT_VEC_PARAM>(?:, uint32_t vec_size)?)>\s*"
    r"__global__ (?:__launch_bounds__\((?P<ACT_LAUNCH_BOUNDS>\d+)\) )?void act_and_mul_kernel\(",
    "act_and_mul_kernel<T, Activation[, vec_size]>, the unaligned-hidden fallback",
)


def act_fn(act: str) -> Callable[[Any], Any]:
    """The activation in torch (imported lazily: extract needs no torch)."""
    import functools

    import torch

    fns = {"silu": torch.nn.functional.silu,
           "gelu": functools.partial(torch.nn.functional.gelu, approximate="none"),
           "gelu_tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh")}
    return fns[act]


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, d = dims
    x = torch.randn((t, 2 * d), generator=gen, device=device, dtype=torch.float32)
    if dist == "large":
        x = x * 8.0  # the activation saturates: exp overflow / underflow, the cdf rounds to 0 or 1
    elif dist == "uniform":
        x = torch.rand((t, 2 * d), generator=gen, device=device, dtype=torch.float32) * 20 - 10
    return {
        "input": x.to(torch_dtype(dtype)),
        "out": torch.empty((t, d), device=device, dtype=torch_dtype(dtype)),
    }


def reference_for(act: str) -> Callable[..., Dict[str, Any]]:
    def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
        x = inp["input"].double()
        d = dims[1]
        g, u = x[:, :d], x[:, d:]
        return {"out": act_fn(act)(g) * u}

    reference.__doc__ = f"fp64: out = {act}(gate) * up"
    return reference


def bytes_moved(dims, dtype: str) -> int:
    t, d = dims
    return 3 * t * d * DTYPE_BYTES[dtype]  # read 2d, write d per token


def corpus(pairs: Sequence[Tuple[str, int]], act: str, prefill: Sequence[int] = PREFILL_TOKENS,
           prefill_tp: Optional[Sequence[int]] = None, paper: Sequence[Tuple[int, int]] = ()) -> Tuple[Shape, ...]:
    """Decode batches (and prefill chunks at the TP degrees in prefill_tp, all when None) over the MLP's
    per-rank intermediate width of each (model, tp); models that do not run `act` are refused."""
    shapes = [Shape(s, ("paper",), "astra-paper") for s in paper]
    for name, tp in pairs:
        m = model(name)
        assert m.act == act, (name, m.act, act)
        d = m.intermediate // tp
        src = f"{m.name} tp{tp}"
        shapes += [Shape((t, d), ("decode",), src) for t in DECODE_TOKENS]
        if prefill_tp is None or tp in prefill_tp:
            shapes += [Shape((t, d), ("prefill",), src) for t in prefill]
    return dedupe_shapes(shapes)


def edge_shapes(largest: Shape) -> Tuple[Shape, ...]:
    """Widths the 16-byte vector does not divide (SGLang routes them to the FlashInfer kernel), then `largest`."""
    return (
        Shape((1, 4096), ("edge",), "one token"),
        Shape((3, 1368), ("edge",), "hidden not a multiple of 8 (sgl-kernel FlashInfer path)"),
        Shape((5, 3420), ("edge",), "hidden % 8 == 4"),
        Shape((7, 1001), ("edge",), "odd hidden"),
        largest,
    )


def jit_variant(description: str, provenance: str, facts: Sequence[Tuple[str, str, str]] = ()) -> Variant:
    """SGLang's JIT ActivationKernel; `facts`: the op's own (its ActivationKind and formula)."""
    return Variant(
        name="jit",
        description=description,
        provenance=provenance,
        sources=(SourceFile("sglang_jit", JIT_HEADER), SourceFile("flashinfer", FLASHINFER_HEADER)),
        include_roots=("tvm_ffi", "dlpack"),
        launcher="launch_jit.cu.in",
        flag_profile="sglang_jit",
        # activation.py: activation_module(fast_math=True) -> get_activation_cuda_cflags()
        extra_flags=("--use_fast_math",),
        source_facts=JIT_FACTS + tuple(facts) + (FALLBACK_FACT,),
        dtypes=DTYPES,
    )


def spec(*, name: str, summary: str, act: str, variants: Sequence[Variant], corpus: Tuple[Shape, ...],
         edge_shapes: Tuple[Shape, ...], replaces: Tuple[str, ...], kernel_symbols: Tuple[str, ...] = (),
         fp32_floor: float = 1e-5) -> OpSpec:
    """fp32_floor: the least fp32 tolerance. An activation SGLang builds with --use_fast_math errs more than 1e-5 in
    fp32 on every path (its JIT kernel and sgl_kernel's FlashInfer one), and the floor alone judges the widths
    production's JIT kernel refuses."""
    return OpSpec(
        name=name,
        summary=summary,
        dim_names=DIM_NAMES,
        abi=ABI,
        variants=tuple(variants),
        default_variant=lambda roots: "jit",
        dtypes=DTYPES,
        corpus=corpus,
        edge_shapes=edge_shapes,
        tolerance=Tolerance(k=2.0, floor={"fp32": fp32_floor, "fp16": 2e-3, "bf16": 1.6e-2}),
        make_inputs=make_inputs,
        reference=reference_for(act),
        scalars=lambda dims: {},
        bytes_moved=bytes_moved,
        distributions=DISTRIBUTIONS,
        replaces=replaces,
        kernel_symbols=kernel_symbols,
        # in context between the dense MLP's gate_up and down_proj (sites.py)
        context_sites=lambda dims: mlp_activation_sites(dims[1], act),
    )
