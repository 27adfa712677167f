"""Where serving runs an op: the GEMM pairs around it in a model's decode step. bench times a decode row between each
pair and takes the mean; an op without sites keeps bench's generic pair (inner size 4096 in, width 4096 out).

Why: the generic pair misjudged the launch a norm needs. In the Llama-3-8B decode graph at 64 tokens (H200,
2026-11-28, results/2026-11-28-h200/session17), fused_add_rmsnorm runs after o_proj, before gate_up, and after the
split-K down_proj (cuBLAS nvjet splitK + splitKreduce_kernel, which releases dependents early), before the next
layer's qkv. A plain launch gained nothing behind o_proj and lost 0.6 us behind down_proj, where bench's generic pair
had it 0.5 us ahead. Between the graph's own two pairs, bench agreed with the graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

from .models import ALL_MODELS, ModelConfig, model


@dataclass(frozen=True)
class Site:
    """One place the op runs: `producer_k` is the inner size of the GEMM that writes its input, `consumer_width` the
    output width of the GEMM that reads its output. `norm_after`: serving runs astra's residual norm (PDL) on the
    op's output before that GEMM, as after a MoE combine; bench puts astra's rmsnorm there (the same PDL wait and
    early start, out of place, so the timed output can still be checked). `norm_before`: a norm runs between the
    producer GEMM and the op (Gemma's second norm of a pair); bench puts astra's rmsnorm there too. Both: one on each
    side (rope between Qwen3's q/k norm and the KV store)."""

    name: str
    producer_k: int
    consumer_width: int
    norm_after: bool = False
    norm_before: bool = False

    def as_dict(self) -> dict:
        d = {"site": self.name, "producer_k": self.producer_k, "consumer_width": self.consumer_width}
        return {**d, **{k: True for k in ("norm_after", "norm_before") if getattr(self, k)}}


def first_dense(hidden: int, norm: str) -> ModelConfig:
    """The first dense model (MODELS, then MORE_MODELS) of that hidden size and norm; KeyError if none."""
    for m in ALL_MODELS:
        if m.hidden == hidden and m.norm == norm and m.dense:
            return m
    raise KeyError(f"no dense {norm} model of hidden size {hidden}")


def _qkv_width(m: ModelConfig, tp: int) -> int:
    """The qkv projection's output width per rank (dense attention: q heads, k and v heads)."""
    return (m.num_heads + 2 * m.num_kv_heads) * m.head_dim // tp


def _at(tp: int) -> str:
    """A site name's TP suffix."""
    return f" (TP {tp})" if tp > 1 else ""


def residual_norm_sites(hidden: int, norm: str = "rms") -> Tuple[Site, ...]:
    """A dense decoder layer runs its residual-add norm twice: after o_proj, before gate_up, and after down_proj,
    before the next layer's qkv. The pairs of the first dense model of that hidden size, sharded by the smallest TP
    it is served with (the norm itself is not); () where no dense model has it (a MoE layer's norm sits beside the
    router and the experts, not between two GEMMs)."""
    try:
        m = first_dense(hidden, norm)
    except KeyError:
        return ()
    tp = min(m.tp)
    attn = m.num_heads * m.head_dim // tp
    qkv = _qkv_width(m, tp)
    inter = m.intermediate // tp
    at = _at(tp)
    return (Site(f"{m.name}{at} o_proj -> gate_up", attn, 2 * inter),
            Site(f"{m.name}{at} down_proj -> qkv", inter, qkv))


def mlp_activation_sites(width: int, act: str) -> Tuple[Site, ...]:
    """A dense MLP's activation runs between gate_up (inner size hidden, writing 2 x width) and down_proj (width in,
    hidden out), each sharded by TP: the pair of the dense model running `act` whose intermediate / TP is `width`, the
    least TP first, then the model list's order; () where none (a MoE expert's activation sits between grouped
    expert GEMMs, not cuBLAS ones)."""
    found = [(tp, i, m) for i, m in enumerate(ALL_MODELS) if m.act == act and m.dense
             for tp in m.tp if m.intermediate // tp == width]
    if not found:
        return ()
    tp, _, m = min(found, key=lambda f: f[:2])
    return (Site(f"{m.name}{_at(tp)} gate_up -> down_proj", m.hidden, m.hidden),)


def moe_output_sites(model_name: str) -> Tuple[Site, ...]:
    """Where a MoE layer's combine runs in a Qwen3-MoE-style model (dense attention, SGLang's Triton fused_moe): after
    the experts' down GEMM (inner size: the expert width / TP) and before the next layer's input norm, astra's
    fused_add_rmsnorm in a patched server, then its qkv GEMM. The combine's PDL trigger lets that norm start early:
    1.86 -> 1.03 us a call at batch 16 in the Qwen3-30B-A3B step (H200, 2026-11-29, results/2026-11-29-h200/session18),
    which a GEMM right after the combine cannot show. () for other models (MLA attention, gpt-oss's MoE kernels, or
    not a MoE)."""
    try:
        m = model(model_name)
    except KeyError:
        return ()
    if not m.moe_intermediate or m.act != "silu" or m.extra_norm_widths:
        return ()
    tp = min(m.tp)
    return (Site(f"{m.name}{_at(tp)} experts' down -> combine -> norm -> qkv", m.moe_intermediate // tp,
                 _qkv_width(m, tp), norm_after=True),)


def gemma_norm_pair_sites(hidden: int, second: bool) -> Tuple[Site, ...]:
    """A Gemma-2/3 layer runs its norms in pairs: o_proj -> post_attention_layernorm (gemma_rmsnorm) ->
    pre_feedforward_layernorm (gemma_fused_add_rmsnorm) -> gate_up, and down_proj -> post_feedforward_layernorm ->
    the next layer's input_layernorm -> qkv. The single-norm ops' sites in a server that patches them without
    gemma_post_attention_norms (which takes both of a pair as one kernel): `second` False, the pair's first norm, the
    other norm after it (`norm_after`); True, the second, the other norm before it (`norm_before`). The pairs of the
    first dense Gemma model of that hidden size, by its smallest TP; () where none has it."""
    try:
        m = first_dense(hidden, "gemma")
    except KeyError:
        return ()
    tp = min(m.tp)
    at = _at(tp)
    inner = {"norm_before": True} if second else {"norm_after": True}
    return (Site(f"{m.name}{at} o_proj -> post-attention norms -> gate_up", m.num_heads * m.head_dim // tp,
                 2 * m.intermediate // tp, **inner),
            Site(f"{m.name}{at} down_proj -> post-FFN norm, next input norm -> qkv", m.intermediate // tp,
                 _qkv_width(m, tp), **inner))


def attention_input_sites(models: Sequence[Tuple[str, Sequence[int]]], heads: Tuple[int, int, int], op: str,
                          follower: str, before: str = "") -> Tuple[Site, ...]:
    """Where dense attention runs a small op on the qkv GEMM's output (q/k norm, rope) and SGLang's next JIT kernel
    after it (rope after the q/k norm, the KV store after rope), both PDL-launched and waiting for their producer
    first: qkv -> op -> follower -> attention. bench's generic pair puts a GEMM right after the op, which starts late
    behind the op's early release; a PDL follower starts early, as Gemma's second norm of a pair did (gemma_rmsnorm
    1.246x -> 1.544x at its sites, H200, 2026-11-29). astra's rmsnorm stands in for the follower (`norm_after`: the
    same wait first, reading the op's output rows); a GEMM from the row set to the hidden size stands in for the
    attention. `before`: a PDL JIT kernel between the qkv GEMM and the op (Qwen3's q/k norm before rope), astra's
    rmsnorm standing in for it too (`norm_before`). The first of `models` (name, TP degrees) whose heads per rank,
    (q heads, kv heads, head_dim), are `heads`, at its least such TP; () where none has them."""
    for name, tps in models:
        m = model(name)
        for tp in sorted(tps):
            if (m.num_heads // tp, max(1, m.num_kv_heads // tp), m.head_dim) == tuple(heads):
                chain = " -> ".join(x for x in ("qkv", before, op, follower, "attention") if x)
                return (Site(f"{name}{_at(tp)} {chain}", m.hidden, m.hidden, norm_after=True,
                             norm_before=bool(before)),)
    return ()
