"""Which op each GPU kernel of an SGLang step belongs to.

A kernel name is matched, first hit wins, against
1. the `kernel_symbols` regexes of every op in the astra registry (kernels/<op>/spec.py): these
   ops are "covered" (astra ships a kernel and the patch can swap it in). A name that also
   matches ASTRA_NAMESPACE is astra's own kernel (a patched process);
2. KNOWN: SGLang's other kernels by name pattern (norms, rope, KV store, q/k norm, MoE routing /
   align / combine, attention, GEMM, ...), so the table shows the ops astra does not cover yet;
3. else "other: <short kernel name>".
Categories: "op" (small memory-bound ops: the ones patching can speed up, torch's own elementwise kernels and
means among them), "gemm", "attention", "other".
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

# astra's shipped kernels live in namespaces astra_<short>:: (kernels/<op>/kernel.cu)
ASTRA_NAMESPACE = re.compile(r"\bastra_[a-z0-9_]+::")  # astra_farn::, astra_gelu_tanh::, astra_kv_k::
# cuBLAS's second kernel of a split-K GEMM (cublasLt::splitKreduce_kernel): its name is every split-K GEMM's, so
# the profile and the neighbour table count it with the GEMM kernel before it
SPLITK_REDUCE = re.compile(r"splitKreduce", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    op: str
    category: str
    pattern: str
    note: str = ""


# Order matters: specific before general (fused_add_rmsnorm before rmsnorm, qk norm + rope before
# rope, the norms before GEMM since CuTe-DSL kernel names contain "cutlass").
KNOWN: Tuple[Rule, ...] = (
    Rule("gemma_fused_add_rmsnorm", "op", r"gemma.*fused_?add_?rms_?norm"),
    Rule("gemma_rmsnorm", "op", r"gemma.*rms_?norm"),
    Rule("fused_add_rmsnorm", "op", r"fused_?add_?rms_?norm"),
    Rule("qknorm+rope", "op", r"qk_?norm_?rope|qknorm_rope|norm_rope"),
    Rule("qknorm", "op", r"qk_?norm"),
    Rule("rmsnorm", "op", r"rms_?norm"),
    Rule("rope+kv_store", "op", r"rope_store|rotary.*store"),
    Rule("rope", "op", r"rope|rotary|ApplyRotary|cos_?sin"),
    Rule("kv_store", "op", r"store_?kv|kv_?cache|set_kv_buffer|kv_buffer"),
    Rule("moe_gemm", "gemm", r"fused_moe|moe_gemm|grouped_gemm|group_gemm", "MoE expert GEMMs"),
    Rule("moe_routing", "op", r"topk_?gating|moe_?fused_?gate|topk_?softmax|moetopk|fused_?topk|grouped_?topk|"
                              r"biased_?topk|topk_sigmoid|router"),
    Rule("moe_align", "op", r"moe_?align|count_and_sort_expert|align_block_size|sort_expert"),
    # the combine: sgl_kernel moe_sum_reduce above 32 tokens, a torch.compile'd weighted sum below
    # (SGLang 0.5.17 on the H200: triton_per_fused_copy__mul_sum_0)
    Rule("moe_combine", "op", r"moe_?sum|moefinalize|fused_sum|sum_reduce|triton_(per|red)_fused\w*mul_sum"),
    Rule("gelu_tanh_and_mul", "op", r"gelu_?tanh.*and_?mul|act_and_mul.*gelu_?tanh"),
    Rule("gelu_and_mul", "op", r"gelu.*and_?mul|act_and_mul.*gelu"),
    Rule("silu_and_mul", "op", r"silu.*and_?mul|act_and_mul.*silu|swiglu"),
    Rule("act_and_mul", "op", r"act_and_mul"),
    Rule("merge_state", "op", r"merge_?state"),
    Rule("attention", "attention", r"_fwd_kernel|_fwd_grouped_kernel|decode_att|extend_att|flash_?fwd|flash::|"
                                   r"flashattn|BatchPrefill|BatchDecode|attention|fmha|mha_fwd|sdpa|paged_att"),
    # tensor parallel: a rank's all-reduce waits for the slowest rank, so its time is skew, not work
    Rule("tp communication", "communication", r"all_?reduce|all_?gather|reduce_?scatter|nccl|cross_device_reduce"),
    Rule("gemm", "gemm", r"nvjet|gemm|xmma|cutlass|splitk|cublas|matmul|sm90_|Kernel2\b|gemv"),
    Rule("embedding", "other", r"indexselect|index_select|embedding"),
    # torch's mean over a row (a norm written in torch: Gemma3RMSNorm.forward_native on the q/k heads) before the
    # sampling rule, whose reduce_kernel pattern is for the argmax
    Rule("torch mean", "op", r"reduce_kernel.*MeanOps"),
    Rule("sampling/logits", "other", r"argmax|softmax|sampl|topk|sort|cumsum|reduce_kernel"),
    # memory-bound work too: Gemma-3's torch q/k norm and rope were 17% of its decode step at batch 1 in this row (H200,
    # results/2026-11-29-h200/session22/); by name alone they stay here, the profile moves them by place
    # (profile.kernel_matcher: gemma_qknorm_rope's production)
    Rule("torch elementwise/copy", "op", r"elementwise|copy|memcpy|memset|fill|cat_?array|index"),
)


@dataclass(frozen=True)
class Match:
    op: str
    category: str
    covered: bool        # astra ships a kernel for this op
    astra: bool          # this kernel is astra's own (a patched process)


@lru_cache(maxsize=1)
def registry_rules() -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """(op, kernel_symbols) of every registered op that declares them."""
    try:
        from astra_sglang.registry import get_op, op_names
    except Exception:  # noqa: BLE001 - the table still works without the registry
        return ()
    out = []
    for name in op_names():
        syms = tuple(getattr(get_op(name), "kernel_symbols", ()) or ())
        if syms:
            out.append((name, syms))
    return tuple(out)


@lru_cache(maxsize=1)
def shipped_ops() -> frozenset:
    """Registered ops that ship a kernel (kernels/<op>/kernel.cu): what the patch can swap in.
    KNOWN's op names follow the registry's folder names, so an op astra starts covering shows
    as covered without editing this table."""
    try:
        from astra_sglang.registry import op_dir, op_names

        return frozenset(n for n in op_names() if (op_dir(n) / "kernel.cu").is_file())
    except Exception:  # noqa: BLE001
        return frozenset()


@lru_cache(maxsize=None)
def _rx(p: str):
    return re.compile(p, re.IGNORECASE)


def short_name(name: str, width: int = 60) -> str:
    """A kernel's name without return type, template arguments and parameters."""
    s = re.sub(r"^void\s+", "", name.strip())
    depth, out = 0, []
    for ch in s:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
            continue
        if depth == 0:
            out.append(ch)
    s = "".join(out).strip() or name
    return s if len(s) <= width else s[: width - 1] + "…"


