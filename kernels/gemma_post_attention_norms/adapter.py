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
forward passes them (the Binder hands a fused op's expand the **kwargs as one dict).

Across the layer boundary (on by default since the H200 validated it and the decode-step A/B measured it,
RESULTS.md; ASTRA_GPAN_ACROSS_LAYERS=0 turns it off, read once when this module is imported, i.e. at patch time). A
layer ends with post_feedforward_layernorm(h) (gemma_rmsnorm) and the next one starts with input_layernorm(h, residual)
(gemma_fused_add_rmsnorm, in place): the same pair, so layer i may return its raw MLP output and leave both norms to
layer i+1, which runs this op's kernel with (layer i's post_feedforward weight and eps, its own input_layernorm weight
and eps) in place of its input_layernorm. The hand-off:
- layer i (`_returns` -> `_defer`) defers only where it knows its return value goes, unchanged, straight into the
  patched forward of layer i+1 of the same model: the frames above it are exactly the patch's replacement (and
  SGLang's REPLACE hook wrapper where the class's forward is that), torch's Module call (no hooks anywhere, no
  compiled call) and the decoder loop of Gemma2Model.forward /
  Gemma3TextModel.forward (the code objects of the loaded classes; the tests pin both loops in 0.5.17 and 0.5.23: the
  layer's result goes to the next iteration's layer call, the last layer's to the model's final norm), with
  `model.layers[i] is layer`, i + 1 < len(model.layers) (never the last layer), on Gemma-3 i + 1 not in
  model.layers_to_capture (EAGLE-3 captures that layer's input), layer i+1 of the same decoder class, its forward the
  patched class method (no instance override, no hooks), accepted by `_declined` with these very tensors, both norms
  of the pair exactly the layer's norm class dispatching to forward_cuda with [hidden] weights of the dtype; the op
  not disabled, no torch.compile / tracing, not inside a bypass. Everything checked is the model's structure and the
  tensors' metadata, never their values: CUDA-graph capture runs this once and replays what it chose. Not called
  from that loop (forward_split_prefill's loop keeps hidden states between calls, another model, a test harness),
  the layer runs SGLang's post_feedforward_layernorm itself.
- what it defers is one thread-local slot: the exact tensor returned (and the residual), layer i, layer i+1, the
  weight and eps. Layer i+1's `expand` looks at the slot before anything else and takes it only if hidden_states IS
  that tensor (and residual that residual, and it is that layer i+1); it then runs the op through its OpState
  (`run_canonical`, as the op's custom op does: self-check, counters, SGLang's two norm kernels where the kernel
  declines or the op is disabled), in place on the raw tensor and the residual, and goes on with its attention. A raw
  tensor reaching a patched layer any other way (never expected) gets layer i's own post_feedforward_layernorm first,
  in place, so SGLang's forward sees what it expects."""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Dict, Optional

from astra_sglang.patch.adapters import (OpAdapter, contiguity_problem, cuda_dispatch_problem, env_switch,
                                         loaded_class, module_call_hooked)

log = logging.getLogger("astra_sglang.patch")

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

# Across the layer boundary (module docstring): on unless ASTRA_GPAN_ACROSS_LAYERS is 0 / false / off / no when the
# adapter is imported (patch time). On by default since 2026-11-28 (H200, SGLang 0.5.17): validate 84/84 with the
# hand-off, and the decode step of Gemma-2-9B -0.67% / -0.81% and Gemma-3-12B -0.39% / -0.74% (batch 1 / 2) over the
# pair inside the layer alone, greedy tokens identical (RESULTS.md).
ACROSS = env_switch("ASTRA_GPAN_ACROSS_LAYERS", True)
# The model forwards whose decoder loop hands layer i's (hidden_states, residual) straight to layer i+1 and the last
# layer's to the final norm (tests pin both loops): LAYERS kind -> (module, class)
LOOPS = {"gemma2": ("sglang.srt.models.gemma2", "Gemma2Model"),
         "gemma3": ("sglang.srt.models.gemma3_causal", "Gemma3TextModel")}
_MAX_FRAMES = 8  # frames between `_returns` and the loop: replacement (not_covered), SGLang's REPLACE wrapper, torch's
# Module call (two)
# this process's hand-offs, for tests and validate's layer (the op's counters have fixed fields)
ACROSS_COUNTS = {"deferred": 0, "fused": 0, "finished": 0}
ACROSS_WHY: Dict[str, Optional[str]] = {"last": None}  # why the last layer that ran its own norm did not defer
_SLOT = threading.local()  # .pending: the one deferred post_feedforward_layernorm waiting for layer i+1


def _layer_kind(layer):
    """The LAYERS row whose class `layer` is an instance of, or None."""
    for row in LAYERS:
        c = loaded_class(row[1], row[2])
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
    why = (_norm_problem(post, "post_attention_layernorm", norm_cls)
           or _norm_problem(pre, "pre_feedforward_layernorm", norm_cls)
           or _weight_problem(post.weight.data, hs, "post_attention_layernorm")
           or _weight_problem(pre.weight.data, hs, "pre_feedforward_layernorm"))
    if why is None and any(module_call_hooked(m) for m in (post, pre)):  # the op skips both modules' calls
        return "module hooks or a compiled module call on the two norms the op replaces"
    return why


def expand(a: Dict[str, Any]):
    """Gemma2DecoderLayer.forward(self, positions, hidden_states, forward_batch, residual) or
    Gemma3DecoderLayer.forward(self, positions, hidden_states, position_embeddings_global, position_embeddings_local,
    forward_batch, residual=None, **kwargs) -> canonical arguments (plus what `returns` needs), or why SGLang keeps
    it. Every reason to decline comes first; then the method's own work up to the two norms: input_layernorm and the
    attention, called as the method calls them."""
    layer, hs, res = a["self"], a["hidden_states"], a.get("residual")
    p = _take_pending(hs)  # before any decline: a deferred norm is this call's to finish
    why = _declined(a)
    if p is not None and (why or layer is not p.succ or res is not p.res):
        _finish(p)  # never expected (layer i checked all of it): SGLang's own norm, then this forward as it is
        p = None
    if why:
        return why
    row = _layer_kind(layer)
    kind, eps_attr = row[0], row[4]
    if p is not None:  # layer i's post_feedforward_layernorm and this input_layernorm: the op, in place
        _fuse_across(p, layer, eps_attr)
    elif res is None:
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
    """The rest of the replaced forward: mlp and post_feedforward_layernorm on the op's output, (hidden, residual);
    the norm left to layer i+1 where `_successor` knows that is where the result goes."""
    layer = c["layer"]
    h = layer.mlp(c["input"])
    res = c["residual"]
    if not (ACROSS and _defer(layer, h, res)):
        h = layer.post_feedforward_layernorm(h)
    return h, res


# ------------------------------------------------------------------------------------------ across the layer boundary
class _Pending:
    __slots__ = ("h", "res", "pred", "succ", "weight", "eps", "state")

    def __init__(self, h, res, pred, succ, weight, eps, state):
        self.h, self.res, self.pred, self.succ, self.weight, self.eps, self.state = (
            h, res, pred, succ, weight, eps, state)


def _take_pending(hs) -> Optional[_Pending]:
    """The deferred norm whose tensor `hs` is, taken out of the slot; a slot left for another tensor is dropped."""
    p = getattr(_SLOT, "pending", None)
    if p is None:
        return None
    _SLOT.pending = None
    if p.h is hs:
        return p
    log.warning("astra-sglang %s: a deferred post_feedforward_layernorm was not taken by layer i+1", ADAPTER.op)
    return None


def _finish(p: _Pending) -> None:
    """Layer i's own post_feedforward_layernorm on the tensor it returned raw, in place."""
    ACROSS_COUNTS["finished"] += 1
    p.h.copy_(p.pred.post_feedforward_layernorm(p.h))


def _fuse_across(p: _Pending, layer, eps_attr: str) -> None:
    """The op on (layer i's MLP output, the residual) with layer i's post_feedforward and this layer's input_layernorm:
    both in place, as input_layernorm(post_feedforward_layernorm(h), residual) leaves them."""
    ACROSS_COUNTS["fused"] += 1
    norm = layer.input_layernorm
    p.state.run_canonical({"input": p.h, "residual": p.res, "weight1": p.weight, "weight2": norm.weight.data,
                           "eps1": p.eps, "eps2": float(getattr(norm, eps_attr))}, None)


def _state():
    """This op's live OpState (not disabled), or None."""
    from astra_sglang.patch import active_patcher

    patcher = active_patcher()
    st = getattr(patcher, "states", {}).get(ADAPTER.op) if patcher is not None else None
    if st is None or st.disabled or st.default_original is None:
        return None
    return st


_CALL_CODES: Dict[str, Any] = {}


def _call_codes():
    """The code objects between a decoder loop's `layer(...)` and `_returns` in any process: torch's Module call and
    the patch's replacement (and not_covered, which calls `returns` too). `_installed_forward_code` adds one per
    layer class."""
    if not _CALL_CODES:
        import types

        import torch

        from astra_sglang.patch import apply

        own = {c for c in apply.make_replacement.__code__.co_consts
               if isinstance(c, types.CodeType) and c.co_name in ("replacement", "not_covered")}
        torch_calls = {getattr(getattr(torch.nn.Module, n, None), "__code__", None)
                       for n in ("_call_impl", "_wrapped_call_impl")}
        _CALL_CODES["codes"] = frozenset((own | torch_calls) - {None}) if len(own) == 2 else frozenset()
    return _CALL_CODES["codes"]


def _installed_forward_code(layer):
    """The code of the class's installed forward where it carries this op, else None: in a real SGLang the patch goes
    in through its plugin HookRegistry as a REPLACE, whose functools.wraps wrapper is one more frame
    (`return hook(*args, **kwargs)`). Another plugin's BEFORE / AFTER / AROUND hook around it is then the class's
    forward instead, and the REPLACE wrapper under it is no allowed frame: no hand-off past a hook that may change the
    result."""
    fwd = getattr(type(layer), "forward", None)
    return getattr(fwd, "__code__", None) if getattr(fwd, "__astra_op__", None) == ADAPTER.op else None


def _loop_call(layer, kind: str, depth: int = 4):
    """(model, i) where `_returns`' caller (`depth` frames up: _loop_call <- _defer_problem <- _defer <- _returns) was
    reached from SGLang's decoder loop of this layer kind, calling `layer` as layers[i], through nothing but the
    patch's frames (`_call_codes`, `_installed_forward_code`) and torch's Module call (so the loop gets the return
    value unchanged); else why not."""
    mod, cls_name = LOOPS[kind]
    cls = loaded_class(mod, cls_name)
    loop = getattr(cls.__dict__.get("forward"), "__code__", None) if cls is not None else None
    codes, installed = _call_codes(), _installed_forward_code(layer)
    if loop is None or not codes:
        return f"no {cls_name}.forward loaded, or an unknown patch / torch Module call"
    f = sys._getframe(depth)
    for _ in range(_MAX_FRAMES):
        if f is None or (f.f_code not in codes and f.f_code is not installed):
            break
        f = f.f_back
    if f is None or f.f_code is not loop:
        return (f"called from {f.f_code.co_qualname if f is not None else 'nowhere'}, not straight from "
                f"{cls_name}.forward's loop")
    loc = f.f_locals
    model, i = loc.get("self"), loc.get("i")
    if loc.get("layer") is not layer or not isinstance(model, cls) or type(i) is not int:
        return f"{cls_name}.forward's frame does not hold this layer as layers[i]"
    return model, i


def _successor_problem(layer, succ, kind: str, h, res) -> Optional[str]:
    """Why layer i+1 (`succ`) might not take the deferred norm in its expand, or None."""
    if _layer_kind(succ) is not _layer_kind(layer) or "forward" in vars(succ):
        return "layer i+1 is not this decoder class with its class forward"
    if getattr(getattr(type(succ), "forward", None), "__astra_op__", None) != ADAPTER.op:
        return "layer i+1's forward is not this op's patch"
    if any(module_call_hooked(m) for m in (layer, succ, layer.post_feedforward_layernorm, succ.input_layernorm)):
        return "module hooks or a compiled module call (on the layers or the two norms the hand-off skips)"
    return _declined({"self": succ, "hidden_states": h, "residual": res})


def _defer_problem(layer, h, res, st) -> Optional[str]:
    """Leave `layer`'s post_feedforward_layernorm on `h` to the next layer (recorded in the slot), where this call's
    result is known to go straight into the patched forward of layer i+1 of the same model (the module docstring):
    None; else why the layer runs its norm. A pure function of the structure and the tensors' metadata; `st` is the
    op's live OpState (`_state()`)."""
    import torch

    from astra_sglang.patch.ops import bypassing, is_tracing

    row = _layer_kind(layer)
    if row is None:
        return "not a Gemma decoder layer"
    if torch.compiler.is_compiling() or bypassing() or torch._C._get_tracing_state():
        return "compiling, tracing or inside a self-check"
    if not isinstance(h, torch.Tensor) or not isinstance(res, torch.Tensor) or is_tracing(h):
        return "the MLP output or the residual is not a tensor"
    if h.shape != res.shape or h.dtype != res.dtype or h.device != res.device or h.data_ptr() == res.data_ptr():
        return "the MLP output and the residual differ in shape, dtype or device, or alias"
    if st is None:
        return "the op is not live in this process (no patcher, or disabled)"
    kind, norm_cls, eps_attr = row[0], row[3], row[4]
    found = _loop_call(layer, kind)
    if isinstance(found, str):
        return found
    model, i = found
    layers = getattr(model, "layers", None)
    try:
        if layers is None or layers[i] is not layer:
            return "model.layers[i] is not this layer"
        if i + 1 >= len(layers):
            return "the last layer (its result goes to the model's final norm)"
        succ = layers[i + 1]
    except (TypeError, IndexError):
        return "model.layers is not indexable"
    if kind == "gemma3":  # the loop appends the input of each layer in layers_to_capture (EAGLE-3)
        cap = getattr(model, "layers_to_capture", None)
        if not isinstance(cap, (list, tuple, set, frozenset)) or (i + 1) in cap:
            return "layer i+1's input is captured (EAGLE-3)"
    post, nxt = getattr(layer, "post_feedforward_layernorm", None), getattr(succ, "input_layernorm", None)
    why = (_norm_problem(post, "post_feedforward_layernorm", norm_cls)
           or _norm_problem(nxt, "input_layernorm", norm_cls)
           or _weight_problem(post.weight.data, h, "post_feedforward_layernorm")
           or _weight_problem(nxt.weight.data, h, "input_layernorm")
           or _successor_problem(layer, succ, kind, h, res))
    if why:
        return why
    try:
        eps = float(getattr(post, eps_attr))
        float(getattr(nxt, eps_attr))
    except (AttributeError, TypeError, ValueError):
        return "a norm's eps is not a number"
    _SLOT.pending = _Pending(h, res, layer, succ, post.weight.data, eps, st)
    if not ACROSS_COUNTS["deferred"]:
        st.counters.set_status(ADAPTER.op, across_layers="deferring")  # once per process: the GPU session's evidence
    ACROSS_COUNTS["deferred"] += 1
    return None


def _defer(layer, h, res) -> bool:
    """True where `_defer_problem` found none (the norm is in the slot); else the reason is kept in ACROSS_WHY (for
    validate's message) and each new one in the counters' status (a GPU session's evidence of what stopped it)."""
    st = _state()
    why = _defer_problem(layer, h, res, st)
    if why is None:
        return True
    ACROSS_WHY["last"] = why
    seen = st.counters.status.get(ADAPTER.op, {}).get("across_layers_not_deferred", []) if st is not None else None
    if seen is not None and why not in seen:
        st.counters.set_status(ADAPTER.op, across_layers_not_deferred=sorted([*seen, why]))
    return False


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
