"""ABI adapters: how SGLang's callables map onto an op's kernel ABI (kernels/<op>/spec.py).

The op's *canonical* arguments are the spec's ABI names: pointer args become tensors,
scalar args that are not sizes or the dtype code (eps) stay scalars; sizes come from the
tensors' shapes, the dtype code from the op's data tensor. Everything here is per op,
and generic over the callables that reach it:

- a callable's parameters map to canonical names by name, through `aliases`
  (merge_state_v2's v_merged is the ABI's v_out); parameters listed in `ignorable`
  (enable_pdl) do not change the result; any other parameter must hold its default,
  else the call goes to SGLang's original (e.g. the JIT silu_and_mul's expert_ids);
- optional outputs (out=None) are allocated the way the original would;
- `normalize` checks shapes, dtypes and contiguity and returns the 2-D views and sizes
  the ABI takes; anything it does not accept (non-contiguous strides, an odd last
  dimension, fp8, mismatched shapes) falls back to the original;
- `returns` builds what the callable returns from the canonical tensors;
- `jit_routes` say which methods of a JIT module (from a factory found by discovery)
  are this op, and when.
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "int32"}  # int32: moe_align ids


@dataclass(frozen=True)
class JitRoute:
    """One method of a JIT module that computes the op.

    factory_ok(bound factory arguments) -> whether modules built with these arguments
    compute the op's contract (e.g. not the HF-parity or precise-math build).
    params: the method's positional parameters as canonical names; "=name" marks a
    non-tensor argument that must satisfy `match`.
    """

    method: str
    params: Tuple[str, ...]
    match: Callable[[Tuple[Any, ...]], bool] = lambda args: True
    factory_ok: Callable[[Mapping[str, Any]], bool] = lambda fargs: True


@dataclass(frozen=True)
class Served:
    """What `expand` returns for a call the op answers from its own earlier work, with no kernel: `value` is the
    callable's result (moe_route_align: the alignment its fused kernel wrote when it routed the same ids)."""

    value: Any


