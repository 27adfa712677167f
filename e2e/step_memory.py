"""Will the processes of a `e2e --step` wave, or the two servers of a serving A/B, fit the GPU? Checked
before any of them loads.

Each worker loads the whole model (dummy weights) and they sit side by side: a wave that does not
fit dies with an out-of-memory error only after minutes of loading (the two servers of `e2e` died in
CUDA-graph capture: Gemma-2-9B with a 65536-token KV pool each on an 80 GB H100, 2026-11-26). The weight estimate comes from
config.json alone (no weights are read); norms and biases are left out (well under 1%).
"""
from __future__ import annotations

import subprocess
from typing import Optional

from astra_sglang.errors import AstraError

GIB = 1 << 30
USABLE = 0.95      # the driver, NCCL and fragmentation take the rest
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def _heads(cfg: dict):
    """(q heads, kv heads, head dim) of a HF config.json dict."""
    heads = cfg["num_attention_heads"]
    return heads, cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or cfg["hidden_size"] // heads


def _dtype_bytes(cfg: dict) -> int:
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    return DTYPE_BYTES.get(dtype, 2)


def weight_bytes(cfg: dict) -> int:
    """The model's weight bytes from a HF config.json dict (embeddings, attention, MLP or MoE)."""
    hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv_heads, head_dim = _heads(cfg)
    params = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)      # embeddings (+ lm_head)
    attn = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden   # q, k, v, o
    dense = 3 * hidden * cfg.get("intermediate_size", 0)                           # gate, up, down
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts")
    moe_size = cfg.get("moe_intermediate_size")
    if experts and moe_size:
        shared = cfg.get("shared_expert_intermediate_size") or (cfg.get("n_shared_experts") or 0) * moe_size
        moe = experts * 3 * hidden * moe_size + hidden * experts + 3 * hidden * shared   # experts, router, shared
        # layers that keep a dense MLP: Qwen's mlp_only_layers, DeepSeek's first_k_dense_replace
        n_dense = min(layers, len(cfg.get("mlp_only_layers") or []) + (cfg.get("first_k_dense_replace") or 0))
        params += layers * attn + n_dense * dense + (layers - n_dense) * moe
    else:
        params += layers * (attn + dense)
    return params * _dtype_bytes(cfg)


def kv_bytes_per_token(cfg: dict, tp: int = 1) -> int:
    """Bytes a token takes in the KV pool (k and v of every layer, the model dtype), per GPU at `tp`. MLA
    (DeepSeek: kv_lora_rank) caches one latent of kv_lora_rank + qk_rope_head_dim a layer, on every rank."""
    if cfg.get("kv_lora_rank"):
        latent = cfg["kv_lora_rank"] + cfg.get("qk_rope_head_dim", 0)
        return cfg["num_hidden_layers"] * latent * _dtype_bytes(cfg)
    _, kv_heads, head_dim = _heads(cfg)
    return cfg["num_hidden_layers"] * 2 * max(1, kv_heads // tp) * head_dim * _dtype_bytes(cfg)


def check_servers_fit(cfg: dict, servers: int, tp: int, max_total_tokens: int, gpu_bytes: Optional[int],
                      per_process_overhead: int = 3 * GIB) -> None:
    """Raise AstraError when `servers` SGLang servers side by side (weights / tp, a KV pool of max_total_tokens,
    per_process_overhead each) exceed the usable GPU memory; the message names the --max-total-tokens that fits."""
    if gpu_bytes is None:
        return
    weights = weight_bytes(cfg) / tp
    kv_tok = kv_bytes_per_token(cfg, tp)
    each = weights + kv_tok * max_total_tokens + per_process_overhead
    usable = USABLE * gpu_bytes
    if servers * each <= usable:
        return
    fits = int((usable / servers - weights - per_process_overhead) // kv_tok)
    hint = (f"pass --max-total-tokens {fits // 1024 * 1024} or less" if fits >= 1024 else
            "the weights alone do not leave room for a KV pool: split them with --tp or use a GPU with more memory")
    raise AstraError(
        f"{servers} servers side by side need ~{servers * each / GIB:.1f} GiB ({weights / GIB:.1f} GiB of weights + "
        f"{kv_tok * max_total_tokens / GIB:.1f} GiB of KV pool for --max-total-tokens {max_total_tokens} + "
        f"{per_process_overhead / GIB:.1f} GiB overhead each) but the GPU has {gpu_bytes / GIB:.1f} GiB "
        f"({usable / GIB:.1f} usable): {hint}")


def gpu_memory_bytes() -> Optional[int]:
    """The first GPU's total memory; None without a working nvidia-smi (then nothing is checked)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            return None
        return int(float(p.stdout.strip().splitlines()[0])) << 20      # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def check_fits(cfg: dict, procs_per_wave: int, tp: int, gpu_bytes: Optional[int],
               per_process_overhead: int = 3 * GIB, mem_fraction: float = USABLE) -> None:
    """Raise AstraError when procs_per_wave processes, each with its 1/tp of the weights plus
    per_process_overhead (CUDA context, graphs, the capped KV pool), exceed what SGLang lets them have side by side.

    SGLang's rule (0.5.17 KVCacheConfigurator._profile_available_bytes): a process notes the memory free when it
    starts (pre), loads its weights, then keeps pre * (1 - mem_fraction) free as slack and fails ("Loaded weights
    leave no GPU memory for the KV cache", or an empty KV pool) where less is left. A wave's processes start together,
    so each notes about the whole GPU and the last to size its pool finds every process's weights loaded: the wave
    fits only within mem_fraction of the GPU (and within USABLE of it, the physical bound). The 30B-A3B-shaped
    `--procs 2` step at --mem-fraction-static 0.5 left its last process of four without a KV cache (2026-11-30)."""
    if gpu_bytes is None:
        return
    weights = weight_bytes(cfg) / tp
    each = weights + per_process_overhead
    share = min(USABLE, mem_fraction)
    usable = share * gpu_bytes
    if procs_per_wave * each <= usable:
        return
    per_gpu = f"{weights / GIB:.1f} GiB of weights" + (f" per GPU at --tp {tp}" if tp > 1 else "")
    bound = (f"{usable / GIB:.1f} usable" if share == USABLE else
             f"{usable / GIB:.1f} under --mem-fraction-static {mem_fraction:g}, which SGLang applies to the memory "
             f"free when each process starts")
    raise AstraError(
        f"{procs_per_wave} processes loaded side by side need ~{procs_per_wave * each / GIB:.1f} GiB "
        f"({per_gpu} + {per_process_overhead / GIB:.1f} GiB overhead each) but the GPU has "
        f"{gpu_bytes / GIB:.1f} GiB ({bound}): at most {int(usable // each)} fit at once; "
        f"load fewer with --procs-at-once 1 (one process per arm at a time)"
        + (", raise --mem-fraction-static" if share < USABLE else "")
        + ", split the weights with --tp, or use a GPU with more memory")
