"""Helpers for the SGLang layers each op's kernels/<op>/layer.py builds for `validate`."""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace


def write_back(dst, src) -> None:
    """dst <- a layer's output src, unless the layer wrote dst in place and returned it (src aliases dst: at one
    token, copy_ refuses a tensor onto its own memory)."""
    if src.data_ptr() != dst.data_ptr():
        dst.copy_(src.reshape(dst.shape))


def construct(cls, *args, **kwargs):
    """Build an SGLang layer outside a server. sglang 0.5.17's SiluAndMul() reads the runtime
    context in __init__ (ValueError "config namespace 'exec' not published" outside a
    server); its forward_cuda needs none of it, so build it with its base class's __init__."""
    try:
        return cls(*args, **kwargs)
    except ValueError as e:
        if "not published" not in str(e) or args or kwargs:
            raise
        obj = cls.__new__(cls)
        cls.__mro__[1].__init__(obj)
        return obj


@contextmanager
def _supplied(exec_cfg, modules):
    """Inside the block, the named modules' `get_exec` (and the other names given) answer from `exec_cfg` where
    SGLang's runtime config is not published (outside a server); inside a server nothing changes."""
    import importlib

    from sglang.srt import runtime_context

    try:
        runtime_context.get_exec()
        published = True  # inside a server: nothing to supply
    except ValueError:
        published = False
    if published:
        yield
        return
    saved = []
    try:  # an import failing part way still restores what was replaced before it
        for mod_name, names in modules.items():
            mod = importlib.import_module(mod_name)
            for n, f in {"get_exec": lambda: exec_cfg, **names}.items():
                if not hasattr(mod, n):  # another SGLang version reads no config there
                    continue
                saved.append((mod, n, getattr(mod, n)))
                setattr(mod, n, f)
        yield
    finally:
        for mod, n, f in reversed(saved):
            setattr(mod, n, f)


def server_defaults():
    """Outside a server SGLang's runtime config is not published (get_exec raises), and the code the rope-family
    layers run reads three of its values: RotaryEmbedding's __init__ and Qwen3Attention.forward the RL on-policy
    target, apply_qk_norm the prefill compiler, enable_fused_set_kv_buffer whether prefill context parallelism is on. For the call, those modules
    answer as a server started without those flags would (no on-policy target, no inductor, no context
    parallelism); everything else is SGLang's code as it runs."""
    exec_cfg = SimpleNamespace(
        deterministic=SimpleNamespace(rl_on_policy_target=None),
        graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(prefill=SimpleNamespace(tc_compiler=None))))
    return _supplied(exec_cfg, {"sglang.srt.models.utils": {"is_prefill_context_parallel_enabled": lambda: False},
                                "sglang.srt.layers.rotary_embedding.base": {},
                                "sglang.srt.models.qwen3": {}})


def moe_server_defaults():
    """server_defaults for fused_experts_impl (moe_experts' installed sequence): outside a server its module reads
    whether the fused MoE sum + all-reduce is on, and the Triton config lookup whether deterministic inference is;
    both answer as a server started without those flags would (off)."""
    exec_cfg = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=False),
                               moe=SimpleNamespace(enable_fused_moe_sum_all_reduce=False))
    return _supplied(exec_cfg, {"sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe": {},
                                "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config": {}})


def qk_norms_and_rope(inp, head_dim: int, eps: float, neox: bool):
    """(q_norm, k_norm, rotary_emb) of a Qwen3 attention stand-in: SGLang's own RMSNorm layers holding the op's
    weights and its RotaryEmbedding holding the op's cos/sin cache (both sides rotate by the same angles).
    Build it inside server_defaults(): 0.5.17's RotaryEmbedding reads the runtime config."""
    from sglang.srt.layers.layernorm import RMSNorm

    dev, dt = inp["q"].device, inp["q"].dtype
    norms = []
    for w in (inp["q_weight"], inp["k_weight"]):
        n = construct(RMSNorm, head_dim, eps=eps).to(device=dev, dtype=dt)
        n.weight.data.copy_(w)
        norms.append(n)
    return norms[0], norms[1], rotary_embedding(inp["cos_sin_cache"], head_dim, head_dim, neox)


def rotary_embedding(cache, head_size: int, rotary_dim: int, neox: bool):
    """SGLang's RotaryEmbedding holding the op's cos/sin cache (both sides rotate by the same angles). Build it
    inside server_defaults(): 0.5.17's __init__ reads the runtime config."""
    import torch
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    rope = construct(RotaryEmbedding, head_size, rotary_dim, cache.shape[0], 1_000_000, neox, torch.float32)
    rope = rope.to(cache.device)
    rope.cos_sin_cache = cache
    return rope


class _Callable(SimpleNamespace):
    """A module stand-in: its attributes, and a call that runs `fn`."""

    def __init__(self, fn, **attrs):
        super().__init__(**attrs)
        self._fn = fn

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


def storing_attention(inp, num_kv_heads: int, head_dim: int):
    """(attn, seen): a RadixAttention stand-in for a dense attention forward's self.attn, holding the op's caches.
    Called as attn(q, k, v, forward_batch, save_kv_cache=True) it records q and k in `seen` and, when
    asked to save the KV, stores k and v as the attention backend does first (MHATokenToKVPool.set_kv_buffer ->
    SGLang's store_cache), every slot written: the pool's skip of the padding slot 0 is left out, since the fused
    ops, like SGLang's own fused rope + store, write it. It returns q (the stand-in o_proj passes it through)."""
    from sglang.kernels.ops.kvcache.kvcache import store_cache

    kc, vc, row = inp["k_cache"], inp["v_cache"], num_kv_heads * head_dim
    seen = {}

    def attention(q, k, v, forward_batch, save_kv_cache=True):
        seen.update(q=q, k=k)
        if save_kv_cache:
            t = q.shape[0]
            store_cache(k.reshape(t, row), v.reshape(t, row), kc, vc, forward_batch.out_cache_loc,
                        reserved_skip_index=-1)
        return q

    return _Callable(attention, layer_id=0, k_scale=None, v_scale=None, is_cross_attention=False), seen


def kv_pool_context(inp, num_kv_heads: int, head_dim: int):
    """A forward context whose KV pool hands out the op's caches as the pool layer's [slots, heads, head_dim]."""
    from sglang.srt.model_executor.forward_context import ForwardContext

    kc, vc = inp["k_cache"], inp["v_cache"]
    pool = SimpleNamespace(dtype=kc.dtype, get_key_buffer=lambda i: kc.view(kc.shape[0], num_kv_heads, head_dim),
                           get_value_buffer=lambda i: vc.view(vc.shape[0], num_kv_heads, head_dim))
    return ForwardContext(attn_backend=SimpleNamespace(token_to_kv_pool=pool))