@dataclass(frozen=True)
class OpAdapter:
    op: str
    data: str  # canonical tensor whose dtype is the ABI dtype
    same_dtype: Tuple[str, ...]  # tensors that must share `data`'s dtype
    fp32: Tuple[str, ...] = ()  # tensors that are fp32 whatever the data dtype (lse)
    rowwise: Tuple[str, ...] = ()  # tensors indexed by token in dim 0 (self-check samples rows)
    aliases: Mapping[str, str] = field(default_factory=dict)
    ignorable: FrozenSet[str] = frozenset()
    # ABI scalars no parameter of SGLang's callable carries: `normalize` sets them on the canonical dict from what the
    # installed SGLang does (moe_grouped_router's shared_weight: 0.5.23's fused_shared_expert_weight, or -1).
    derived: Tuple[str, ...] = ()
    alloc: Mapping[str, Callable[[Dict[str, Any]], Any]] = field(default_factory=dict)
    # canonical tensors -> (ABI views, dims) or a reason string to fall back
    normalize: Callable[[Dict[str, Any]], Any] = None  # type: ignore[assignment]
    returns: Callable[[Dict[str, Any]], Any] = lambda c: None
    jit_routes: Mapping[str, Tuple[JitRoute, ...]] = field(default_factory=dict)
    # For callables that *return* the op's outputs instead of writing arguments (fused_topk returns
    # (topk_weights, topk_ids)): the returned value -> {canonical output: tensor}. The original's result is
    # then copied into the canonical outputs wherever SGLang's original serves a call (fallback, self-check)
    # and where the harness runs it as a baseline (harness/installed.py). None: outputs are arguments.
    outputs_of: Optional[Callable[[Any], Dict[str, Any]]] = None
    # Parameters that are not the op's but follow from its canonical arguments (fused_topk's hidden_states,
    # only read for its row count): param -> fn(canonical dict), set on every call of the original (the
    # self-check's row sample, the harness's installed baseline, compiled graphs' self-check).
    bare_args: Mapping[str, Callable[[Dict[str, Any]], Any]] = field(default_factory=dict)
    # ABI dims that follow from the token count (a buffer sized from it: moe_align's max_num_tokens_padded). The
    # self-check's shape class leaves them out; with them every prefill length was a class of its own, and each
    # new one a self-check of ~10 ms on the request's path (H200 server profile, 2026-11-27).
    token_derived: Tuple[str, ...] = ()
    # Calls with more tokens (dims[0]) than this stay with SGLang's original by design: the kernel was
    # measured slower than that route in context. validate reports such shapes n/a. None: no limit.
    max_tokens: Optional[int] = None
    # Shapes (the ABI's dims) beyond max_tokens that stay with SGLang by design -> why, or None (linear: widths where
    # cuBLAS is as fast). validate reports them n/a too.
    keeps: Optional[Callable[[Tuple[int, ...]], Optional[str]]] = None
    # Fused ops replace a layer method whose body is the kernel sequence they fuse (qknorm_rope_store:
    # Qwen3MoeAttention.apply_qk_norm_rope runs q/k norm, then rope + KV store). Such a method's parameters
    # (the module, its activations, the batch) are not the ABI's, so instead of mapping parameters:
    # expand(bound arguments by name) -> the canonical arguments (the ABI's tensors and scalars, plus what
    # `returns` needs) or a reason to leave the call to the method; sequence(canonical) runs SGLang's own
    # kernels of the fused sequence on canonical tensors (the self-check's expected result, and the fallback
    # when the kernel fails). The method itself serves every call expand declines; expand declines before it
    # does any of the method's own work (qknorm_rope's qkv GEMM), since after that `sequence` serves the rest.
    expand: Optional[Callable[[Dict[str, Any]], Any]] = None
    sequence: Optional[Callable[[Dict[str, Any]], None]] = None
    # A reason to leave an eager call to SGLang read straight off the raw (args, kwargs), before binding, or None.
    # For a patched method most calls never take (linear's prefill-sized ones: every linear layer's every eager
    # prefill call passes through the patch): binding and expand cost the host ~10 µs a call, this ~1 µs.
    precheck: Optional[Callable[[Tuple[Any, ...], Mapping[str, Any]], Optional[str]]] = None
    # Cache tensors written only at the rows a per-token index names ({"k_cache": "out_loc"}): the KV pool's
    # layer, hundreds of MB. The self-check then copies just those rows (a compact cache, the index
    # renumbered) instead of cloning the pool, and restores just those rows on a mismatch.
    slot_indexed: Mapping[str, str] = field(default_factory=dict)
    # Inputs neither the kernel nor SGLang's original writes, too large to copy for a self-check (moe_experts'
    # expert stacks: GBs a layer, where a server has no such headroom): the self-check reads them where they are.
    read_only: Tuple[str, ...] = ()
    # Outputs a callable or `sequence` *returns* as new tensors that the harness's installed baseline then copies
    # into the ABI's buffers (moe_route_align: fused_topk's weights and ids): bench times just these copies as
    # the binding's, not SGLang's. Empty: every mutated ABI tensor.
    returned: Tuple[str, ...] = ()

    def canonical(self, param: str) -> str:
        return self.aliases.get(param, param)

    def kept_by_sglang(self, dims: Sequence[int]) -> Optional[str]:
        """Why a call of ABI dims `dims` (dims[0] its tokens) stays with SGLang's original by design (max_tokens,
        keeps), or None."""
        tokens = dims[0]
        if self.max_tokens is not None and tokens > self.max_tokens:
            return f"{tokens} tokens > {self.max_tokens}: SGLang's own route is faster in context"
        if self.keeps is not None:
            return self.keeps(tuple(dims))
        return None


