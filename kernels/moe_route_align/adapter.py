"""The patch adapter of a fused op whose two halves are two SGLang calls far apart (patch/adapters.py holds the
machinery and says what each field means):
- `sglang.srt.layers.moe.topk:select_experts` (TopK.forward_cuda calls it through the module global): where
  SGLang would run the softmax Triton router and its post-processing is a no-op, the fused kernel routes AND aligns
  the ids for the block size the Triton MoE path will ask for. The weights and ids go back as select_experts'
  StandardTopKOutput (through SGLang's own build_precomputed_topk_output: capture hook, distribution recorder);
  the alignment waits in a one-slot stash keyed by the topk_ids tensor itself.
- `...moe_runner.triton_utils.moe_align_block_size:moe_align_block_size` (the wrapper fused_experts calls,
  imported by name in fused_moe.py): when it is asked to align exactly the stashed ids (the same tensor, not
  modified since: torch's version counter), for the stashed block size and expert count, it returns the stashed
  buffers (`Served`: no kernel). Any other call runs SGLang's wrapper (and astra's moe_align under it).

The block size: the router does not know the MoE config's BLOCK_SIZE_M. The wrapper learns it: each call it runs
records (tokens, experts, topk) -> block_size, and the router fuses only shapes it has seen (SGLang's warm-up and
CUDA-graph capture run every decode batch size eagerly first). A shape seen with two block sizes (two MoE layers of
one model with different configs) is never fused. A wrong guess cannot be served: the stash must match the
wrapper's own block size, and an unserved stash costs only the wasted alignment.

Declined (SGLang's select_experts runs, astra's moe_router under it): grouped / biased / custom / torch-native
routing, sigmoid scoring, fused shared experts, EPLB dispatch info, padded-row masking (num_token_non_padded),
the flashinfer_trtllm_routed backend, the LoRA fused top-k + pack, aiter, simulated routing, torch.compile, more
than 1024 experts, topk > 32, more than MAX_TOKENS tokens or 4096 ids. The wrapper is 0.5.17's: 0.5.23's
(rounded length, Triton small-numel path, extra flags) is not served yet."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

from astra_sglang.kernels.moe_align.spec import max_num_tokens_padded  # the wrapper's length, E experts
from astra_sglang.kernels.moe_route_align.spec import MAX_NUMEL
from astra_sglang.kernels.moe_router.adapter import MAX_EXPERTS, MAX_TOPK, _sglang_route
from astra_sglang.patch.adapters import OpAdapter, Served, contiguity_problem, topk_outputs_problem

# Calls with more tokens keep the two ops (moe_router, moe_align). Against SGLang's own pair the fused kernel is
# 2.58x / 2.36x / 1.40x / 0.95x at 1 / 8 / 32 / 64 tokens in context, but against astra's two (which `--ops all`
# runs) it only matches them: in the decode graph 3.90 vs 2.02 + 2.21 us at 1 token, 4.21 vs 2.01 + 2.25 at 8,
# 7.33 vs 2.02 + 3.17 at 32 (one block routes every token) (H100, 2026-11-26, results/2026-11-26-h100/)
MAX_TOKENS = 8
_TOPK_MOD = "sglang.srt.layers.moe.topk"
_WRAP_MOD = "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size"

# (tokens, experts, topk) -> the block size SGLang's wrapper was called with; 0: seen with two (never fused)
_BLOCK: Dict[Tuple[int, int, int], int] = {}
# the one alignment waiting for its wrapper call: (topk_ids, its version, block_size, experts, outputs)
_STASH: Dict[str, Any] = {}


def _route_problem(mod, cfg, num_token_non_padded, dispatch_info) -> Optional[str]:
    """Why select_experts would not be the softmax Triton router with a no-op post-processing here, or None."""
    if cfg.use_grouped_topk or cfg.torch_native or cfg.custom_routing_function is not None:
        return "grouped, torch-native or custom routing"
    if cfg.scoring_func != "softmax":
        return f"scoring_func {cfg.scoring_func!r}"
    if cfg.apply_routed_scaling_factor_on_output:
        return "routed scaling on the output"
    if getattr(mod, "_SGLANG_EXPERIMENTAL_LORA_OPTI", False):
        return "SGLang's experimental LoRA routing"
    if not hasattr(mod, "build_precomputed_topk_output") or not hasattr(mod, "precomputed_topk_postprocess_is_noop"):
        return "this SGLang has no build_precomputed_topk_output"
    if not mod.precomputed_topk_postprocess_is_noop(cfg, num_token_non_padded, dispatch_info):
        return "select_experts post-processes the ids (shared experts, EPLB, padded rows or simulated routing)"
    backend = _select_experts_backend(mod, cfg)
    if backend is not None and backend.is_flashinfer_trtllm_routed():
        return "the flashinfer_trtllm_routed backend routes on raw logits"
    return _sglang_route()


def _select_experts_backend(mod, cfg):
    """The MoE runner backend select_experts reads: 0.5.23's TopKConfig.runner_backend (bound per layer, None when
    unbound), else 0.5.17's global get_moe_runner_backend() (imported into the topk module), None where it is not
    published (SGLang's default backend)."""
    if hasattr(cfg, "runner_backend"):
        return cfg.runner_backend
    get = getattr(mod, "get_moe_runner_backend", None)
    try:
        return get() if get is not None else None
    except Exception:  # noqa: BLE001 - an unpublished runtime config: SGLang's default backend
        return None


def _expand_route(a: Dict[str, Any]):
    """select_experts(hidden_states, router_logits, topk_config, ...) -> canonical arguments, or why not."""
    import torch

    if torch.compiler.is_compiling():
        return "torch.compile traces SGLang's route"
    mod = sys.modules.get(_TOPK_MOD)
    cfg, x = a["topk_config"], a["router_logits"]
    for n in ("dynamic_expert_bias", "router_logits_partials"):  # 0.5.23: a biased router / ROCm split-K logits
        if a.get(n) is not None:
            return f"{n} is given: not the plain router"
    if mod is None or not isinstance(x, torch.Tensor) or x.dim() != 2 or x.device.type == "cpu":
        return "router_logits is not a 2-D GPU tensor"
    why = _route_problem(mod, cfg, a.get("num_token_non_padded"), a.get("expert_location_dispatch_info"))
    if why:
        return why
    t, e = x.shape
    k = int(cfg.top_k)
    if t > MAX_TOKENS:   # before any allocation: select_experts runs as it would
        return ADAPTER.kept_by_sglang((t,))
    if not 1 <= k <= min(MAX_TOPK, e) or e > MAX_EXPERTS or t * k > MAX_NUMEL:
        return f"{t} tokens x top {k} of {e} experts: past one block"
    bs = _BLOCK.get((t, e, k))
    if not bs:
        return ("no block size known for this shape yet (learned from SGLang's first moe_align_block_size call)"
                if bs is None else "two block sizes seen for this shape")
    n = max_num_tokens_padded(t * k, e, bs)
    dev = x.device
    return {
        "scores": x, "block_size": bs, "renormalize": int(bool(cfg.renormalize)),
        "topk_weights": torch.empty((t, k), dtype=torch.float32, device=dev),
        "topk_ids": torch.empty((t, k), dtype=torch.int32, device=dev),
        "sorted_token_ids": torch.empty((n,), dtype=torch.int32, device=dev),
        "expert_ids": torch.empty((-(-n // bs),), dtype=torch.int32, device=dev),
        "num_tokens_post_pad": torch.empty((1,), dtype=torch.int32, device=dev),
        # for returns: select_experts' own result
        "topk_config": cfg, "layer_id": a.get("layer_id"),
    }


def _serve_align(a: Dict[str, Any]):
    """moe_align_block_size(topk_ids, block_size, num_experts, ...) -> the stashed alignment, or why not (and the
    block size learned)."""
    import torch

    ids, bs, e = a["topk_ids"], int(a["block_size"]), int(a["num_experts"])
    st = dict(_STASH)
    _STASH.clear()  # one use: a stale stash never outlives the next wrapper call
    mod = sys.modules.get(_WRAP_MOD)
    # 0.5.23's wrapper (its "pad_expert_ids", "return_inactive_prefix_count") is declined whole
    if mod is None or hasattr(mod, "SMALL_NUMEL_LIMIT") or "pad_expert_ids" in a:
        return "not 0.5.17's moe_align_block_size (0.5.23's is not served yet)"
    if a.get("ignore_invalid_expert") or getattr(mod, "_SGLANG_EXPERIMENTAL_LORA_OPTI", False):
        return "ignore_invalid_expert or SGLang's experimental LoRA align"
    if torch.compiler.is_compiling() or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return "topk_ids is not a 2-D tensor outside torch.compile"
    if st and st["ids"] is ids and st["version"] == ids._version and st["block_size"] == bs and st["experts"] == e:
        return Served(st["out"])
    key = (ids.shape[0], e, ids.shape[1])
    _BLOCK[key] = bs if _BLOCK.get(key, bs) == bs else 0
    return "no alignment stashed for these ids (the router ran SGLang's route)"


def _expand(a: Dict[str, Any]):
    return _expand_route(a) if "router_logits" in a else _serve_align(a)


def _normalize(c):
    x = c["scores"]
    t, e = x.shape
    k = c["topk_ids"].shape[1] if c["topk_ids"].dim() == 2 else 0
    bad = topk_outputs_problem(c, t, k) or contiguity_problem(
        c, ("scores", "topk_weights", "topk_ids", "sorted_token_ids", "expert_ids", "num_tokens_post_pad"))
    if bad:
        return bad
    bs, n = int(c["block_size"]), c["sorted_token_ids"].numel()
    if n < max_num_tokens_padded(t * k, e, bs) or c["expert_ids"].numel() < -(-n // bs):
        return "alignment buffers shorter than SGLang's"
    views = {m: c[m] for m in ("scores", "topk_weights", "topk_ids", "sorted_token_ids", "expert_ids",
                               "num_tokens_post_pad")}
    return views, (t, e, k, bs, n)


def _original(module: str, name: str):
    import importlib

    fn = getattr(importlib.import_module(module), name)
    return getattr(fn, "__astra_original__", fn)


def _sequence(c: Dict[str, Any]) -> None:
    """SGLang's own two calls on canonical tensors: fused_topk (its returned weights and ids copied into the
    op's), then the in-place align its wrapper calls, on the router's ids."""
    import torch

    x, ids = c["scores"], c["topk_ids"]
    fused_topk = _original(_TOPK_MOD, "fused_topk")
    w, i = fused_topk(hidden_states=x, gating_output=x, topk=int(ids.shape[1]), renormalize=bool(c["renormalize"]))
    e = int(x.shape[1])
    cumsum = torch.empty((e + 2,), dtype=torch.int32, device=x.device)
    align = _original(_WRAP_MOD, "sgl_moe_align_block_size")
    align(i, e + 1, int(c["block_size"]), c["sorted_token_ids"], c["expert_ids"], c["num_tokens_post_pad"], cumsum,
          True, False)
    c["topk_weights"].copy_(w)
    ids.copy_(i)


def _returns(c: Dict[str, Any]):
    """select_experts' result, through SGLang's build_precomputed_topk_output (its capture hook and recorder) with
    the router logits select_experts itself returns; the alignment goes to the stash for the wrapper."""
    mod = sys.modules[_TOPK_MOD]
    out = mod.build_precomputed_topk_output(c["topk_weights"], c["topk_ids"], c["topk_config"], c["layer_id"])
    ids = c["topk_ids"]
    _STASH.clear()
    _STASH.update(ids=ids, version=ids._version, block_size=int(c["block_size"]), experts=int(c["scores"].shape[1]),
                  out=(c["sorted_token_ids"], c["expert_ids"], c["num_tokens_post_pad"]))
    return out._replace(router_logits=c["scores"])


# Not in `--ops all`: on top of moe_router + moe_align (on by default) the decode step moved -0.15% at batch 1 and
# +0.15% (n.s.) at 8 (qwen3-30b-a3b-20l, --base-ops all, H100, 2026-11-26). Correct (check, validate 33/33, every
# fused launch served in a server, greedy ids identical) but no gain worth a second route.
DEFAULT_OFF = ("no gain over moe_router + moe_align in the decode step: -0.15% at batch 1, +0.15% (n.s.) at 8 "
               "(H100, 2026-11-26, results/2026-11-26-h100/step/qwen3-30b-a3b-20l-mra-over-all/)")

ADAPTER = OpAdapter(
    op="moe_route_align",
    data="scores",
    same_dtype=("scores",),
    fp32=("topk_weights",),
    expand=_expand,
    sequence=_sequence,
    normalize=_normalize,
    returns=_returns,
    returned=("topk_weights", "topk_ids"),
    max_tokens=MAX_TOKENS,
    token_derived=("max_num_tokens_padded",),
)
