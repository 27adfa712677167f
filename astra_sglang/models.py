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
    # What SGLang's model file runs: the gated MLP activation ("silu", "gelu" = GeluAndMul("none"),
    # "gelu_tanh" = GeluAndMul("tanh"), "swiglu_oai" = gpt-oss's clamped SwiGLU inside its MoE kernel)
    # and the norm ("rms" = RMSNorm, "gemma" = GemmaRMSNorm / Gemma3RMSNorm: x / rms * (1 + w)).
    act: str = "silu"
    norm: str = "rms"
    moe_intermediate: int = 0  # per-expert intermediate size of a MoE model (0: dense)
    # a MoE MLP whose expert width the corpora take as `intermediate` (Mixtral, DeepSeek-V3's routed experts)
    moe: bool = False

    @property
    def dense(self) -> bool:
        """Its MLP is GEMMs (gate_up, down), not experts."""
        return not self.moe and not self.moe_intermediate


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
    ModelConfig("mixtral-8x7b", 4096, 14336, 32, 8, 128, (2,), moe=True),
    # DeepSeek-V3: dense-layer MLP 18432, MoE expert 2048, MLA (q_lora 1536, kv_lora 512)
    ModelConfig("deepseek-v3", 7168, 2048, 128, 128, 128, (8,), extra_norm_widths=(1536, 512), moe=True),
)


# Models the norm/activation family's corpora add (kernels/{rmsnorm,gemma_*,gelu_*}). Kept apart from
# MODELS so the corpora of the ops measured before them (silu_and_mul, fused_add_rmsnorm, merge_state)
# and their recorded RESULTS stay the same; those ops can opt in with ALL_MODELS.
MORE_MODELS: Tuple[ModelConfig, ...] = (
    # Gemma-1 (sglang/srt/models/gemma.py: GeluAndMul("none"), GemmaRMSNorm)
    ModelConfig("gemma-2b", 2048, 16384, 8, 1, 256, (1,), act="gelu", norm="gemma"),
    ModelConfig("gemma-7b", 3072, 24576, 16, 16, 256, (1,), act="gelu", norm="gemma"),
    # Gemma-2 (gemma2.py: GeluAndMul() = tanh, GemmaRMSNorm; four norms per layer)
    ModelConfig("gemma-2-2b", 2304, 9216, 8, 4, 256, (1,), act="gelu_tanh", norm="gemma"),
    ModelConfig("gemma-2-9b", 3584, 14336, 16, 8, 256, (1,), act="gelu_tanh", norm="gemma"),
    ModelConfig("gemma-2-27b", 4608, 36864, 32, 16, 128, (1, 2, 4), act="gelu_tanh", norm="gemma"),
    # Gemma-3 (gemma3_causal.py: GeluAndMul() = tanh, Gemma3RMSNorm, also on q/k per head)
    ModelConfig("gemma-3-1b", 1152, 6912, 4, 1, 256, (1,), act="gelu_tanh", norm="gemma"),
    ModelConfig("gemma-3-4b", 2560, 10240, 8, 4, 256, (1,), act="gelu_tanh", norm="gemma"),
    ModelConfig("gemma-3-12b", 3840, 15360, 16, 8, 256, (1, 2), act="gelu_tanh", norm="gemma"),
    ModelConfig("gemma-3-27b", 5376, 21504, 32, 16, 128, (1, 2, 4), act="gelu_tanh", norm="gemma"),
    # Qwen3-MoE: dense-size field is the (unused) dense MLP; experts are moe_intermediate wide
    ModelConfig("qwen3-30b-a3b", 2048, 6144, 32, 4, 128, (1, 2), moe_intermediate=768),
    ModelConfig("qwen3-235b-a22b", 4096, 12288, 64, 4, 128, (4, 8), moe_intermediate=1536),
    # gpt-oss: hidden 2880 (2880 / 8 = 360 vectors: not a power of two), clamped SwiGLU in the MoE kernel
    ModelConfig("gpt-oss-20b", 2880, 2880, 64, 8, 64, (1,), act="swiglu_oai", moe_intermediate=2880),
    ModelConfig("gpt-oss-120b", 2880, 2880, 64, 8, 64, (1, 2, 4), act="swiglu_oai", moe_intermediate=2880),
)
ALL_MODELS: Tuple[ModelConfig, ...] = MODELS + MORE_MODELS


def model(name: str) -> ModelConfig:
    """The config called `name` (any list); KeyError naming the known ones otherwise."""
    for m in ALL_MODELS:
        if m.name == name:
            return m
    raise KeyError(f"unknown model {name!r}; known: {', '.join(m.name for m in ALL_MODELS)}")