def env_switch(name: str, default: bool) -> bool:
    """An adapter's on/off switch from the environment, read when the adapter is imported (a worker's setting):
    unset or empty is `default`; 0 / false / off / no is off, anything else on."""
    v = os.environ.get(name, "").strip().lower()
    return default if not v else v not in ("0", "false", "off", "no")


def rows_band(tokens: Tuple[int, int], why: str, width: Optional[Tuple[int, int]] = None):
    """A `keeps` for a row-wise op (ABI dims (tokens, width, ...)): calls whose token count, and width where given,
    lie in these closed ranges stay SGLang's, for `why` (a measured loss in context); every other call is the op's."""
    t_lo, t_hi = tokens

    def keeps(dims: Tuple[int, ...]) -> Optional[str]:
        t, w = int(dims[0]), int(dims[1])
        if t_lo <= t <= t_hi and (width is None or width[0] <= w <= width[1]):
            return f"{t} x {w}: {why}"
        return None

    return keeps


def contiguity_problem(c: Dict[str, Any], names: Sequence[str]) -> Optional[str]:
    """The first named tensor that is not contiguous, as a fallback reason, or None."""
    for n in names:
        if not c[n].is_contiguous():
            return f"{n} is not contiguous (strides {tuple(c[n].stride())})"
    return None


def q_out_problem(q, qo, qs: int, qos: int) -> str:
    """Why q_out ([t, hq, d], element and head strides 1 and d) cannot take a kernel's q ('' when it can), for the
    fused q/k ops that write q into its own buffer (gemma_qknorm_rope, dense_rope_store, qknorm_rope_store,
    qknorm_rope): their kernels read each q element before writing it, in the same thread or warp, so q_out may be q
    itself (same start, same row stride) or lie apart from it; any other overlap would write q elements another
    thread has not read yet."""
    if tuple(qo.shape) != tuple(q.shape):
        return f"q_out shape {tuple(qo.shape)} != q's {tuple(q.shape)}"
    t, hq, d = q.shape
    if qo.stride(2) != 1 or (hq > 1 and qo.stride(1) != d) or (t > 1 and qos < hq * d):
        return f"q_out strides {tuple(qo.stride())} are not (row >= heads * head_dim, head_dim, 1)"
    a, b = q.data_ptr(), qo.data_ptr()
    if a == b and qs == qos:
        return ""
    e = q.element_size()
    if a < b + ((t - 1) * qos + hq * d) * e and b < a + ((t - 1) * qs + hq * d) * e:
        return "q_out overlaps q other than as q itself"
    return ""


def new_q_out(q, on: bool):
    """The attention's q for an op that writes q into its own buffer: a fresh token-major [t, hq, d] buffer (rows
    hq * d apart), or, with the op's dev switch off, q itself (in place)."""
    import torch

    t, hq, d = q.shape
    return torch.empty((t, hq * d), dtype=q.dtype, device=q.device).view(t, hq, d) if on else q


def q_for_sglang(c: Mapping[str, Any]):
    """Where SGLang's in-place q kernels run in a q_out op's sequence (the self-check's expected result): q_out, after
    q's rows are copied into it, where it lies apart from q (q left as it was); else q itself."""
    q = c["q"]
    qo = c.get("q_out", q)
    if qo is not q and qo.data_ptr() != q.data_ptr():  # q_out = q: in place, no copy
        qo.copy_(q)
        return qo
    return q


def attention_q(c: Mapping[str, Any], q):
    """The q the attention gets: q_out viewed as `q` (the [tokens, q_size] column view of qkv) where expand gave one
    apart from q (its choice, not the switch read again), else `q`."""
    qo = c.get("q_out")
    return qo.view(q.shape) if qo is not None and qo is not c["q"] else q


