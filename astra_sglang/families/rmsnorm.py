"""The RMSNorm family: y = x * rsqrt(mean(x^2) + eps) * (weight_bias + weight) over [tokens, hidden] rows.

Two switches make the four ops, as they make FlashInfer's norm.cuh kernels:
  fused        False: out = norm(input) (rmsnorm, gemma_rmsnorm);
               True: residual += input; input = norm(residual), both in place (fused_add_rmsnorm, gemma_*).
  weight_bias  0: the plain weight (RMSNorm); 1: Gemma checkpoints store weight - 1.
The ABI, inputs, reference, bytes moved, corpus rules, edge shapes and SGLang bindings are built here;
the op's spec keeps its provenance, source facts and which models its corpus draws from. qknorm (per-head,
over the strided qkv blocks) shares only `rms`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

from ..models import DECODE_TOKENS, ModelConfig, model
from ..spec import AbiArg, DTYPE_BYTES, OpSpec, Shape, SourceFile, Tolerance, Variant, dedupe_shapes, torch_dtype
from . import abi as _abi

DIM_NAMES = ("num_tokens", "hidden")
DISTRIBUTIONS = ("normal", "large", "uniform")
NORM_HEADER = "flashinfer/norm.cuh"
# Where SGLang binds each norm by name (patch rebinds every one): {module}:{op}
BOUND_IN = ("sgl_kernel", "sgl_kernel.elementwise", "sglang.srt.layers.layernorm", "flashinfer.norm")

# Edge shapes of FlashInfer's kernels: its vector is gcd(16 / sizeof(T), hidden) elements.
ONE_TOKEN = Shape((1, 4096), ("edge",), "one token")
VEC4 = Shape((3, 4100), ("edge",), "hidden % 8 == 4 (FlashInfer vec 4)")
VEC1 = Shape((5, 1001), ("edge",), "odd hidden (FlashInfer vec 1)")
SMEM_OPT_IN = Shape((2, 16384), ("edge",), "widest hidden: FlashInfer smem > 48 KB (opt-in)")
CLUSTER_SPLIT = Shape((3, 20000), ("edge",), "over 2048 vectors: a cluster splits the row")


def abi(fused: bool) -> Tuple[AbiArg, ...]:
    ptrs = (("input", "inout"), ("residual", "inout")) if fused else (("out", "out"), ("input", "in"))
    return _abi(ptrs + (("weight", "in"),), DIM_NAMES, (("eps", "f64"),))


def rms(x, eps: float):
    """rsqrt(mean(x^2) + eps) over the last dim (fp64 in the references)."""
    import torch

    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def make_inputs_for(fused: bool, weight_bias: float) -> Callable[..., Dict[str, Any]]:
    def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
        import torch

        t, h = dims
        dt = torch_dtype(dtype)
        x = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32)
        r = torch.randn((t, h), generator=gen, device=device, dtype=torch.float32) if fused else None
        # the weight as checkpoints store it: around 1, or with weight_bias 1 (Gemma: weight - 1) around 0,
        # some near -1 where 1 + w cancels
        w = 0.25 * torch.randn((h,), generator=gen, device=device, dtype=torch.float32)
        if not weight_bias:
            w = 1.0 + w
        if dist == "large":  # residual streams grow through the layers: large sums of squares, outliers
            x = x * 64.0
            if fused:
                r = r * 64.0
            idx = torch.randint(0, h, (t, max(1, h // 512)), generator=gen, device=device)
            (r if fused else x).scatter_(1, idx, 2000.0)
        elif dist == "uniform":
            x = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
            if fused:
                r = torch.rand((t, h), generator=gen, device=device, dtype=torch.float32) * 2 - 1
            if weight_bias:
                w = torch.rand((h,), generator=gen, device=device, dtype=torch.float32) * 2 - 1.5
        if fused:
            return {"input": x.to(dt), "residual": r.to(dt), "weight": w.to(dt)}
        return {"input": x.to(dt), "weight": w.to(dt), "out": torch.empty((t, h), device=device, dtype=dt)}

    return make_inputs


def reference_for(fused: bool, weight_bias: float, eps: float) -> Callable[..., Dict[str, Any]]:
    def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
        """fp64: s = input (+ residual); y = s * rsqrt(mean(s^2) + eps) * (weight_bias + weight)."""
        x = inp["input"].double()
        w = inp["weight"].double()
        s = x + inp["residual"].double() if fused else x
        # `if`: adding 0.0 would turn a -0.0 weight into +0.0
        y = s * rms(s, float(scalars.get("eps", eps))) * ((weight_bias + w) if weight_bias else w)
        return {"input": y, "residual": s} if fused else {"out": y}

    return reference


def bytes_moved_for(fused: bool) -> Callable[[Tuple[int, ...], str], int]:
    def bytes_moved(dims, dtype: str) -> int:
        t, h = dims
        # read input (and residual), weight; write out (or input and residual)
        return ((4 if fused else 2) * t * h + h) * DTYPE_BYTES[dtype]

    return bytes_moved


def hidden_widths(names: Sequence[str], norm: str) -> list:
    """(hidden, source) of each model; models that do not run this norm kind are refused. The norm runs on the
    full (replicated) hidden state: TP does not shard it."""
    out = []
    for name in names:
        m = model(name)
        assert m.norm == norm, (name, m.norm, norm)
        out.append((m.hidden, f"{m.name} hidden"))
    return out


def mla_widths(m: ModelConfig) -> list:
    return [(w, f"{m.name} MLA lora-rank norm") for w in m.extra_norm_widths]


def token_shapes(widths: Sequence[Tuple[int, str]], prefill: Sequence[int],
                 decode: Sequence[int] = DECODE_TOKENS) -> list:
    """Decode then prefill shapes of each (hidden, source), in order (the caller dedupes)."""
    shapes = []
    for h, src in widths:
        shapes += [Shape((t, h), ("decode",), src) for t in decode]
        shapes += [Shape((t, h), ("prefill",), src) for t in prefill]
    return shapes


# Gemma-2 runs two plain and two fused-add norms per layer, Gemma-3 the same on 2-D hidden states: both Gemma
# ops see the same widths.
GEMMA_MODELS = ("gemma-2-2b", "gemma-2-9b", "gemma-3-12b", "gemma-3-27b")


def gemma_corpus() -> Tuple[Shape, ...]:
    return dedupe_shapes(token_shapes(hidden_widths(GEMMA_MODELS, "gemma"), (4096,)))


def gemma_edge_shapes(widest: Shape) -> Tuple[Shape, ...]:
    """The Gemma ops' edges; `widest`: the row limit of the op's FlashInfer kernel (cluster split or smem)."""
    return (ONE_TOKEN, VEC4, VEC1, Shape((9, 1152), ("edge",), "gemma-3-1b hidden"), widest,
            Shape((16384, 5376), ("edge", "largest"), "gemma-3-27b prefill chunk"))


def flashinfer_variant(description: str, provenance: str, source_facts, dtypes=("fp16", "bf16"), **kw) -> Variant:
    """FlashInfer's CUDA norm kernel with the host code of csrc/norm.cu (sgl-kernel's) and its AOT flags."""
    return Variant(name="flashinfer", description=description, provenance=provenance,
                   sources=(SourceFile("flashinfer", NORM_HEADER),), launcher="launch_flashinfer.cu.in",
                   flag_profile="sgl_kernel_aot", source_facts=tuple(source_facts), dtypes=tuple(dtypes), **kw)


def spec(*, name: str, summary: str, fused: bool, weight_bias: float, eps: float, variants: Sequence[Variant],
         corpus: Tuple[Shape, ...], edge_shapes: Tuple[Shape, ...], dtypes=("fp16", "bf16"),
         kernel_symbols: Tuple[str, ...] = (), context_sites=None) -> OpSpec:
    return OpSpec(
        name=name,
        summary=summary,
        dim_names=DIM_NAMES,
        abi=abi(fused),
        variants=tuple(variants),
        default_variant=lambda roots: "flashinfer",
        dtypes=tuple(dtypes),
        corpus=corpus,
        edge_shapes=edge_shapes,
        tolerance=Tolerance(k=2.0),
        make_inputs=make_inputs_for(fused, weight_bias),
        reference=reference_for(fused, weight_bias, eps),
        scalars=lambda dims: {"eps": eps},
        bytes_moved=bytes_moved_for(fused),
        distributions=DISTRIBUTIONS,
        replaces=tuple(f"{mod}:{name}" for mod in BOUND_IN),
        kernel_symbols=kernel_symbols,
        context_sites=context_sites,
    )
