"""gemma_qknorm_rope: a FUSED op. Gemma-3's per-head q/k norm (x / rms(x) * (1 + w)), then its rotary embedding by
the step's cos/sin rows, in one launch: k in place on the qkv output, q read from it and written to its own q_out.

It replaces what SGLang runs on CUDA in Gemma3Attention.forward_native: q and k are per-head views of the qkv output
([1, heads, tokens, head_dim] in 0.5.17, [tokens, heads, head_dim] in 0.5.23); q_norm / k_norm (Gemma3RMSNorm; a 4-D input takes forward_native: torch ops,
about eight kernels each) return new tensors rounded to the model's dtype; apply_rotary_pos_emb (torch.compile'd:
q * cos + rotate_half(q) * sin in fp32, two Triton kernels) rotates them with the cos/sin rows Gemma3RotaryEmbedding
made for the step ([1, tokens, head_dim] in the model's dtype, the local or the global table by layer). About twenty
launches a layer, 17% of a Gemma-3-12B decode step at batch 1 (H200, results/2026-11-29-h200/session22/). Production
here is that sequence through the installed SGLang (the installed variant); a speedup is over all of it.

Per token t, every q head h:  q_out[t,h,:] = rope(round(q[t,h,:] * rsqrt(mean(q[t,h,:]^2) + eps) * (1 + q_weight)))
every kv head likewise in place in k with k_weight; rope(x) = x * cos[t] + rotate_half(x) * sin[t], rotate_half(x) =
(-x2, x1) (NeoX halves: the only form apply_rotary_pos_emb has). q/k are column blocks of the qkv output (token
strides q_stride / k_stride, heads head_dim apart); cos/sin [tokens, head_dim] rows. q_out (token stride
q_out_stride) is the q the attention gets: its own contiguous [tokens, q heads * head_dim] buffer here and in the
patch, since a column view of qkv costs SGLang 0.5.17's fa3 backend a q.contiguous() copy a layer from batch 2 on
(RESULTS.md). The kernel also takes q_out = q, q_out_stride = q_stride (in place: the adapter's ASTRA_GQKR_Q_OUT=0).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.families import abi, qkv
from astra_sglang.sites import attention_input_sites
from astra_sglang.spec import DTYPE_BYTES, OpSpec, Shape, Variant

EPS = 1e-6  # Gemma-3 rms_norm_eps (config.json)
HEAD_DIMS = (64, 128, 256)  # head_dim instantiations of the kernel (Gemma-3: 256, 27B 128)
MAX_POSITION = 8192  # positions the harness draws cos/sin rows for (a module global: CPU tests shrink it)
ROPE_BASE = 10000.0  # Gemma-3's sliding-window layers' rope_theta (5 of every 6 layers)

# Gemma-3 text models (the model table's) and the TP degrees where their heads divide.
MODELS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("gemma-3-1b", (1,)),
    ("gemma-3-4b", (1,)),
    ("gemma-3-12b", (1, 2)),
    ("gemma-3-27b", (1, 2, 4)),
)
# q_out_stride last: the ABI adds it after k_stride (q_out's token stride; hq * head_dim for a contiguous q_out)
DIM_NAMES = ("num_tokens", "num_q_heads", "num_kv_heads", "head_dim", "q_stride", "k_stride", "q_out_stride")


def dims_of(t: int, hq: int, hk: int, d: int) -> Tuple[int, ...]:
    """The op's dims for tokens t, q heads, kv heads, head_dim: q and k column blocks of the qkv output (qkv.qk_dims),
    q_out its own contiguous [t, hq * d] buffer, as the adapter allocates it."""
    return qkv.with_q_out(qkv.qk_dims(t, hq, hk, d))


model_dims = qkv.model_dims_of(dims_of)  # the profile's speedup lookup: dims from a model's config.json

# q_out contiguous in every shape (q_out_stride = q heads * head_dim): the harness poisons all of q_out and checks
# every element was written, so a wider q_out row would leave poison; the in-place q_out = q is the patch's alone
EDGE = (
    Shape((1, 1, 1, 256, 768, 768, 256), ("edge",), "one q head, one kv head"),
    Shape((3, 5, 1, 64, 448, 448, 320), ("edge",), "head_dim 64, odd head count"),
    Shape((7, 4, 2, 128, 1024, 1024, 512), ("edge",), "head_dim 128 (Gemma-3-27B)"),
    Shape((9, 8, 2, 256, 2048, 512, 2048), ("edge",), "q and k contiguous (strides = their heads)"),
    Shape((33, 4, 1, 256, 1536, 1536, 1024), ("edge",), "tokens not a multiple of the warps per block"),
    # head_dim 256: torch's mean gives a norm call of 16 rows or more 32 threads a row, fewer 64 (another order of adds)
    Shape((4, 4, 1, 256, 1536, 1536, 1024), ("edge",), "16 q rows and 4 k rows: either side of torch's reduce switch"),
    Shape((15, 4, 1, 256, 1536, 1536, 1024), ("edge",), "60 q rows and 15 k rows: k one row below the switch"),
)


def cos_sin_rows(positions, d: int, dt, base: float = ROPE_BASE):
    """Gemma3RotaryEmbedding's cos and sin for `positions`: emb = (freqs, freqs), freqs = position * inv_freq,
    computed in fp64 here and rounded to the model's dtype as its cos.to(x.dtype) rounds them ([tokens, d] each)."""
    import torch

    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float64) / d))
    freqs = positions.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dt), emb.sin().to(dt)