def q_out_stride(c: Mapping[str, Any], dims: Sequence[int]):
    """q_out's row stride (the ABI's dim after the op's own) for an op whose dims start (tokens, q heads, kv heads,
    head_dim, q_stride), or why c["q_out"] cannot take the kernel's q (a str). One token: any row stride, as for q."""
    t, hq, d, qs = dims[0], dims[1], dims[3], dims[4]
    qo = c["q_out"]
    if qo.dim() != 3:
        return f"q_out {tuple(qo.shape)} is not [tokens, heads, head_dim]"
    qos = qo.stride(0) if t > 1 else hq * d
    return q_out_problem(c["q"], qo, qs, qos) or qos


def cuda_dispatch_problem(module: Any, what: str) -> Optional[str]:
    """None where SGLang's CustomOp / BaseFusedOp `module` dispatches to its forward_cuda (the kernel a fused op
    replaces), else why not: torch.compile's native path, a fused-op backend forced in 0.5.23, or another method.
    0.5.23 resolves the method on the module's first forward and caches it; a call a fused op takes never reaches that
    forward, so it is resolved (and cached, as SGLang would) here."""
    if getattr(module, "is_torch_compile", False):
        return f"{what} runs its native path under torch.compile"
    forced = getattr(sys.modules.get("sglang.kernels.fused_op"), "get_fused_op_backend", None)  # 0.5.23
    if forced is not None and forced() is not None:
        return "a fused-op backend is forced (SGLANG_FORCE_FUSED_OP_BACKEND)"
    method = getattr(module, "_forward_method", None)
    if method is None and hasattr(module, "_resolve_forward_method"):
        try:
            method = module._forward_method = module._resolve_forward_method()
        except Exception as e:  # noqa: BLE001 - an unresolvable dispatch: leave the call to SGLang
            return f"{what}'s forward does not resolve here ({type(e).__name__})"
    if method != module.forward_cuda:
        return f"{what} runs {getattr(method, '__name__', method)!s}, not forward_cuda"
    return None


def loaded_class(module: str, name: str) -> Optional[type]:
    """The class `name` of an already imported SGLang module, or None (the module is not loaded, or has no such
    class): adapters that recognise SGLang's layers by class never import SGLang themselves."""
    c = getattr(sys.modules.get(module), name, None)
    return c if isinstance(c, type) else None


def module_call_hooked(m: Any) -> bool:
    """Whether torch's Module call of `m` would do more than m.forward: hooks (its own or global, forward or backward)
    or a compiled call. A fused op that replaces a layer's forward and skips one of its modules' calls (a norm) must
    not skip it past a hook (a dumper's hook would silently miss the call); an unknown torch says hooked."""
    import torch.nn.modules.module as mm

    for g in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
              "_global_backward_pre_hooks"):
        if getattr(mm, g, True):
            return True
    for n in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        if getattr(m, n, True):
            return True
    return getattr(m, "_compiled_call_impl", None) is not None


# ---------------------------------------------------------------------- shapes of op families
# Normalizers shared by ops of one shape (each op's adapter.py picks one): rows of a gated
# activation, and rows normalized with a per-channel weight.
def gated_rows(c: Dict[str, Any]):
    """input [..., 2d] -> out [..., d] (silu/gelu/gelu_tanh _and_mul): 2-D views and (tokens, d)."""
    x, out = c["input"], c["out"]
    nd = x.dim()
    if nd < 1 or x.shape[-1] % 2:
        return f"input's last dimension {tuple(x.shape)[-1:]} is not even"
    d = x.shape[-1] // 2
    if out.shape != x.shape[:-1] + (d,):
        return f"out shape {tuple(out.shape)} != {tuple(x.shape[:-1]) + (d,)}"
    bad = contiguity_problem(c, ("input", "out"))
    if bad:
        return bad
    if nd == 2:
        return {"input": x, "out": out}, (x.shape[0], d)
    t = x.numel() // (2 * d) if d else 0
    return {"input": x.view(t, 2 * d), "out": out.view(t, d)}, (t, d)


