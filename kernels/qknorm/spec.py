"""qknorm: Qwen3's per-head RMSNorm of q and k, in place.

q[t, h, :] = q[t, h, :] * rsqrt(mean(q[t, h, :]^2) + eps) * q_weight   (h < num_q_heads)
k[t, h, :] likewise with k_weight. q and k are the q/k column blocks of the QKV projection's output,
so a token row of q is `q_stride` elements apart (the whole qkv row), not num_q_heads * head_dim.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import qkv
from astra_sglang.sites import attention_input_sites
from astra_sglang.spec import DTYPE_BYTES, Shape

EPS = 1e-6  # Qwen3 rms_norm_eps (config.json)
HEAD_DIMS = (64, 128, 256, 512, 1024)  # sglang models/utils.py can_use_fused_inplace_qknorm

# Models that run the q/k norm, and the TP degrees they are served with.
QK_NORM_MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("qwen3-8b", (1, 2)),
    ("qwen3-32b", (2, 4, 8)),
    ("qwen3-30b-a3b", (1, 2, 4)),
    ("qwen3-235b-a22b", (4, 8)),
)


model_dims = qkv.model_dims_of(qkv.qk_dims)  # the profile's speedup lookup: dims from a model's config.json


EDGE = (
    Shape((1, 1, 1, 128, 384, 384), ("edge",), "one q head, one kv head"),
    Shape((3, 5, 1, 64, 448, 448), ("edge",), "head_dim 64, odd head count"),
    Shape((7, 4, 2, 256, 2048, 2048), ("edge",), "head_dim 256"),
    Shape((5, 8, 2, 512, 6144, 6144), ("edge",), "head_dim 512 (SGLang's CTA kernel)"),
    Shape((9, 16, 4, 128, 2048, 512), ("edge",), "contiguous q and k (separate tensors)"),
)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    from astra_sglang.spec import torch_dtype

    t, hq, hk, d, qs, ks = dims
    dt = torch_dtype(dtype)

    def draw(shape, scale=1.0):
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
        if dist == "large":
            x = x * 64.0  # sum of squares far above 1: the rsqrt of large numbers
        elif dist == "small":
            x = x * 1e-2  # sum of squares near eps
        return x.to(dt)

    # the whole row travels (the columns outside q / k are other heads' data the kernel must not touch)
    q = draw((t, qs))
    k = draw((t, ks))
    qw, kw = qkv.norm_weights(d, dt, gen, device)
    return {"q": q, "k": k, "q_weight": qw, "k_weight": kw}


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    # works on the harness's [tokens, stride] buffers and on the patch's [tokens, heads, d] views
    _, hq, hk, d = dims[:4]
    eps = float(scalars.get("eps", EPS))
    q, k = inp["q"].double(), inp["k"].double()
    qo = qkv.norm_heads(q.reshape(q.shape[0], -1), hq, d, inp["q_weight"].double(), eps).reshape(q.shape)
    ko = qkv.norm_heads(k.reshape(k.shape[0], -1), hk, d, inp["k_weight"].double(), eps).reshape(k.shape)
    return {"q": qo, "k": ko}


def bytes_moved(dims, dtype: str) -> int:
    t, hq, hk, d = dims[:4]
    return (2 * t * (hq + hk) * d + 2 * d) * DTYPE_BYTES[dtype]  # each row read + written, weights once


def _supports(dims, dtype: str) -> Optional[str]:
    t, hq, hk, d, qs, ks = dims
    if d not in HEAD_DIMS:
        return f"head_dim {d} (SGLang's JIT q/k norm takes {HEAD_DIMS}; other sizes run the RMSNorm layers)"
    if qs < hq * d or ks < hk * d:
        return "row stride shorter than the heads it holds"
    return None


_QKN = "csrc/elementwise/qknorm.cuh"
DIM_NAMES = ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride")

SPEC = qkv.spec(
    name="qknorm",
    summary="Qwen3 per-head q/k RMSNorm, in place over the strided q and k blocks of the qkv output",
    dim_names=DIM_NAMES,
    pointers=(("q", "inout"), ("k", "inout"), ("q_weight", "in"), ("k_weight", "in")),
    scalar_args=(("eps", "f64"),),
    variant=qkv.jit_variant(
        _QKN,
        description="SGLang JIT QKNormKernel (fused_qknorm_warp; 0.5.23+: fused_qknorm_half_warp for "
        "head_dim 128 on 16-byte-aligned tensors; fused_qknorm_cta for head_dim > 256)",
        provenance="sglang/kernels/ops/layernorm/norm.py fused_inplace_qknorm -> _jit_qknorm_module(head_dim, "
        "dtype).qknorm -> csrc/elementwise/qknorm.cuh QKNormKernel<head_dim, pdl, T>::run "
        "(called from sglang/srt/models/utils.py apply_qk_norm)",
        source_facts=(
            (
                _QKN,
                r"struct QKNormParams \{\s*void\* __restrict__ q;\s*void\* __restrict__ k;[^\n]*\s*"
                r"int64_t q_stride;\s*int64_t k_stride;\s*uint32_t num_qo_heads;\s*uint32_t num_kv_heads;\s*"
                r"float eps;\s*const void\* __restrict__ q_weight;\s*const void\* __restrict__ k_weight;\s*"
                r"uint32_t num_tokens;\s*\};",
                "QKNormParams fields, in the order the launcher initializes them (k pre-offset, strides in elements)",
            ),
            (
                _QKN,
                r"\.k = pointer::offset\(k\.data_ptr\(\), -2 \* static_cast<int64_t>\(num_qo_heads\) \* kHeadDim\)",
                "k is passed pre-offset by -num_qo_heads * head_dim elements",
            ),
            (
                _QKN,
                r"constexpr uint32_t kWarpsPerBlock = (?P<WARPS_PER_BLOCK>\d+);",
                "warps per block of the warp kernels",
            ),
            (
                _QKN,
                r"std::min\(kNumSM \* max_occupancy, needed_blocks\)",
                "persistent grid: min(SMs * occupancy, div_ceil(rows, warps per block))",
            ),
            (
                _QKN,
                # the first of the two names: the half-warp kernel (0.5.23+) is defined before the
                # warp kernel's host struct, older sources only have the struct
                r"(?P<QK_FIRST>fused_qknorm_half_warp|QKNormKernelWarp)\b",
                "which warp kernels the source has (half-warp head_dim-128 kernel or not)",
            ),
        ),
        supports=_supports,
    ),
    corpus=qkv.corpus(QK_NORM_MODELS, qkv.qk_dims),
    edge_shapes=EDGE,
    make_inputs=make_inputs,
    reference=reference,
    scalars=lambda dims: {"eps": EPS},
    bytes_moved=bytes_moved,
    distributions=("normal", "large", "small"),
    replaces=(
        "sglang.kernels.ops.layernorm.norm:fused_inplace_qknorm",
        "sglang.srt.models.utils:fused_inplace_qknorm",
    ),
    # the kernels a profiler shows: SGLang's JIT kernel, ours (namespace in kernel.cu)
    kernel_symbols=(r"fused_qknorm_(?:half_)?warp|fused_qknorm_cta", r"astra_qkn::"),
    # decode rows: qkv -> q/k norm -> SGLang's rope (PDL) -> attention, as an unpatched Qwen3 layer runs them
    context_sites=lambda dims: attention_input_sites(QK_NORM_MODELS, dims[1:4], "q/k norm", "rope"),
)
