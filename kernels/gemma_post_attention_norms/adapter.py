"""The patch adapter of a fused op that replaces layer methods (patch/adapters.py holds the machinery and says what
each field means): SGLang 0.5.17's (and 0.5.23's, the same bodies) Gemma2DecoderLayer.forward(self, positions,
hidden_states, forward_batch, residual) and Gemma3DecoderLayer.forward(self, positions, hidden_states,
position_embeddings_global, position_embeddings_local, forward_batch, residual=None, **kwargs), whose bodies are

    input_layernorm; self_attn; post_attention_layernorm(h); pre_feedforward_layernorm(h, residual); mlp;
    post_feedforward_layernorm

On a CUDA server the middle two are SGLang's two norm kernels back to back (GemmaRMSNorm._forward_impl /
Gemma3RMSNorm.forward_cuda -> gemma_rmsnorm, then gemma_fused_add_rmsnorm in place). Replaced, a call `expand` takes
runs the method's own input_layernorm and attention (as the method calls them), this op's kernel in place of the two
norms, then `returns` runs the method's own mlp and post_feedforward_layernorm: everything but the two norms stays
SGLang's code.

`expand` declines (the method runs unchanged) before any work unless:
- hidden_states is a 2-D fp16 / bf16 CUDA tensor with tokens, and residual is None (the first layer: it becomes
  hidden_states) or a tensor of its shape, dtype and device;
- the layer is SGLang's Gemma2DecoderLayer / Gemma3DecoderLayer (or a subclass) and its post_attention_layernorm and
  pre_feedforward_layernorm are exactly that layer's norm class (GemmaRMSNorm / Gemma3RMSNorm), each dispatching to
  forward_cuda (not the native path of torch.compile, an out-of-tree forward, HIP/CPU/NPU, a forced 0.5.23 backend),
  which calls the module's gemma_rmsnorm / gemma_fused_add_rmsnorm (SGLang's sgl_kernel functions, or astra's patch of
  them: the same values) on 2-D hidden states;
- both weights are contiguous [hidden] tensors of hidden_states' dtype on its device.
After the attention, a call the kernel does not take (a non-contiguous attention output) runs `sequence`: SGLang's
two norm kernels on the same tensors (patch/apply.py not_covered).
Gemma-3's attention gets position_embeddings (local on sliding layers, else global) and the method's **kwargs, as its
forward passes them (the Binder hands a fused op's expand the **kwargs as one dict)."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from astra_sglang.patch.adapters import OpAdapter, contiguity_problem, cuda_dispatch_problem

# In `--ops all` since 2026-11-28 (H200): bit-identical to production's two kernels, 1.98x in context, and the
# decode step of Gemma-2-9B and Gemma-3-12B 0.45-0.70% faster with identical greedy tokens (RESULTS.md).
DEFAULT_OFF = ""

DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)
# (kind, module, class, its norm class in LAYERNORM, the norm's eps attribute) of the decoder layers whose forward this
# op replaces
LAYERS = (("gemma2", "sglang.srt.models.gemma2", "Gemma2DecoderLayer", "GemmaRMSNorm", "variance_epsilon"),
          ("gemma3", "sglang.srt.models.gemma3_causal", "Gemma3DecoderLayer", "Gemma3RMSNorm", "eps"))
LAYERNORM = "sglang.srt.layers.layernorm"
NORM_FNS = ("gemma_rmsnorm", "gemma_fused_add_rmsnorm")  # what GemmaRMSNorm._forward_impl calls, in order


def _cls(mod: str, name: str):
    c = getattr(sys.modules.get(mod), name, None)
    return c if isinstance(c, type) else None


def _layer_kind(layer):
    """The LAYERS row whose class `layer` is an instance of, or None."""
    for row in LAYERS:
        c = _cls(row[1], row[2])
        if c is not None and isinstance(layer, c):
            return row
    return None


def _norm_problem(norm, what: str, norm_cls: str) -> Optional[str]:
    """None where norm(x[, residual]) would run `norm_cls`.forward_cuda -> the module's gemma_rmsnorm /
    gemma_fused_add_rmsnorm (the two kernels this op fuses), else why not."""
    ln = sys.modules.get(LAYERNORM)
    gemma = getattr(ln, norm_cls, None)
    if gemma is None or type(norm) is not gemma:
        return f"{what} is {type(norm).__name__}, not SGLang's {norm_cls}"
    why = cuda_dispatch_problem(norm, what)
    if why:
        return why
    for fn in NORM_FNS:
        if not callable(getattr(ln, fn, None)):
            return f"{LAYERNORM} has no {fn} (not SGLang's CUDA build)"
    return None


def _weight_problem(w, x, what: str) -> Optional[str]:
    import torch

    if not isinstance(w, torch.Tensor) or w.dim() != 1 or w.shape[0] != x.shape[1]:
        return f"{what}'s weight is not a [{x.shape[1]}] tensor"
    if w.dtype != x.dtype or w.device != x.device:
        return f"{what}'s weight is {w.dtype} on {w.device}, hidden_states {x.dtype} on {x.device}"
    if not w.is_contiguous():
        return f"{what}'s weight is not contiguous"
    return None


def _declined(a: Dict[str, Any]) -> Optional[str]:
    """Why SGLang's forward keeps this call (checked before any work), or None."""
    import torch

    layer, hs, res = a["self"], a["hidden_states"], a.get("residual")
    if not isinstance(hs, torch.Tensor) or hs.dim() != 2 or hs.device.type not in DEVICES:
        return "hidden_states is not a 2-D CUDA tensor"
    if hs.dtype not in (torch.float16, torch.bfloat16):
        return f"hidden_states is {hs.dtype}, not fp16 / bf16"
    if hs.shape[0] == 0:
        return "no tokens"
    if res is not None and (not isinstance(res, torch.Tensor) or res.shape != hs.shape or res.dtype != hs.dtype
                            or res.device != hs.device):
        return "residual is not a tensor of hidden_states' shape, dtype and device"
    row = _layer_kind(layer)
    if row is None:
        return f"{type(layer).__name__} is not SGLang's {' / '.join(r[2] for r in LAYERS)}"
    norm_cls = row[3]
    post, pre = getattr(layer, "post_attention_layernorm", None), getattr(layer, "pre_feedforward_layernorm", None)
    return (_norm_problem(post, "post_attention_layernorm", norm_cls)
            or _norm_problem(pre, "pre_feedforward_layernorm", norm_cls)
            or _weight_problem(post.weight.data, hs, "post_attention_layernorm")
            or _weight_problem(pre.weight.data, hs, "pre_feedforward_layernorm"))