def gated_out(c: Dict[str, Any]):
    """The `out` a gated activation allocates when the caller passes none."""
    x = c["input"]
    return x.new_empty(tuple(x.shape[:-1]) + (x.shape[-1] // 2,))   # a tuple: new_empty(torch.Size) is slower


def contiguous_like(name: str):
    """An `alloc` for an output shaped like tensor `name` (rmsnorm's out): empty_like, a third faster than
    new_empty(shape) on every patched eager call, contiguous whatever `name`'s strides."""

    def make(c: Dict[str, Any]):
        import torch

        return torch.empty_like(c[name], memory_format=torch.contiguous_format)

    return make


def topk_output_alloc(dtype_name: str):
    """The [tokens, topk] output a router allocates when the caller passes none (moe routers)."""

    def make(c: Dict[str, Any]):
        import torch

        x = c.get("scores")
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return None  # prepare() then says which argument is wrong
        return torch.empty((x.shape[0], int(c["topk"])), dtype=getattr(torch, dtype_name), device=x.device)

    return make


def topk_outputs_problem(c: Dict[str, Any], t: int, k: int) -> Optional[str]:
    """Why a router's topk_weights / topk_ids are not the [t, k] fp32 / int32 pair it writes, or None."""
    import torch

    w, i = c["topk_weights"], c["topk_ids"]
    if tuple(w.shape) != (t, k) or tuple(i.shape) != (t, k):
        return f"outputs {tuple(w.shape)} / {tuple(i.shape)} != {(t, k)}"
    if i.dtype is not torch.int32:
        return f"topk_ids is {i.dtype}, not int32"
    return None


def weighted_rows(rows: Tuple[str, ...]):
    """A normalizer for ops over rows of width h with a weight [h] (rmsnorm family): `rows` are the
    tensors shaped like `input` (input, out / residual). Extra dimensions flatten into rows
    (flashinfer's 3-D per-head form is the same math per row). On every patched eager call: torch.Size
    compares as a tuple, so shapes are compared without copies, and the common 2-D call builds one dict."""
    others = tuple(n for n in rows if n != "input")
    contiguous = tuple(rows) + ("weight",)

    def normalize(c: Dict[str, Any]):
        x, w = c["input"], c["weight"]
        nd = x.dim()
        if nd < 1:
            return "input is 0-d"
        shape = x.shape
        h = shape[-1]
        for n in others:
            if c[n].shape != shape:
                return f"{n} shape {tuple(c[n].shape)} != input shape {tuple(shape)}"
        if w.shape != (h,):
            return f"weight shape {tuple(w.shape)} != ({h},)"
        bad = contiguity_problem(c, contiguous)
        if bad:
            return bad
        if nd == 2:
            views = {n: c[n] for n in rows}
            views["weight"] = w
            return views, (shape[0], h)
        t = x.numel() // h if h else 0
        views = {n: c[n].view(t, h) for n in rows}
        views["weight"] = w
        return views, (t, h)

    return normalize


def get_adapter(op: str) -> OpAdapter:
    """kernels/<op>/adapter.py's ADAPTER; an op without one is an error naming the file."""
    from astra_sglang.registry import op_part

    return op_part(op, "adapter").ADAPTER


# ---------------------------------------------------------------------- the spec side
@dataclass(frozen=True)
class AbiLayout:
    """What the adapter needs from the spec's ABI: tensor and scalar names, in order."""

    tensors: Tuple[str, ...]
    mutated: Tuple[str, ...]
    scalars: Tuple[Tuple[str, str], ...]  # (name, ctype) of non-size, non-dtype scalars
    dims: Tuple[str, ...]


def abi_layout(spec) -> AbiLayout:
    tensors = tuple(a.name for a in spec.abi if a.ctype == "ptr")
    mutated = tuple(a.name for a in spec.abi if a.ctype == "ptr" and a.role in ("out", "inout"))
    scalars = tuple((a.name, a.ctype) for a in spec.abi
                    if a.ctype != "ptr" and a.name != "dtype" and a.name not in spec.dim_names)
    return AbiLayout(tensors, mutated, scalars, tuple(spec.dim_names))


def adapter_mismatch(spec, adapter: OpAdapter) -> Optional[str]:
    """Why this adapter cannot drive this spec's ABI (names drifted), or None."""
    lay = abi_layout(spec)
    names = set(lay.tensors)
    need = {adapter.data, *adapter.same_dtype, *adapter.fp32, *adapter.rowwise, *adapter.alloc,
            *adapter.slot_indexed, *adapter.slot_indexed.values()}
    missing = sorted(need - names)
    if missing:
        return f"the {spec.name} adapter expects ABI tensors {missing} that the spec does not declare"
    unsampled = sorted(set(adapter.slot_indexed.values()) - set(adapter.rowwise))
    if unsampled:
        return f"the {spec.name} adapter's slot indexes {unsampled} are not rowwise (the self-check samples them)"
    return None


def torch_schema(spec) -> str:
    """The torch.library schema of the op's custom op, from the spec's ABI."""
    lay = abi_layout(spec)
    parts = []
    for i, n in enumerate(lay.tensors):
        parts.append(f"Tensor(a{i}!) {n}" if n in lay.mutated else f"Tensor {n}")
    for n, ct in lay.scalars:
        parts.append(f"{'float' if ct == 'f64' else 'int'} {n}")
    return f"({', '.join(parts)}) -> ()"


# ---------------------------------------------------------------------- binding calls
def torch_op_schema(fn: Any):
    """The schema of a torch custom op with one overload (an OpOverloadPacket or OpOverload), else None."""
    try:
        from torch._ops import OpOverload, OpOverloadPacket
    except ImportError:
        return None
    if isinstance(fn, OpOverloadPacket):
        names = list(fn.overloads())
        if len(names) != 1:
            return None
        fn = getattr(fn, names[0])
    return fn._schema if isinstance(fn, OpOverload) else None


def callable_signature(fn: Callable) -> Optional[inspect.Signature]:
    """fn's signature, or None where it cannot be read. A torch custom op reads as (*args, **kwargs) to inspect:
    SGLang 0.5.17's register_custom_op leaves the op itself (an OpOverloadPacket) under the function's name
    (store_cache, the rope kernels' apply_rope_inplace and apply_rope_inplace_with_kvcache), so its schema gives the
    names, defaults and keyword-only marks of the function it was made from."""
    schema = torch_op_schema(fn)
    if schema is None:
        try:
            return inspect.signature(fn)
        except (TypeError, ValueError):
            return None
    P = inspect.Parameter
    try:
        return inspect.Signature([
            P(a.name, P.KEYWORD_ONLY if a.kwarg_only else P.POSITIONAL_OR_KEYWORD,
              default=a.default_value if a.has_default_value() else P.empty)
            for a in schema.arguments])
    except (TypeError, ValueError):  # an argument order Python cannot take (a default before a required one)
        return None


class Binder:
    """Maps one callable's (args, kwargs) to canonical arguments, fast.

    inspect.Signature.bind costs ~10 µs; this precomputes the parameter table once.
    """

    def __init__(self, fn: Callable, adapter: OpAdapter, spec):
        self.adapter = adapter
        self.layout = abi_layout(spec)
        sig = self.signature = callable_signature(fn)
        self.from_schema = sig is not None and torch_op_schema(fn) is not None  # a torch custom op's
        # A fused op's layer method may take **kwargs (Gemma3DecoderLayer.forward): `expand` gets them as one dict
        # under that parameter's name. Any other callable with varargs stays unbound.
        self.varkw = next((n for n, p in sig.parameters.items() if p.kind is p.VAR_KEYWORD), None) \
            if sig is not None and adapter.expand is not None else None
        self.ok = sig is not None and not any(
            p.kind is p.VAR_POSITIONAL or (p.kind is p.VAR_KEYWORD and self.varkw is None)
            for p in sig.parameters.values())
        self.params: Tuple[str, ...] = ()
        self.positional: Tuple[str, ...] = ()
        self.defaults: Dict[str, Any] = {}
        self.problem: Optional[str] = None
        if not self.ok:
            self.problem = "its signature cannot be read (varargs or builtin)"
            return
        assert sig is not None
        self.params = tuple(sig.parameters)
        self.positional = tuple(n for n, p in sig.parameters.items()
                                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        self.defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not p.empty}
        self.canon_of: Dict[str, str] = {}
        if adapter.expand is not None:  # a fused op's layer method: expand maps its arguments
            if adapter.sequence is None:
                self.ok, self.problem = False, "the adapter expands a layer method but gives no kernel sequence"
            return
        canon_names = set(self.layout.tensors) | {n for n, _ in self.layout.scalars}
        mapped = {adapter.canonical(p) for p in self.params}
        required = [n for n in self.layout.tensors if n not in adapter.alloc] + [
            n for n, _ in self.layout.scalars if n not in adapter.derived]
        missing = [n for n in required if n not in mapped]
        if missing:
            self.ok = False
            self.problem = f"no parameter for ABI argument(s) {', '.join(missing)}"
        self.canon_of = {p: adapter.canonical(p) for p in self.params if adapter.canonical(p) in canon_names}

    def bind(self, args: Tuple[Any, ...], kwargs: Mapping[str, Any]):
        """-> (canonical dict, full argument dict) or (None, reason)."""
        if len(args) > len(self.positional):
            return None, "more positional arguments than the signature takes"
        vals = dict(zip(self.positional, args))
        extra: Optional[Dict[str, Any]] = {} if self.varkw is not None else None
        for k, v in kwargs.items():
            if extra is not None and k not in vals and (k not in self.params or k == self.varkw):
                extra[k] = v  # into the method's **kwargs
                continue
            if k in vals or k not in self.params:
                return None, f"unexpected argument {k!r}"
            vals[k] = v
        if extra is not None:
            vals[self.varkw] = extra
        if self.adapter.expand is not None:
            canon = self.adapter.expand({**self.defaults, **vals})
            return (None, canon) if isinstance(canon, str) else (canon, vals)  # a Served passes through
        canon: Dict[str, Any] = {}
        for p in self.params:
            if p in vals:
                v = vals[p]
            elif p in self.defaults:
                v = self.defaults[p]
            else:
                return None, f"missing argument {p!r}"
            c = self.canon_of.get(p)
            if c is not None:
                canon[c] = v
            elif p in self.adapter.ignorable:
                continue
            elif p in vals and not _same_default(v, self.defaults.get(p, _NO)):
                return None, f"argument {p}={_short(v)} is not the op's contract"
        return canon, vals

    def call_with(self, fn: Callable, vals: Mapping[str, Any], canon: Mapping[str, Any]):
        """Call `fn` with the original arguments, canonical ones replaced by `canon`'s (a fused op: SGLang's
        kernel sequence on `canon`, since the layer method reads its tensors from the module, not `canon`)."""
        if self.adapter.expand is not None:
            return self.adapter.sequence(canon)
        kw = dict(vals)
        for p, c in self.canon_of.items():
            if c in canon:
                kw[p] = canon[c]
        for p, make in self.adapter.bare_args.items():
            if p in self.params:
                kw[p] = make(canon)
        pos = []
        for p in self.positional:  # leading positional run; the rest go by keyword
            if p not in kw:
                break
            pos.append(kw.pop(p))
        ret = fn(*pos, **kw)
        if self.adapter.outputs_of is not None:  # returned outputs land in the canonical ones
            for n, t in self.adapter.outputs_of(ret).items():
                if canon.get(n) is not None and canon[n] is not t:
                    canon[n].copy_(t)
        return ret


class _No:
    pass


_NO = _No()


def _same_default(v: Any, d: Any) -> bool:
    if d is _NO:
        return False
    try:
        return v is d or bool(v == d)
    except Exception:
        return False


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."
