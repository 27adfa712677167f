"""The patch adapter of a fused op that replaces a layer method (patch/adapters.py holds the machinery and says what
each field means): SGLang 0.5.17's LlamaDecoderLayer.forward(self, positions, hidden_states, forward_batch, residual),
whose body is

    input_layernorm(hidden_states, residual); self_attn (qkv_proj first); post_attention_layernorm; mlp

On a CUDA server the first is SGLang's fused_add_rmsnorm kernel in place, and the attention's first step is qkv_proj's
GEMM on its output. Replaced, a call `expand` takes runs this op's kernel in place of the norm and the qkv GEMM, then
`returns` runs the method's own attention, post_attention_layernorm and mlp as the method calls them. The hand-off
into the attention: self_attn gets the normed row the kernel wrote (a real tensor with the norm's values), and for
that one call qkv_proj's forward returns the kernel's projection when its input is that very tensor (an instance
attribute, removed right after; any other input runs qkv_proj as before). So if the attention does not call qkv_proj
on it (a future body), its own GEMM runs on correct values: a lost fusion, never a wrong result.

`expand` declines (the method runs unchanged) before any work unless:
- hidden_states is a 2-D fp16 / bf16 CUDA tensor of 1..MAX_TOKENS rows, and residual a tensor of its shape, dtype and
  device (None, the first layer, runs RMSNorm without a residual: not this op);
- the layer is SGLang's LlamaDecoderLayer (or a subclass), its input_layernorm SGLang's RMSNorm dispatching to
  forward_cuda, without HF-parity casting, a variance size override or batch-invariant mode (the paths that run
  fused_add_rmsnorm), without module hooks or a compiled call (the norm's call is skipped), its weight a contiguous
  [H] tensor of x's dtype;
- self_attn.qkv_proj is a plain QKVParallelLinear without bias whose apply ends in F.linear (linear's
  `apply_path_problem`), its weight [N, H] of x's dtype, and the shape rule holds (`declined`).
Qwen3 (Qwen3DecoderLayer: the norm inside LayerCommunicator.prepare_attn) and the post_attention_layernorm -> gate_up
site (where gate_up_silu already runs) are not taken: RESULTS.md says why and how they would be.

Tensor parallel is taken: qkv_proj at TP > 1 is the same local F.linear on the rank's rows (no gather), and the
norm runs on the full hidden row on every rank."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from astra_sglang.kernels.linear.adapter import apply_path_problem, token_precheck
from astra_sglang.kernels.linear.adapter import declined as _linear_declined
from astra_sglang.patch.adapters import (OpAdapter, contiguity_problem, cuda_dispatch_problem, loaded_class,
                                         module_call_hooked)

# Off in `--ops all`: correct (check PASS, validate 60/60) but slower than the norm + astra's linear in the decode step
# (H200, 2026-11-28, RESULTS.md): every CTA runs the norm's prologue, 16.5 us a call where linear's qkv GEMV took 11.9
# and the norm 1.4.
DEFAULT_OFF = "slower than the norm + astra linear: Llama-3-8B decode step +2.7% / +5.6% at batch 1 / 2 (H200)"

MAX_TOKENS = 2  # the FMA GEMV's range (kernels/linear: 1-2 tokens)
MAX_HIDDEN = 8192  # kernel.cu: FlashInfer's threads own one vector each up to 1024 vectors
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)
LAYERS = (("sglang.srt.models.llama", "LlamaDecoderLayer"),)
LAYERNORM = "sglang.srt.layers.layernorm"
LINEAR = "sglang.srt.layers.linear"


def declined(tokens: int, in_features: int, out_features: int) -> Optional[str]:
    """Why the norm and a [tokens, in_features] x [out_features, in_features] projection stay with SGLang by design, or
    None: the one rule expand and validate (n/a) share."""
    if tokens > MAX_TOKENS:
        return f"{tokens} tokens > {MAX_TOKENS}: SGLang's norm and GEMM"
    if in_features % 8:
        return f"hidden {in_features} is not a multiple of 8"
    if in_features > MAX_HIDDEN:
        return f"hidden {in_features} > {MAX_HIDDEN}: the kernel's register row (FlashInfer's one-vector threads)"
    return _linear_declined(tokens, in_features, out_features)


def _norm_problem(norm, x) -> Optional[str]:
    """None where norm(x, residual) runs RMSNorm.forward_cuda's fused_add_rmsnorm(x, residual, weight, eps), else why
    not."""
    import torch

    rms = loaded_class(LAYERNORM, "RMSNorm")
    if rms is None or type(norm) is not rms:
        return f"input_layernorm is {type(norm).__name__}, not SGLang's RMSNorm"
    why = cuda_dispatch_problem(norm, "input_layernorm")
    if why:
        return why
    if module_call_hooked(norm):
        return "input_layernorm has module hooks or a compiled call (the replaced forward skips its call)"
    if getattr(norm, "cast_x_before_out_mul", False):
        return "input_layernorm casts before the weight multiply (HF parity: SGLang's JIT kernel)"
    if getattr(norm, "variance_size_override", None) is not None:
        return "input_layernorm has a variance size override (its native path)"
    invariant = getattr(sys.modules.get(LAYERNORM), "is_batch_invariant_mode_enabled", None)
    if invariant is not None and invariant():
        return "batch-invariant mode (its native path)"
    w = getattr(getattr(norm, "weight", None), "data", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or w.shape[0] != x.shape[1]:
        return f"input_layernorm's weight is not a [{x.shape[1]}] tensor"
    if w.dtype != x.dtype or w.device != x.device or not w.is_contiguous():
        return f"input_layernorm's weight is {w.dtype} on {w.device}: not x's dtype and device, contiguous"
    return None


def _qkv_problem(qkv, x) -> Optional[str]:
    """None where qkv_proj(x) is ColumnParallelLinear.forward's local F.linear, unquantized and bias-free, else why
    not."""
    import torch

    cls = loaded_class(LINEAR, "QKVParallelLinear")
    if cls is None or type(qkv) is not cls:
        return f"qkv_proj is {type(qkv).__name__}, not a plain QKVParallelLinear (LoRA or another layer)"
    if getattr(qkv, "bias", None) is not None:
        return "qkv_proj has a bias"
    if getattr(qkv, "gather_output", False):
        return "qkv_proj gathers its output across ranks"
    if not hasattr(qkv, "quant_method"):
        return "qkv_proj has no quant_method (a wrapped layer)"
    if "forward" in vars(qkv):
        return "qkv_proj's forward is already an instance attribute (another hand-off)"
    w = getattr(qkv, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] != x.shape[1]:
        return f"qkv_proj's weight is not [N, {x.shape[1]}]"
    if w.dtype != x.dtype or w.device != x.device:
        return f"qkv_proj's weight is {w.dtype} on {w.device}, x {x.dtype} on {x.device}"
    why = apply_path_problem(qkv, x)
    return f"qkv_proj: {why}" if why else None


def expand(a: Dict[str, Any]):
    """LlamaDecoderLayer.forward(self, positions, hidden_states, forward_batch, residual) -> canonical arguments (plus
    what `returns` needs), or why SGLang keeps it. Every reason to decline comes before any work."""
    import torch

    layer, x, res = a["self"], a["hidden_states"], a.get("residual")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.device.type not in DEVICES:
        return "hidden_states is not a 2-D CUDA tensor"
    t = x.shape[0]
    if t > MAX_TOKENS:  # first: every prefill call passes here
        return f"{t} tokens > {MAX_TOKENS}: SGLang's norm and GEMM"
    if t == 0:
        return "no tokens"
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"hidden_states is {x.dtype}, not fp16 / bf16"
    # 0.5.23's forward(positions, hidden_states, forward_batch, "capture_output") has no residual: its input norm runs
    # in attn_boundary.prepare, so no call of that signature is this op's, whatever it captures
    if "residual" not in a:
        return f"{type(layer).__name__}.forward takes no residual (SGLang 0.5.23 norms in its layer boundary)"
    if res is None:
        return "no residual (the first layer: RMSNorm without the add)"
    if not isinstance(res, torch.Tensor) or res.shape != x.shape or res.dtype != x.dtype or res.device != x.device:
        return "residual is not a tensor of hidden_states' shape, dtype and device"
    if not any(isinstance(layer, c) for c in (loaded_class(m, n) for m, n in LAYERS) if c is not None):
        return f"{type(layer).__name__} is not SGLang's LlamaDecoderLayer"
    norm, attn = getattr(layer, "input_layernorm", None), getattr(layer, "self_attn", None)
    qkv = getattr(attn, "qkv_proj", None)
    why = _norm_problem(norm, x) or _qkv_problem(qkv, x)
    if why:
        return why
    w = qkv.weight
    why = declined(t, x.shape[1], w.shape[0])
    if why:
        return why
    return {"x": x, "residual": res, "norm_weight": norm.weight.data, "weight": w,
            "out": torch.empty((t, w.shape[0]), device=x.device, dtype=x.dtype),
            "residual_out": torch.empty_like(res), "normed": torch.empty_like(x),
            "eps": float(norm.variance_epsilon),
            "layer": layer, "positions": a["positions"], "forward_batch": a["forward_batch"]}


def _normalize(c):
    """x, residual [T, H], norm_weight [H], weight [N, H], out [T, N], residual_out, normed [T, H] -> the ABI's tensors
    and (T, H, N)."""
    x, w = c["x"], c["weight"]
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] != x.shape[1]:
        return f"weight {tuple(w.shape)} is not [N, H] for x {tuple(x.shape)}"
    t, h, n = x.shape[0], x.shape[1], w.shape[0]
    for name, shape in (("residual", (t, h)), ("norm_weight", (h,)), ("out", (t, n)), ("residual_out", (t, h)),
                        ("normed", (t, h))):
        if tuple(c[name].shape) != shape:
            return f"{name} {tuple(c[name].shape)} != {shape}"
    names = ("x", "residual", "norm_weight", "weight", "out", "residual_out", "normed")
    bad = contiguity_problem(c, names)
    if bad:
        return bad
    return {n_: c[n_] for n_ in names}, (t, h, n)


def sequence(c: Dict[str, Any]) -> None:
    """SGLang's two steps on canonical tensors, into the op's outputs: fused_add_rmsnorm (SGLang's own, also where
    astra's fused_add_rmsnorm op is patched) in place on copies of x and residual, then F.linear on the normed row
    (cuBLAS) into out."""
    import importlib

    import torch

    fn = getattr(importlib.import_module(LAYERNORM), "fused_add_rmsnorm")
    fn = getattr(fn, "__astra_original__", fn)
    c["normed"].copy_(c["x"])
    c["residual_out"].copy_(c["residual"])
    fn(c["normed"], c["residual_out"], c["norm_weight"], float(c["eps"]))
    c["out"].copy_(torch.nn.functional.linear(c["normed"], c["weight"]))


class _HandOff:
    """qkv_proj's forward for one attention call: (the kernel's projection, None) for the normed row, else the
    layer's own forward."""

    def __init__(self, qkv, normed, out):
        self.own = type(qkv).forward.__get__(qkv)
        self.normed, self.out, self.used = normed, out, False

    def __call__(self, input_, *args, **kwargs):
        if input_ is self.normed and not args and not kwargs:
            self.used = True
            return self.out, None
        return self.own(input_, *args, **kwargs)


def _returns(c: Dict[str, Any]):
    """The rest of the replaced forward: the attention on the normed row (qkv_proj handed the kernel's projection),
    post_attention_layernorm, mlp; (hidden, residual)."""
    layer = c["layer"]
    qkv = layer.self_attn.qkv_proj
    qkv.forward = _HandOff(qkv, c["normed"], c["out"])
    try:
        h = layer.self_attn(positions=c["positions"], hidden_states=c["normed"], forward_batch=c["forward_batch"])
    finally:
        del qkv.forward
    h, res = layer.post_attention_layernorm(h, c["residual_out"])
    return layer.mlp(h), res


ADAPTER = OpAdapter(
    op="add_rmsnorm_linear",
    data="x",
    same_dtype=("x", "residual", "norm_weight", "weight", "out", "residual_out", "normed"),
    rowwise=("x", "residual", "out", "residual_out", "normed"),
    normalize=_normalize,
    returns=_returns,
    expand=expand,
    sequence=sequence,
    # forward(self, positions, hidden_states, ...): hidden_states at position 2
    precheck=token_precheck(2, MAX_TOKENS),
    max_tokens=MAX_TOKENS,
    keeps=lambda dims: declined(*dims),
)