def expand(a: Dict[str, Any]):
    """Gemma2DecoderLayer.forward(self, positions, hidden_states, forward_batch, residual) or
    Gemma3DecoderLayer.forward(self, positions, hidden_states, position_embeddings_global, position_embeddings_local,
    forward_batch, residual=None, **kwargs) -> canonical arguments (plus what `returns` needs), or why SGLang keeps
    it. Every reason to decline comes first; then the method's own work up to the two norms: input_layernorm and the
    attention, called as the method calls them."""
    why = _declined(a)
    if why:
        return why
    layer, hs, res = a["self"], a["hidden_states"], a.get("residual")
    row = _layer_kind(layer)
    kind, eps_attr = row[0], row[4]
    if res is None:
        res = hs
        hs = layer.input_layernorm(hs)
    else:
        hs, res = layer.input_layernorm(hs, res)
    if kind == "gemma3":  # global RoPE on non-sliding layers only, the method's **kwargs to the attention
        pe = a["position_embeddings_local"] if layer.self_attn.is_sliding else a["position_embeddings_global"]
        h = layer.self_attn(positions=a["positions"], hidden_states=hs, position_embeddings=pe,
                            forward_batch=a["forward_batch"], **(a.get("kwargs") or {}))
    else:
        h = layer.self_attn(positions=a["positions"], hidden_states=hs, forward_batch=a["forward_batch"])
    post, pre = layer.post_attention_layernorm, layer.pre_feedforward_layernorm
    return {"input": h, "residual": res, "weight1": post.weight.data, "weight2": pre.weight.data,
            "eps1": float(getattr(post, eps_attr)), "eps2": float(getattr(pre, eps_attr)), "layer": layer}


def _normalize(c):
    """input [T, H] (the attention's output), residual [T, H], weight1 / weight2 [H] -> the ABI's tensors and (T, H)."""
    x, r = c["input"], c["residual"]
    if x.dim() != 2 or tuple(r.shape) != tuple(x.shape):
        return f"attention output {tuple(x.shape)} / residual {tuple(r.shape)}: not one [tokens, hidden] shape"
    h = x.shape[1]
    for n in ("weight1", "weight2"):
        if tuple(c[n].shape) != (h,):
            return f"{n} {tuple(c[n].shape)} != ({h},)"
    bad = contiguity_problem(c, ("input", "residual", "weight1", "weight2"))
    if bad:
        return bad
    if x.data_ptr() == r.data_ptr():
        return "the attention output aliases the residual"
    return {n: c[n] for n in ("input", "residual", "weight1", "weight2")}, (x.shape[0], h)


def sequence(c: Dict[str, Any]) -> None:
    """SGLang's two norm kernels on canonical tensors, as GemmaRMSNorm._forward_impl and Gemma3RMSNorm.forward_cuda
    call them on 2-D hidden states (SGLang's own functions
    also where astra's gemma_rmsnorm / gemma_fused_add_rmsnorm ops are patched): y = gemma_rmsnorm(input, weight1,
    eps1), then gemma_fused_add_rmsnorm(y, residual, weight2, eps2) in place; input <- y."""
    import importlib

    ln = importlib.import_module(LAYERNORM)
    rms, farn = (getattr(ln, n) for n in NORM_FNS)
    rms, farn = getattr(rms, "__astra_original__", rms), getattr(farn, "__astra_original__", farn)
    y = rms(c["input"], c["weight1"], float(c["eps1"]))
    farn(y, c["residual"], c["weight2"], float(c["eps2"]))
    c["input"].copy_(y)


def _returns(c: Dict[str, Any]):
    """The rest of the replaced forward: mlp and post_feedforward_layernorm on the op's output, (hidden, residual)."""
    layer = c["layer"]
    h = layer.mlp(c["input"])
    h = layer.post_feedforward_layernorm(h)
    return h, c["residual"]


ADAPTER = OpAdapter(
    op="gemma_post_attention_norms",
    data="input",
    same_dtype=("input", "residual", "weight1", "weight2"),
    rowwise=("input", "residual"),
    normalize=_normalize,
    returns=_returns,
    expand=expand,
    sequence=sequence,
)
