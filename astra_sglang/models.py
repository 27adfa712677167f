"""Real model configs the shape corpora are built from (values from each model's config.json)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

# Decode batches (tokens per step) and prefill chunk sizes SGLang sees in serving.
DECODE_TOKENS: Tuple[int, ...] = (1, 16, 64, 256)
PREFILL_TOKENS: Tuple[int, ...] = (1024, 4096, 16384)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int
    intermediate: int  # dense MLP (or per-expert for MoE) intermediate size
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tp: Tuple[int, ...] = (1,)  # tensor-parallel degrees it is commonly served with
    extra_norm_widths: Tuple[int, ...] = ()  # other RMSNorm widths (e.g. MLA's lora ranks)


MODELS: Tuple[ModelConfig, ...] = (
    ModelConfig("llama-2-7b", 4096, 11008, 32, 32, 128, (1,)),
    ModelConfig("llama-2-13b", 5120, 13824, 40, 40, 128, (1, 2)),
    ModelConfig("llama-2-70b", 8192, 28672, 64, 8, 128, (2, 4, 8)),
    ModelConfig("llama-3-8b", 4096, 14336, 32, 8, 128, (1,)),
    ModelConfig("llama-3-70b", 8192, 28672, 64, 8, 128, (4, 8)),
    ModelConfig("qwen2.5-7b", 3584, 18944, 28, 4, 128, (1,)),
    ModelConfig("qwen2.5-72b", 8192, 29568, 64, 8, 128, (4, 8)),
    ModelConfig("qwen3-8b", 4096, 12288, 32, 8, 128, (1,)),
    ModelConfig("qwen3-32b", 5120, 25600, 64, 8, 128, (2, 4)),
    ModelConfig("mistral-7b", 4096, 14336, 32, 8, 128, (1,)),
    ModelConfig("mixtral-8x7b", 4096, 14336, 32, 8, 128, (2,)),
    # DeepSeek-V3: dense-layer MLP 18432, MoE expert 2048, MLA (q_lora 1536, kv_lora 512)
    ModelConfig("deepseek-v3", 7168, 2048, 128, 128, 128, (8,), extra_norm_widths=(1536, 512)),
)