_GEMMA_NORMS = {"rmsnorm": "gemma_rmsnorm", "fused_add_rmsnorm": "gemma_fused_add_rmsnorm"}


def classify(name: str, hidden_act: str = "silu",
             rules: Optional[Sequence[Tuple[str, Sequence[str]]]] = None, gemma: bool = False) -> Match:
    """The op a kernel name belongs to. hidden_act names the activation of SGLang's generic act_and_mul kernel;
    gemma: the model is a Gemma, whose (1 + w) norms run FlashInfer's plain RMSNorm kernels (weight bias 1, the
    same kernel names), so those are the gemma ops."""
    if rules is None:
        return _classify_registered(name, hidden_act, gemma)
    return _classify(name, hidden_act, rules, gemma)


@lru_cache(maxsize=1 << 16)
def _classify_registered(name: str, hidden_act: str, gemma: bool) -> Match:
    # memoized: ~50 regex searches on names of up to ~1000 characters took ~1 ms a call, and a profile classifies
    # each of a trace's ~10^5 kernel events several times (a Gemma-3-12B step's analysis: 164 s on 2 cores)
    return _classify(name, hidden_act, registry_rules(), gemma)


def _classify(name: str, hidden_act: str, rules: Sequence[Tuple[str, Sequence[str]]], gemma: bool) -> Match:
    is_astra = bool(ASTRA_NAMESPACE.search(name))
    for op, pats in rules:
        if any(_rx(p).search(name) for p in pats):
            if gemma and not is_astra:
                op = _GEMMA_NORMS.get(op, op)
            return Match(op, "op", True, is_astra)
    covered = {op for op, _ in rules} | shipped_ops()
    for r in KNOWN:
        if _rx(r.pattern).search(name):
            op = r.op
            if op == "act_and_mul":   # activation functor not in the name: the model's own
                op = f"{hidden_act.replace('gelu_pytorch_tanh', 'gelu_tanh')}_and_mul"
            if gemma and not is_astra:
                op = _GEMMA_NORMS.get(op, op)
            return Match(op, r.category, op in covered, is_astra)
    return Match(f"other: {short_name(name, 40)}", "other", False, is_astra)