def make_inputs(dims, dtype: str, gen, dist: str = "normal", device: str = "cuda") -> Dict[str, Any]:
    import torch

    t, d = dims[0], dims[3]
    q, k, dt = qkv.qk_rows(dims, dtype, gen, dist, device)
    q_out = torch.empty((t, dims[6]), device=device, dtype=dt)  # an output: the harness poisons it
    # Gemma's weights are offsets from 1 (the norm multiplies by 1 + w): drawn around 0
    qw, kw = ((0.25 * torch.randn((d,), generator=gen, device=device)).to(dt) for _ in range(2))
    pos = qkv.positions(t, MAX_POSITION - 1, gen, device) + 1  # not 0: its sin row is all zeros
    if t > 1:
        pos[-1] = MAX_POSITION - 1  # the farthest position drawn (the largest angles)
    cos, sin = cos_sin_rows(pos, d, dt)
    return {"q": q, "q_out": q_out, "k": k, "q_weight": qw, "k_weight": kw, "cos": cos, "sin": sin}


def _norm_rotate(x, heads: int, d: int, w, cos, sin, eps: float):
    """fp64: the first heads * d columns of every row of x ([tokens, >= heads * d]) normed per head with (1 + w),
    then x * cos + rotate_half(x) * sin with the token's rows; the other columns as they are."""
    import torch

    t = x.shape[0]
    normed = qkv.norm_heads(x, heads, d, 1.0 + w, eps)
    out = normed.clone()
    h = normed[:, : heads * d].reshape(t, heads, d)
    rot = torch.cat([-h[..., d // 2:], h[..., : d // 2]], dim=-1)
    out[:, : heads * d] = (h * cos[:, None, :] + rot * sin[:, None, :]).reshape(t, heads * d)
    return out


def reference(inp: Mapping[str, Any], dims, scalars: Mapping[str, Any]) -> Dict[str, Any]:
    """fp64 of the whole chain, no intermediate rounding: the norm with (1 + w), then the rotation. q_out: q's heads
    so, in q_out's shape; k: k with its heads so and its other columns as they were.
    Works on the harness's [tokens, stride] row buffers and on the patch's [tokens, heads, head_dim] views."""
    _, hq, hk, d = dims[:4]
    eps = float(scalars.get("eps", EPS))
    q, k = inp["q"].double(), inp["k"].double()
    cos, sin = inp["cos"].double(), inp["sin"].double()
    n = q.shape[0]
    qo = _norm_rotate(q.reshape(n, -1), hq, d, inp["q_weight"].double(), cos, sin, eps)
    ko = _norm_rotate(k.reshape(n, -1), hk, d, inp["k_weight"].double(), cos, sin, eps)
    # q_out's shape; a caller that hands inputs only (harness/oracle.py reference_walk) gets q's heads' shape
    shape = inp["q_out"].shape if "q_out" in inp else (q.shape if q.dim() == 3 else (n, hq * d))
    return {"q_out": qo[:, : hq * d].reshape(shape), "k": ko.reshape(k.shape)}


def bytes_moved(dims, dtype: str) -> int:
    """What the fused kernel must move: q read and q_out written, k read + written; per token its cos and sin rows;
    the two weight vectors once."""
    t, hq, hk, d = dims[:4]
    e = DTYPE_BYTES[dtype]
    return t * (2 * (hq + hk) * d * e + 2 * d * e) + 2 * d * e


def _supports(dims, dtype: str) -> Optional[str]:
    t, hq, hk, d, qs, ks, qos = dims
    if d not in HEAD_DIMS:
        return f"head_dim {d} (the kernel instantiates {HEAD_DIMS})"
    if qs < hq * d or ks < hk * d or qos < hq * d:
        return "a row stride shorter than its heads"
    return None


def _scalars(dims) -> Dict[str, Any]:
    return {"eps": EPS}


_GEMMA3 = "srt/models/gemma3_causal.py"
_NORM = "srt/layers/layernorm.py"
_ROPE = "srt/layers/rotary_embedding/utils.py"

# What the adapter and the installed sequence rely on in SGLang's Python (0.5.17): checked when the workspace is
# made, so a change there fails loudly instead of patching the wrong method.
SOURCE_FACTS = (
    (_GEMMA3, r"class Gemma3Attention\(nn\.Module\):", "Gemma3Attention is Gemma-3's attention (the method patch "
     "replaces)"),
    (_GEMMA3, r"def forward_native\(\s*self,\s*positions: torch\.Tensor,\s*hidden_states: torch\.Tensor,\s*"
              r"position_embeddings: Tuple\[torch\.Tensor, torch\.Tensor\],\s*forward_batch: ForwardBatch,\s*"
              r"\*\*kwargs,\s*\) -> torch\.Tensor:\s*qkv, _ = self\.qkv_proj\(hidden_states\)",
     "forward_native(self, positions, hidden_states, position_embeddings, forward_batch, **kwargs) starts with "
     "the qkv GEMM"),
    (_GEMMA3, r"q = q\.unflatten\(-1, \(self\.num_heads, self\.head_dim\)\)\s*(?:#[^\n]*\s*)?"
              r"(?:q = q\.transpose\(0, 1\)\.unsqueeze\(0\)\s*)?q = self\.q_norm\(q\)",
     "forward_native norms q per head with q_norm ([1, heads, tokens, head_dim] in 0.5.17, token-major in 0.5.23)"),
    (_GEMMA3, r"cos, sin = position_embeddings\s*(?:#[^\n]*\s*)*(?:cos = cos\.reshape\(-1, cos\.shape\[-1\]\)\s*"
              r"sin = sin\.reshape\(-1, sin\.shape\[-1\]\)\s*)?q, k = apply_rotary_pos_emb\(q, k, cos, sin\)",
     "forward_native rotates q and k with apply_rotary_pos_emb and the layer's cos/sin rows"),
    (_GEMMA3, r"attn_output = self\.attn\(q, k, v, forward_batch=forward_batch\)",
     "forward_native then calls the attention on q, k, v (the replacement calls it the same way)"),
    (_GEMMA3, r"def forward\(\s*self,[^)]*\) -> torch\.Tensor:\s*if _is_cpu and _is_cpu_amx_available:\s*"
              r"return self\.forward_cpu\([^)]*\)\s*return self\.forward_native\(",
     "Gemma3Attention.forward runs forward_native on CUDA"),
    (_NORM, r"class Gemma3RMSNorm\((?:MultiPlatformOp|BaseFusedOp)\):", "q_norm / k_norm are Gemma3RMSNorm"),
    (_NORM, r"return x \* torch\.rsqrt\(x\.pow\(2\)\.mean\(-1, keepdim=True\) \+ self\.eps\)",
     "Gemma3RMSNorm._norm: x * rsqrt(mean(x^2) + eps) in fp32"),
    (_NORM, r"output = output \* \(1\.0 \+ self\.weight\.float\(\)\)\s*output = output\.type_as\(x\)",
     "Gemma3RMSNorm.forward_native multiplies by 1 + w in fp32 and rounds to the input's dtype"),
    (_NORM, r"if x\.dim\(\) == 2:\s*return gemma_rmsnorm\(x, self\.weight\.data, self\.eps\)\s*"
            r"return self\.forward_native\(x\)",
     "Gemma3RMSNorm.forward_cuda sends a 4-D input (q, k) to forward_native"),
    (_ROPE, r"q_embed = \(q \* cos\) \+ \(rotate_half\(q\) \* sin\)",
     "apply_rotary_pos_emb: q * cos + rotate_half(q) * sin (fp32)"),
    (_ROPE, r"return torch\.cat\(\(-x2, x1\), dim=-1\)", "rotate_half: NeoX halves"),
)

INSTALLED = Variant(
    name="installed",
    description="SGLang's Gemma-3 q/k path on CUDA: Gemma3RMSNorm.forward_native on the [1, heads, tokens, "
    "head_dim] q and k views (torch ops), then apply_rotary_pos_emb (torch.compile'd) with the step's cos/sin rows",
    provenance="sglang/srt/models/gemma3_causal.py Gemma3Attention.forward -> forward_native -> self.q_norm(q), "
    "self.k_norm(k) (srt/layers/layernorm.py Gemma3RMSNorm.forward_cuda -> forward_native for a 4-D input) -> "
    "apply_rotary_pos_emb (srt/layers/rotary_embedding/utils.py apply_rotary_pos_emb_native, torch.compile)",
    sources=(),
    launcher="",
    flag_profile="sglang_jit",
    source_facts=SOURCE_FACTS,
    dtypes=qkv.DTYPES,
    requires_root="sglang_py",
    supports=_supports,
    callable="sglang.srt.models.gemma3_causal:Gemma3Attention.forward_native",
)

SPEC = OpSpec(
    name="gemma_qknorm_rope",
    summary="FUSED Gemma-3 q/k norm (1 + w) + rope by the step's cos/sin rows, k in place, q into its own contiguous "
    "q_out (replaces SGLang's torch q_norm, k_norm and apply_rotary_pos_emb in Gemma3Attention.forward_native, about "
    "twenty launches a layer; speedups are over all of them)",
    dim_names=DIM_NAMES,
    # q an input (check fails a kernel that changes it), q_out an output (poisoned, compared), k in place
    abi=abi((("q", "in"), ("q_out", "out"), ("k", "inout"), ("q_weight", "in"), ("k_weight", "in"), ("cos", "in"),
             ("sin", "in")), DIM_NAMES, (("eps", "f64"),)),
    variants=(INSTALLED,),
    default_variant=lambda roots: "installed",
    dtypes=qkv.DTYPES,
    corpus=qkv.corpus(MODELS, dims_of),
    edge_shapes=EDGE,
    tolerance=qkv.NORM_ROPE_TOLERANCE,  # production rounds the normed q/k before rotating (families/qkv.py)
    make_inputs=make_inputs,
    reference=reference,
    scalars=_scalars,
    bytes_moved=bytes_moved,
    distributions=("normal", "large"),
    replaces=("sglang.srt.models.gemma3_causal:Gemma3Attention.forward_native",),
    # only ours: SGLang's are torch's elementwise kernels and Triton's, which the profile cannot tell apart from
    # other torch ops by name
    kernel_symbols=(r"astra_gqkr::",),
    # decode rows: qkv -> q/k norm + rope -> SGLang's KV store (PDL) -> attention, as a patched Gemma-3 layer runs
    context_sites=lambda dims: attention_input_sites(MODELS, dims[1:4], "q/k norm + rope", "KV store"),
)
