"""Where one SGLang step's GPU time goes, per op: analysis of captured traces (no GPU needed).

Input: a capture directory written by the step worker (`profile-meta.json` + one Chrome trace per
stage and batch size) or traces of a live server (`--url`). Output per capture: op, µs per step
(exclusive time, see e2e/trace.py for PDL), share of the step's kernel time, calls per step,
shapes, covered by astra or not, the shipped kernel's measured speedup on those shapes, and the
predicted step gain (Amdahl: saved = t_op * (1 - 1/speedup), gain = saved / step kernel time).
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from astra_sglang.figures import save_figure

from .attribution import SPLITK_REDUCE, Match, classify, lookup_dims, shape_hints, short_name
from .speedups import SpeedupTable
from .trace import KernelEvent, exclusive_times, load_trace

META = "profile-meta.json"
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16"}


@dataclass
class Capture:
    """One profiled region: `steps` repetitions of a stage at one batch size."""

    stage: str              # decode | prefill | server
    batch_size: int
    tokens: int             # tokens per step (decode: batch size; prefill: batch * input_len)
    steps: int
    trace: str              # file name, relative to the capture dir
    shapes_trace: Optional[str] = None   # an eager (no CUDA graph) step with record_shapes
    arm: str = "A"
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "Capture":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _fmt_dims(dims) -> str:
    parts = ["x".join(str(x) for x in d) for d in dims if isinstance(d, list) and d]
    return ", ".join(parts[:3])


# HF model types whose SGLang module has another name (Gemma-3's text model lives in gemma3_causal.py)
# model types whose decoder runs another model module's layers (MistralForCausalLM is a LlamaForCausalLM)
_MODEL_MODULES = {"gemma3_text": "gemma3_causal", "gemma3": "gemma3_causal", "mistral": "llama"}


def _site_of_model(target: str, model_type: str) -> bool:
    """Whether a replaced target can run in a model of `model_type`: a method of SGLang's model module
    sglang.srt.models.<m> runs in model type <m> only (HF's model_type names those modules: llama, qwen3,
    qwen3_moe; _MODEL_MODULES the others); anything else, or an unknown model type, may run anywhere."""
    module = target.split(":", 1)[0]
    if not model_type or not module.startswith("sglang.srt.models."):
        return True
    return module.rsplit(".", 1)[1] == _MODEL_MODULES.get(model_type, model_type)


def _fused_rows(rows: Sequence[dict], cfg: dict, tokens: int, tp: int, dtype: str,
                speedups: Optional[SpeedupTable], step_us: float) -> List[dict]:
    """The fused ops whose replaced kernels all ran in this capture (SGLang's, unpatched), as rows of their
    own: the members' time per step, the fused op's bench speedup over their sum, the saving. Kept apart from
    `ops`, whose rows the member kernels already fill; the step prediction swaps members for these. A call site
    in a model's own module (sglang.srt.models.llama:LlamaAttention.forward) counts only for that model type
    (config.json model_type); an op with several call sites (OpSpec.fuses) counts the first whose members all ran."""
    from astra_sglang.registry import get_op, op_names

    by_op = {r["op"]: r for r in rows}
    model_type = str((cfg or {}).get("model_type", ""))
    out = []
    for name in op_names():
        ran = [(ms, v) for target, ms, v in get_op(name).fused_sites() if _site_of_model(target, model_type)
               and all(m in by_op and not by_op[m]["astra_kernel"] for m in ms)]
        if not ran:
            continue
        members, variant = ran[0]
        if Q_COPY in by_op and name in q_out_ops():
            members = (*members, Q_COPY)   # fa3's q copy, which the q_out ops remove (their bench counts it)
        us = sum(by_op[m]["us_per_step"] for m in members)
        # the speedup over this site's production (its bench against that variant)
        sp = (speedups.lookup(name, lookup_dims(name, "", cfg, tokens, tp), dtype, variant=variant)
              if speedups else None)
        saved = us * (1.0 - 1.0 / sp.value) if sp else 0.0
        out.append({"op": name, "replaces": list(members), "us_per_step": us,
                    "speedup": sp.value if sp else None, "speedup_label": sp.label() if sp else "unmeasured",
                    "saved_us": saved, "predicted_gain": saved / step_us if step_us else 0.0})
    return out


def _is_router_gemm(dims, hidden: int, experts: int) -> bool:
    """Input Dims of a torch matmul that is the MoE router's logits GEMM: x [T, hidden] by the gate's weight, as
    aten::mm sees it ([hidden, experts], the transposed view) or aten::linear ([experts, hidden])."""
    try:
        x, w = list(dims[0]), list(dims[1])
    except (IndexError, TypeError):
        return False
    return len(x) >= 2 and x[-1] == hidden and w in ([hidden, experts], [experts, hidden])


def router_gemm_kernels(shape_kernels: Sequence[KernelEvent], cfg: dict, hidden_act: str = "silu",
                        gemma: bool = False) -> set:
    """Names of the GEMM kernels that, where the profiler recorded their launching op's shapes (an eager step),
    ran the MoE router's logits GEMM and nothing else: moe_gate's production (SGLang's gate runs as cuBLAS, whose
    kernel names every linear shares, so the name alone cannot tell). A CUDA-graph capture records no shapes; its
    kernels of these names are taken as the same GEMM."""
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    hidden = int(cfg.get("hidden_size") or 0)
    if not experts or not hidden:
        return set()
    seen: Dict[str, set] = defaultdict(set)
    for k in shape_kernels:
        if k.shapes and classify(k.name, hidden_act, gemma=gemma).op == "gemm":
            seen[k.name].add(_is_router_gemm(k.shapes, hidden, experts))
    return {n for n, v in seen.items() if v == {True}}


def _projection_dims(dims) -> Optional[Tuple[int, int, int]]:
    """(tokens, in_features, out_features) of a torch matmul's input Dims: x [..., K] by a weight [K, N] as aten::mm
    sees it or [N, K] for aten::linear, no third input (a bias); None for anything else."""
    try:
        if len(dims) != 2:   # a bias (aten::addmm / linear with 3 inputs) or another op
            return None
        x, w = [int(v) for v in dims[0]], [int(v) for v in dims[1]]
    except (IndexError, TypeError, ValueError):
        return None
    if len(x) < 2 or len(w) != 2 or x[-1] not in w:
        return None
    k = x[-1]
    tokens = 1
    for v in x[:-1]:
        tokens *= v
    return tokens, k, (w[1] if w[0] == k else w[0])


def _is_projection_gemm(dims, cfg: dict, bounds: Optional[Tuple[int, int]] = None) -> bool:
    """Input Dims of a torch matmul that linear's adapter would take: a shape its `declined` rule keeps (tokens,
    in_features, out_features; `bounds` as `linear_bounds` gives them), no bias, and neither the lm_head (N the
    vocabulary: SGLang's embedding method, not the linear's) nor the MoE router's GEMM (moe_gate's)."""
    from astra_sglang.kernels.linear.adapter import declined

    d = _projection_dims(dims)
    if d is None:
        return False
    tokens, k, n = d
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if experts and _is_router_gemm(dims, int(cfg.get("hidden_size") or 0), experts):
        return False
    return tokens > 0 and declined(tokens, k, n, bounds) is None and n not in _lm_head_widths(cfg)


def _per_rank(n: int) -> set:
    """n split over each tensor-parallel degree that divides it (one rank's share of a width or a head count)."""
    return {n // tp for tp in (1, 2, 4, 8, 16) if n and n % tp == 0}


def _lm_head_widths(cfg: dict) -> set:
    """N of the lm_head's GEMM on one rank: the vocabulary, padded to a multiple of 64 (SGLang's vocab padding) and
    split over tensor-parallel ranks (Gemma-2-9B at TP 2: 128000 per rank)."""
    vocab = int(cfg.get("vocab_size") or 0)
    return {vocab} | _per_rank(-(-vocab // 64) * 64)


def projection_gemm_kernels(shape_kernels: Sequence[KernelEvent], cfg: dict, hidden_act: str = "silu",
                            gemma: bool = False, bounds: Optional[Tuple[int, int]] = None) -> set:
    """Names of the GEMM kernels that, in the eager step, ran the dense projections linear takes and nothing else
    (`_is_projection_gemm`): linear's production. A name cuBLAS also used for another GEMM (the lm_head, often)
    stays a gemm: its graph calls cannot be told apart."""
    seen: Dict[str, set] = defaultdict(set)
    for k in shape_kernels:
        if k.shapes and classify(k.name, hidden_act, gemma=gemma).op == "gemm":
            seen[k.name].add(_is_projection_gemm(k.shapes, cfg, bounds))
    return {n for n, v in seen.items() if v == {True}}


def op_classifier(cfg: dict, shape_kernels: Sequence[KernelEvent] = (),
                  bounds: Optional[Tuple[int, int]] = None) -> Callable[[str], Match]:
    """kernel name -> Match for this model: attribution.classify with its activation and Gemma's norms, and the GEMM
    kernels `router_gemm_kernels` / `projection_gemm_kernels` (linear's shape rule with `bounds`) find in
    `shape_kernels` as moe_gate / linear (the profile and the neighbours table agree)."""
    # Gemma-3 configs (transformers 5) name it hidden_activation only; Gemma-2 carries both
    hidden_act = str(cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu")
    gemma = str(cfg.get("model_type", "")).startswith("gemma")   # FlashInfer's norm kernels are the gemma ops
    router = router_gemm_kernels(shape_kernels, cfg, hidden_act, gemma)
    projections = projection_gemm_kernels(shape_kernels, cfg, hidden_act, gemma, bounds) - router

    def match(name: str) -> Match:
        if name in router:   # SGLang's gate GEMM: the op moe_gate replaces
            return Match("moe_gate", "op", True, False)
        if name in projections:   # SGLang's decode-sized projections: the op linear replaces
            return Match("linear", "op", True, False)
        return classify(name, hidden_act, gemma=gemma)

    return match


# model types whose SGLang attention runs the q/k norm + rope as plain torch ops (Gemma3Attention.forward_native:
# Gemma3RMSNorm.forward_native on q and k, then the torch.compile'd apply_rotary_pos_emb), and the fused op that
# replaces that sequence
TORCH_QK_PATHS = {"gemma3": "gemma_qknorm_rope", "gemma3_text": "gemma_qknorm_rope"}
# what torch's own kernels classify as by name (elementwise, copies, the norm's mean, other reductions) ...
_TORCH_KERNEL_OPS = ("torch elementwise/copy", "torch mean", "sampling/logits")
# ... and inductor's, the compiled rope's (triton_poi_fused_add_cat_mul_neg_...)
_INDUCTOR = re.compile(r"^triton_(poi|per|red)_fused")
# the kernels that open a layer's attention: its KV store or the attention itself
_ATTENTION_INPUT = ("kv_store", "rope+kv_store", "attention")


def _is_torch_kernel(name: str, m: Match) -> bool:
    return not m.astra and (m.op in _TORCH_KERNEL_OPS or (m.op.startswith("other: ") and bool(_INDUCTOR.match(name))))


def _is_gemm_call(m: Match) -> bool:
    """A projection's kernel (the qkv GEMM): cuBLAS's (split-K reduce included), linear's, a fused norm + linear's."""
    return m.category == "gemm" or m.op in ("linear", "add_rmsnorm_linear")


def qk_path_runs(kernels: Sequence[KernelEvent], match: Callable[[str], Match], op: str) -> List[List[KernelEvent]]:
    """The runs of a layer's q/k norm + rope on each stream, in launch order: the kernels between the qkv GEMM and the
    attention's first kernel (its KV store or attention), where every one of them is a torch kernel (elementwise,
    copy, mean, inductor's) or `op`'s own (a patched arm: its kernel and any copy around it). A run must start right
    after a GEMM and end right before the attention input: so the embedding's scale, the step's cos/sin and positions
    (before the first layer's norm), the sampling (after the lm_head) and the MLP never fall in one."""
    by_stream: Dict[Tuple[int, int], List[KernelEvent]] = defaultdict(list)
    for k in kernels:
        by_stream[(k.device, k.stream)].append(k)
    runs: List[List[KernelEvent]] = []
    for ks in by_stream.values():
        ks = sorted(ks, key=lambda e: e.ts)
        ms = [match(k.name) for k in ks]
        start = None   # index of the run's first kernel, right after a GEMM
        for i, (k, m) in enumerate(zip(ks, ms)):
            if m.op == op or _is_torch_kernel(k.name, m):
                if start is None and i and _is_gemm_call(ms[i - 1]):
                    start = i
                continue
            if start is not None and (m.op in _ATTENTION_INPUT or m.category == "attention"):
                runs.append(ks[start:i])
            start = None
    return runs


def _heads_of(cfg: dict) -> set:
    """q and kv head counts of a config on one rank, at each tensor-parallel degree that divides them."""
    return _per_rank(int(cfg.get("num_attention_heads") or 0)) | _per_rank(int(cfg.get("num_key_value_heads") or 0))


def _qk_shaped(dims, head_dim: int, heads: set) -> bool:
    """Whether a torch op's input Dims hold a q/k view ([1, heads, tokens, head_dim] in 0.5.17, its [.., 1] mean, the
    [1, tokens, heads, head_dim] permute; [tokens, heads, head_dim] in 0.5.23) or a [head_dim] norm weight."""
    for d in dims or ():
        if not isinstance(d, list) or not d or not all(isinstance(x, int) for x in d):
            continue
        if d == [head_dim] or (len(d) == 3 and d[1] in heads and d[2] in (head_dim, 1)):
            return True
        if len(d) == 4 and d[0] == 1 and (d[1] in heads or d[2] in heads) and d[3] in (head_dim, 1):
            return True
    return False


def qk_path_confirmed(shape_kernels: Sequence[KernelEvent], cfg: dict, match: Callable[[str], Match],
                      op: str) -> bool:
    """Whether the eager step agrees with `qk_path_runs`: every kernel of its runs whose launching op's shapes were
    recorded ran on q/k (`_qk_shaped`), but `op`'s own (its name says it). A trace without shapes (a live server's)
    cannot disagree."""
    from astra_sglang.families.qkv import heads_of_config

    head_dim = (heads_of_config(cfg) or (0, 0, 0))[2]   # as the op's dims read it (gemma_qknorm_rope's spec)
    heads = _heads_of(cfg)
    return all(_qk_shaped(k.shapes, head_dim, heads) for run in qk_path_runs(shape_kernels, match, op)
               for k in run if k.shapes and match(k.name).op != op)


# SGLang 0.5.17's fa3 backend calls q.contiguous() before it attends. Where the rope left q a column view of qkv's
# output (SGLang's own ops, and astra's fused rope ops with q in place) that is one torch copy a layer from 2 tokens
# on. The ops that write q into their own buffer (q_out) remove it, and their bench counts it in production's time from
# 2 tokens on (their launchers' copy stands for it); so the profile shows it as its own row and counts it in their
# fused rows. Its kernel's name is every torch copy's: its place (right after the layer's rope / KV store, right before
# its attention) and the eager step's shapes (a [tokens, q heads x head_dim] or [tokens, q heads, head_dim] q) tell it
# apart. Gemma-3's lies inside its torch q/k path (TORCH_QK_PATHS), which already counts it.
Q_COPY = "attention q copy"
# what runs right before the copy: the layer's rope, q/k norm or KV store (SGLang's), or a q_out op's kernel with q
# in place (astra's, `q_out_ops`)
_BEFORE_Q_COPY = ("rope", "rope+kv_store", "kv_store", "qknorm", "qknorm+rope", "rope_store")


@lru_cache(maxsize=1)
def q_out_ops() -> frozenset:
    """The registered ops that write q into their own buffer (a q_out pointer in their ABI): they remove fa3's
    q copy."""
    from astra_sglang.registry import get_op, op_names

    return frozenset(n for n in op_names() if any(a.name == "q_out" for a in get_op(n).abi))


def q_copy_kernels(kernels: Sequence[KernelEvent], match: Callable[[str], Match]) -> List[KernelEvent]:
    """The attention's q copies among `kernels`: on each stream, a torch copy kernel right after a rope / q/k norm /
    KV-store kernel and right before an attention kernel."""
    by_stream: Dict[Tuple[int, int], List[KernelEvent]] = defaultdict(list)
    for k in kernels:
        by_stream[(k.device, k.stream)].append(k)
    out: List[KernelEvent] = []
    for ks in by_stream.values():
        ks = sorted(ks, key=lambda e: e.ts)
        ms = [match(k.name) for k in ks]
        for i in range(1, len(ks) - 1):
            if (ms[i].op == "torch elementwise/copy" and not ms[i].astra and ms[i + 1].category == "attention"
                    and (ms[i - 1].op in _BEFORE_Q_COPY or ms[i - 1].op in q_out_ops())):
                out.append(ks[i])
    return out


def _q_shaped(dims, cfg: dict) -> bool:
    """Whether a torch copy's Input Dims are a q: [tokens, q heads x head_dim] or [tokens, q heads, head_dim], the q
    heads on one rank at any tensor-parallel degree."""
    from astra_sglang.families.qkv import heads_of_config

    hq, _, d = heads_of_config(cfg) or (0, 0, 0)
    heads = _per_rank(int(hq))
    x = dims[0] if dims and isinstance(dims[0], list) else None
    if not x or not all(isinstance(v, int) for v in x):
        return False
    return (len(x) == 2 and x[1] in {h * d for h in heads}) or (len(x) == 3 and x[1] in heads and x[2] == d)


def q_copy_confirmed(shape_kernels: Sequence[KernelEvent], cfg: dict, match: Callable[[str], Match]) -> bool:
    """Whether the eager step agrees with `q_copy_kernels`: every one whose launching op's shapes were recorded copied
    a q (`_q_shaped`). A trace without shapes (a live server's) cannot disagree."""
    return all(_q_shaped(k.shapes, cfg) for k in q_copy_kernels(shape_kernels, match) if k.shapes)


def attributors(cfg: dict, traces: Sequence[Sequence[KernelEvent]], shape_traces: Sequence[Sequence[KernelEvent]],
                bounds: Optional[Tuple[int, int]] = None) -> Tuple[Callable[[str], Match], Callable[[KernelEvent], Match]]:
    """(name -> Match, event -> Match) for kernels of `traces`, with the eager `shape_traces` (also among `traces`
    where they are attributed too) telling the model's GEMMs and torch q/k path apart: op_classifier over every shape
    trace's kernels, then kernel_matcher, as the profile, the neighbours table and the trace fixture all wire them."""
    match = op_classifier(cfg, [k for ks in shape_traces for k in ks], bounds)
    return match, kernel_matcher(cfg, match, traces, shape_traces)


def kernel_matcher(cfg: dict, match: Callable[[str], Match], traces: Sequence[Sequence[KernelEvent]],
                   shape_traces: Sequence[Sequence[KernelEvent]] = ()) -> Callable[[KernelEvent], Match]:
    """kernel event -> Match: `match` by name, except, in a model whose q/k norm + rope SGLang runs as torch ops
    (TORCH_QK_PATHS), the kernels of `qk_path_runs` in `traces`: the fused op's production (covered, SGLang's), or its
    own kernel; and elsewhere the attention's q copies (`q_copy_kernels`): the Q_COPY row. torch's kernel names are
    shared with every other torch op, so only their place in the layer tells them apart; the graph trace records no
    shapes, so its runs are found by place alone, and the eager step's shapes (each of `shape_traces`) must confirm each
    rule (qk_path_confirmed, q_copy_confirmed) or it moves nothing."""
    op = TORCH_QK_PATHS.get(str(cfg.get("model_type", "")))
    path: set = set()
    if op and all(qk_path_confirmed(ks, cfg, match, op) for ks in shape_traces):
        path = {id(k) for ks in traces for run in qk_path_runs(ks, match, op) for k in run}
    copies: set = set()
    if not op and cfg and all(q_copy_confirmed(ks, cfg, match) for ks in shape_traces):
        copies = {id(k) for ks in traces for k in q_copy_kernels(ks, match)}
    if not path and not copies:
        return lambda k: match(k.name)
    production = Match(op, "op", True, False) if op else None
    q_copy = Match(Q_COPY, "op", False, False)

    def of(k: KernelEvent) -> Match:
        m = match(k.name)
        if id(k) in path and m.op != op:
            return production
        return q_copy if id(k) in copies else m

    return of


def _linear_saved(per_kernel: Dict[Tuple[str, str], dict], linear_dims: Dict[str, set],
                  speedups: Optional[SpeedupTable], dtype: str, steps: int):
    """-> (µs per step saved over SGLang's projection kernels, bench sources) or (None, ()) where no kernel name has a
    measured speedup. A name with no speedup for one of its shapes saves nothing."""
    saved, srcs, found = 0.0, set(), False
    for pk in per_kernel.values():
        shapes = linear_dims.get(pk["name"])
        if pk["op"] != "linear" or not shapes or not speedups:
            continue
        sps = [speedups.lookup("linear", d, dtype) for d in sorted(shapes)]
        if any(sp is None for sp in sps):
            continue
        found = True
        low = min(sps, key=lambda sp: sp.value)
        saved += pk["excl"] / steps * (1.0 - 1.0 / low.value)
        srcs.add(low.source)
    return (saved, srcs) if found else (None, ())



def analyze_capture(kernels: Sequence[KernelEvent], cap: Capture, cfg: dict, speedups: Optional[SpeedupTable],
                    shape_kernels: Sequence[KernelEvent] = (), tp: int = 1,
                    bounds: Optional[Tuple[int, int]] = None) -> dict:
    dtype = TORCH_DTYPES.get(str(cfg.get("torch_dtype", "bfloat16")), "bf16")
    total = exclusive_times(kernels)
    steps = max(cap.steps, 1)
    hints = shape_hints(cfg, cap.tokens, tp) if cfg and cap.tokens else {}   # a server capture: tokens unknown
    # by event: Gemma-3's torch q/k path is told apart by its place in the layer, not by its kernels' names
    match, of = attributors(cfg, (kernels, shape_kernels), (shape_kernels,), bounds)
    seen_shapes: Dict[str, set] = defaultdict(set)
    linear_dims: Dict[str, set] = defaultdict(set)   # kernel name -> the projections it ran (eager step)
    for k in shape_kernels:
        if k.shapes:
            m = of(k)
            s = _fmt_dims(k.shapes)
            if s:
                seen_shapes[m.op].add(f"{s} ({k.torch_op})" if k.torch_op else s)
            if m.op == "linear" and not m.astra:
                d = _projection_dims(k.shapes)
                if d:
                    linear_dims[k.name].add(d)
    ops: Dict[str, dict] = {}
    per_kernel: Dict[Tuple[str, str], dict] = {}
    last_on_stream: Dict[Tuple[int, int], Tuple[str, Match]] = {}   # (device, stream) -> its previous kernel
    for k in sorted(kernels, key=lambda e: e.ts):
        m = of(k)
        prev = last_on_stream.get((k.device, k.stream))
        last_on_stream[(k.device, k.stream)] = (k.name, m)
        if prev and SPLITK_REDUCE.search(k.name) and prev[1].op in ("linear", "moe_gate") and not prev[1].astra:
            # cuBLAS's split-K reduction of the projection GEMM just before it: part of that F.linear (the bench's
            # installed baseline times both), so it counts as that op's, with that GEMM's name and call
            pk = per_kernel[(prev[0], prev[1].op)]
            pk["excl"] += k.excl
            o = ops[prev[1].op]
            o["excl"] += k.excl
            o["raw"] += k.dur
            o["kernels"].add(short_name(k.name, 50))
            last_on_stream[(k.device, k.stream)] = prev
            continue
        o = ops.setdefault(m.op, {"op": m.op, "category": m.category, "covered": m.covered, "astra": False,
                                  "excl": 0.0, "raw": 0.0, "calls": 0, "kernels": set()})
        o["excl"] += k.excl
        o["raw"] += k.dur
        o["calls"] += 1
        o["astra"] = o["astra"] or m.astra
        o["kernels"].add(short_name(k.name, 50))
        # by name and op: a torch kernel name runs in Gemma-3's q/k path and elsewhere
        pk = per_kernel.setdefault((k.name, m.op), {"name": k.name, "kernel": short_name(k.name, 80), "op": m.op,
                                                    "excl": 0.0, "calls": 0})
        pk["excl"] += k.excl
        pk["calls"] += 1
    rows = []
    saved_total = 0.0
    for o in ops.values():
        us = o["excl"] / steps
        hint = hints.get(o["op"], "")
        profiled = sorted(seen_shapes.get(o["op"], ()))
        row = {
            "op": o["op"], "category": o["category"], "covered": o["covered"], "astra_kernel": o["astra"],
            "us_per_step": us, "raw_us_per_step": o["raw"] / steps,
            "share": (o["excl"] / total) if total else 0.0,
            "calls_per_step": o["calls"] / steps, "us_per_call": o["excl"] / max(o["calls"], 1),
            "shapes": profiled or ([hint] if hint else []),
            "shape_source": "profiler" if profiled else ("config" if hint else ""),
            "kernels": sorted(o["kernels"])[:4],
            "speedup": None, "speedup_label": "", "speedup_source": None, "predicted_gain": 0.0, "saved_us": 0.0,
            "attainable": None, "attainable_saved_us": 0.0,
        }
        if o["covered"] and o["op"] == "linear" and linear_dims and not o["astra"]:
            # several projections a step: each kernel name's time at its own shapes' speedup (the lowest where it
            # ran several), not one lookup for the op
            saved, srcs = _linear_saved(per_kernel, linear_dims, speedups, dtype, steps)
            if saved is None:
                row["speedup_label"] = "unmeasured"
            else:
                row.update(speedup=us / (us - saved) if us > saved else None, speedup_label="per projection",
                           speedup_source=", ".join(sorted(srcs)), saved_us=saved,
                           predicted_gain=saved / (total / steps) if total else 0.0)
                saved_total += saved
        elif o["covered"] and o["astra"]:  # nothing left to predict, with or without a record of its shapes
            row["speedup_label"] = "patched (astra kernel ran)"
        elif o["covered"]:
            dims = lookup_dims(o["op"], hint, cfg, cap.tokens, tp)
            sp = speedups.lookup(o["op"], dims, dtype) if speedups else None
            if sp is None:
                row["speedup_label"] = "unmeasured"
            else:
                saved = us * (1.0 - 1.0 / sp.value)
                row.update(speedup=sp.value, speedup_label=sp.label(), speedup_source=sp.source, saved_us=saved,
                           predicted_gain=saved / (total / steps) if total else 0.0)
                saved_total += saved
                if sp.attainable:  # the in-context floor's bound: what any standalone kernel could save at most
                    row.update(attainable=sp.attainable, attainable_saved_us=us * (1.0 - 1.0 / sp.attainable))
        rows.append(row)
    rows.sort(key=lambda r: -r["us_per_step"])
    fused = _fused_rows(rows, cfg, cap.tokens, tp, dtype, speedups, total / steps)
    cats: Dict[str, float] = defaultdict(float)
    for r in rows:
        cats[r["category"]] += r["us_per_step"]
    top = sorted(per_kernel.values(), key=lambda r: -r["excl"])[:25]
    step_us = total / steps
    return {
        "stage": cap.stage, "batch_size": cap.batch_size, "tokens": cap.tokens, "steps": cap.steps, "arm": cap.arm,
        "kernel_us_per_step": step_us,
        "raw_us_per_step": sum(k.dur for k in kernels) / steps,
        "n_kernels_per_step": len(kernels) / steps,
        "categories": {c: {"us_per_step": v, "share": v / step_us if step_us else 0.0} for c, v in sorted(cats.items())},
        "covered_share": sum(r["share"] for r in rows if r["covered"]),
        "small_op_share": sum(r["share"] for r in rows if r["category"] == "op"),
        "predicted_saved_us": saved_total,
        "predicted_gain": saved_total / step_us if step_us else 0.0,
        # over the ops whose bench timed the in-context floor: what they save now, and the most any kernel could
        "bounded_ops": [r["op"] for r in rows if r["attainable"]],
        "bounded_saved_us": sum(r["saved_us"] for r in rows if r["attainable"]),
        "attainable_saved_us": sum(r["attainable_saved_us"] for r in rows),
        "ops": rows,
        "fused": fused,
        "top_kernels": [{"kernel": t["kernel"], "op": t["op"], "us_per_step": t["excl"] / steps,
                         "calls_per_step": t["calls"] / steps} for t in top],
        "extra": cap.extra,
    }


def analyze_dir(directory: Path, speedups: Optional[SpeedupTable] = None) -> dict:
    """Every capture listed in DIR/profile-meta.json, analyzed."""
    directory = Path(directory)
    meta = json.loads((directory / META).read_text())
    cfg = meta.get("config") or {}
    tp = int(meta.get("tp", 1))
    bounds = linear_bounds(meta)
    out = {"meta": {k: v for k, v in meta.items() if k not in ("captures", "config")}, "captures": []}
    for c in meta.get("captures", []):
        cap = Capture.from_dict(c)
        if not (directory / cap.trace).is_file():
            out["meta"].setdefault("missing traces", []).append(cap.trace)   # pruned records: skip
            continue
        tr = load_trace(directory / cap.trace)
        shape_k = load_trace(directory / cap.shapes_trace).kernels if cap.shapes_trace and \
            (directory / cap.shapes_trace).is_file() else tr.kernels   # an eager trace carries its own shapes
        out["captures"].append(analyze_capture(tr.kernels, cap, cfg, speedups, shape_k, tp, bounds))
    return out


def linear_bounds(meta: dict) -> Optional[Tuple[int, int]]:
    """The widest of linear's shape rules the arms ran with (profile-meta's "arm_env": a step A/B's --arm-env, e.g.
    B:ASTRA_LINEAR_MAX_IN_FEATURES=21504), or None where no arm moved them. Every arm's GEMMs are attributed with
    it, so a projection one arm's linear takes is linear's row (its cuBLAS production) in the other arms too, and the
    in-graph prediction compares the same calls (with each arm's own rule it read +19.6% for a -5.95% step,
    2026-11-30)."""
    envs = [e for e in (meta.get("arm_env") or {}).values() if e]
    if not envs:
        return None
    from astra_sglang.kernels.linear.adapter import bounds_with

    rules = [bounds_with({})] + [bounds_with(e) for e in envs]
    return max(r[0] for r in rules), max(r[1] for r in rules)


# ----------------------------------------------------------------------------- shapes corpus

def shapes_corpus(analysis: dict, cfg: dict, model: str) -> dict:
    """The covered ops' shapes of every capture, as a `--shapes FILE` corpus (astra_sglang.spec)."""
    dtype = TORCH_DTYPES.get(str(cfg.get("torch_dtype", "bfloat16")), "bf16")
    ops: Dict[str, Dict[tuple, dict]] = defaultdict(dict)
    for c in analysis["captures"]:
        hints = shape_hints(cfg, c["tokens"], int(analysis["meta"].get("tp", 1))) if cfg and c["tokens"] else {}
        for r in c["ops"]:
            if not r["covered"]:
                continue
            dims = lookup_dims(r["op"], hints.get(r["op"], ""), cfg, c["tokens"],
                               int(analysis["meta"].get("tp", 1)))
            if dims is None:
                continue
            e = ops[r["op"]].setdefault(dims, {"dims": list(dims), "dtype": dtype, "count": 0, "tags": [],
                                               "source": f"{model} profile"})
            e["count"] += int(round(r["calls_per_step"] * max(c["steps"], 1)))
            if c["stage"] not in e["tags"]:
                e["tags"].append(c["stage"])
    return {"format": "astra-shapes/1", "source": f"astra-sglang profile ({model})",
            "ops": {op: list(v.values()) for op, v in sorted(ops.items())}}


# ----------------------------------------------------------------------------- report

def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def capture_table(c: dict, max_rows: int = 18) -> str:
    head = (f"### {c['stage']}, batch {c['batch_size']} ({c['tokens']} tokens/step, arm {c['arm']}): "
            f"{c['kernel_us_per_step']:.0f} µs of kernels per step "
            f"({c['n_kernels_per_step']:.0f} kernels; profiled durations sum to {c['raw_us_per_step']:.0f} µs)\n\n")
    cats = ", ".join(f"{k} {_pct(v['share'])}" for k, v in sorted(c["categories"].items(), key=lambda kv: -kv[1]["share"]))
    head += (f"{cats}; small ops {_pct(c['small_op_share'])}, covered by astra {_pct(c['covered_share'])}; "
             f"predicted step gain from the shipped kernels {_pct(c['predicted_gain'])} "
             f"({c['predicted_saved_us']:.1f} µs)\n\n")
    if c.get("bounded_ops"):  # where the prize is: the in-context floor bounds what a standalone kernel can save
        step = c["kernel_us_per_step"]
        head += (f"{', '.join(c['bounded_ops'])}: the shipped kernels save {c['bounded_saved_us']:.1f} µs "
                 f"({_pct(c['bounded_saved_us'] / step if step else 0.0)}); any standalone kernel could save at most "
                 f"{c['attainable_saved_us']:.1f} µs ({_pct(c['attainable_saved_us'] / step if step else 0.0)}), "
                 "by the in-context floor their benches timed\n\n")
    lines = ["| op | µs/step | share | calls/step | µs/call | shapes | astra | speedup | predicted gain |",
             "|---|---:|---:|---:|---:|---|---|---|---:|"]
    rows = c["ops"]
    shown = rows[:max_rows]
    for r in shown:
        cov = ("yes (astra ran)" if r["astra_kernel"] else "yes") if r["covered"] else "no"
        shapes = "; ".join(r["shapes"][:2]) + (f" [{r['shape_source']}]" if r["shape_source"] else "")
        gain = _pct(r["predicted_gain"]) if r["speedup"] else ""
        lines.append(f"| {r['op']} | {r['us_per_step']:.1f} | {_pct(r['share'])} | {r['calls_per_step']:.1f} | "
                     f"{r['us_per_call']:.2f} | {shapes} | {cov} | {r['speedup_label']} | {gain} |")
    rest = rows[max_rows:]
    if rest:
        lines.append(f"| ({len(rest)} more) | {sum(r['us_per_step'] for r in rest):.1f} | "
                     f"{_pct(sum(r['share'] for r in rest))} | | | | | | |")
    for f in c.get("fused", ()):   # fused ops: their members' kernels above, one launch when patched
        gain = f", predicted gain {_pct(f['predicted_gain'])}" if f["speedup"] else ""
        lines.append(f"\nFused op {f['op']} would replace {' + '.join(f['replaces'])}: {f['us_per_step']:.1f} µs/step "
                     f"here, speedup {f['speedup_label']}{gain} (not in the total above, which counts its members).")
    return head + "\n".join(lines) + "\n"


def report_markdown(analysis: dict, title: str = "astra-sglang profile") -> str:
    meta = analysis.get("meta", {})
    out = [f"# {title}\n"]
    for k, v in meta.items():
        if isinstance(v, (str, int, float)):
            out.append(f"- {k}: {v}")
    out.append("")
    out.append(summary_table(analysis))
    for c in analysis["captures"]:
        out.append(capture_table(c))
    out.append(PDL_NOTE)
    return "\n".join(out)


PDL_NOTE = ("Times are exclusive: with programmatic dependent launch a kernel can start before its "
            "producer ends and wait inside it, so each kernel is clipped to start where the previous "
            "work on its stream ended (the overlap stays with the producer); the profiled durations "
            "are summed in the header for comparison.\n")


def summary_table(analysis: dict) -> str:
    lines = ["| stage | batch | kernel µs/step | GEMM | attention | TP communication | small ops | covered | "
             "predicted gain |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in analysis["captures"]:
        cat = c["categories"]
        lines.append(f"| {c['stage']} ({c['arm']}) | {c['batch_size']} | {c['kernel_us_per_step']:.0f} | "
                     f"{_pct(cat.get('gemm', {}).get('share', 0))} | {_pct(cat.get('attention', {}).get('share', 0))} | "
                     f"{_pct(cat.get('communication', {}).get('share', 0))} | "
                     f"{_pct(c['small_op_share'])} | {_pct(c['covered_share'])} | {_pct(c['predicted_gain'])} |")
    return "\n".join(lines) + "\n"


def plot(analysis: dict, path: str, stage: str = "decode", top_ops: int = 8) -> Optional[str]:
    """Stacked bars per batch size: GEMM, attention, the largest small ops, the rest."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    caps = [c for c in analysis["captures"] if c["stage"] == stage]
    if not caps:
        return None
    small: Dict[str, float] = defaultdict(float)
    for c in caps:
        for r in c["ops"]:
            if r["category"] == "op":
                small[r["op"]] += r["share"]
    named = [op for op, _ in sorted(small.items(), key=lambda kv: -kv[1])[:top_ops]]
    segs = ["gemm", "attention", "communication"] + named + ["other small ops", "other"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    labels = [f"{c['batch_size']} ({c['arm']})" if len({x['arm'] for x in caps}) > 1 else str(c["batch_size"])
              for c in caps]
    cmap = plt.get_cmap("tab20")
    for ax, key in zip(axes, ("us_per_step", "share")):
        bottom = [0.0] * len(caps)
        for i, seg in enumerate(segs):
            vals = []
            for c in caps:
                if seg in ("gemm", "attention", "communication", "other"):
                    v = sum(r[key] for r in c["ops"] if r["category"] == seg)
                elif seg == "other small ops":
                    v = sum(r[key] for r in c["ops"] if r["category"] == "op" and r["op"] not in named)
                else:
                    v = sum(r[key] for r in c["ops"] if r["op"] == seg)
                vals.append(100 * v if key == "share" else v)
            hatch = "//" if seg in named and any(r["covered"] for c in caps for r in c["ops"] if r["op"] == seg) else None
            ax.bar(labels, vals, bottom=bottom, label=seg, color=cmap(i % 20), hatch=hatch, edgecolor="white")
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xlabel("batch size")
        ax.set_ylabel("µs per step (exclusive kernel time)" if key == "us_per_step" else "% of step kernel time")
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), title="hatched: astra covers")
    fig.suptitle(f"{analysis.get('meta', {}).get('model', '')} {stage} step")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def write_outputs(analysis: dict, out: Path, cfg: dict, model: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(analysis, indent=1))
    md = report_markdown(analysis)
    for stage in ("decode", "prefill", "server"):
        png = plot(analysis, str(out / f"profile-{stage}.png"), stage)
        if png:
            md += f"\n![{stage}]({Path(png).name})\n"
    (out / "profile.md").write_text(md)
    if cfg:
        (out / "shapes.json").write_text(json.dumps(shapes_corpus(analysis, cfg, model), indent=1))
    return md