# ----------------------------------------------------------------------------- shapes from a config

def shape_hints(cfg: dict, tokens: int, tp: int = 1) -> Dict[str, str]:
    """The shape each op runs on in one step of `tokens` tokens, from the model's config.json
    (astra dim order for covered ops: silu_and_mul tokens x d, fused_add_rmsnorm tokens x hidden).
    Used where the profiler recorded no shapes (CUDA-graph replays record none)."""
    h = int(cfg.get("hidden_size", 0))
    heads = int(cfg.get("num_attention_heads", 0)) // max(tp, 1)
    kv = max(1, int(cfg.get("num_key_value_heads", cfg.get("num_attention_heads", 0))) // max(tp, 1))
    hd = int(cfg.get("head_dim") or (h // max(int(cfg.get("num_attention_heads", 1)), 1)))
    inter = int(cfg.get("intermediate_size", 0)) // max(tp, 1)
    out = {
        "fused_add_rmsnorm": f"{tokens}x{h}",
        "rmsnorm": f"{tokens}x{h}",
        "gemma_fused_add_rmsnorm": f"{tokens}x{h}",   # Gemma's (1 + w) norms, where a Gemma model runs them
        "gemma_rmsnorm": f"{tokens}x{h}",
        "qknorm": f"q {tokens}x{heads}x{hd}, k {tokens}x{kv}x{hd}",
        "rope": f"q {tokens}x{heads}x{hd}, k {tokens}x{kv}x{hd}",
        "rope+kv_store": f"q {tokens}x{heads}x{hd}, k/v {tokens}x{kv}x{hd}",
        "kv_store": f"k/v {tokens}x{kv}x{hd}",
        "merge_state": f"{tokens}x{heads}x{hd}",
    }
    n_exp = int(cfg.get("num_experts", cfg.get("n_routed_experts", 0)) or 0)
    if n_exp:
        topk = int(cfg.get("num_experts_per_tok", 1))
        moe_inter = int(cfg.get("moe_intermediate_size", inter)) // max(tp, 1)
        out.update({
            "silu_and_mul": f"{tokens * topk}x{moe_inter}",     # fused_moe's activation over token x expert rows
            "moe_routing": f"{tokens}x{n_exp} top{topk}",
            "moe_align": f"{tokens * topk} ids, {n_exp} experts",
            "moe_combine": f"{tokens}x{topk}x{h}",
            "moe_gate": f"{tokens}x{h}x{n_exp}",   # the router's logits GEMM (astra's; SGLang's is a cuBLAS gemm)
        })
    else:
        out["silu_and_mul"] = f"{tokens}x{inter}"
        out["gelu_and_mul"] = f"{tokens}x{inter}"
        out["gelu_tanh_and_mul"] = f"{tokens}x{inter}"
    return out


def covered_dims(op: str, hint: str) -> Optional[Tuple[int, ...]]:
    """A hint like '32x4096' as dims, for a speedup lookup (None when it is not plain AxB...)."""
    if not re.fullmatch(r"\d+(x\d+)+", hint or ""):
        return None
    return tuple(int(x) for x in hint.split("x"))


def lookup_dims(op: str, hint: str, cfg: Optional[dict] = None, tokens: int = 0,
                tp: int = 1) -> Optional[Tuple[int, ...]]:
    """The op's dims in its spec's order, for a speedup lookup and a shapes corpus: the spec's
    model_dims(cfg, tokens, tp) where kernels/<op>/spec.py has one (qknorm's dims carry head counts and
    strides that no AxB hint spells), else the plain hint."""
    if cfg and tokens:
        from astra_sglang.errors import AstraError
        from astra_sglang.registry import op_part

        try:
            fn = getattr(op_part(op, "spec"), "model_dims", None)
        except AstraError:   # not a registry op (a profile-only category such as moe_routing)
            fn = None
        dims = fn(cfg, tokens, tp) if fn else None
        if dims:
            return tuple(int(x) for x in dims)
    return covered_dims(op, hint)


def classify_all(names: Sequence[str], hidden_act: str = "silu", gemma: bool = False) -> Dict[str, Match]:
    return {n: classify(n, hidden_act, gemma=gemma) for n in set(names)}


def kernel_patterns_table() -> List[Tuple[str, str, str]]:
    """(op, category, pattern) in match order, registry ops first (for docs and --list-patterns)."""
    rows = [(op, "op (astra)", " | ".join(p)) for op, p in registry_rules()]
    return rows + [(r.op, r.category, r.pattern) for r in KNOWN]
