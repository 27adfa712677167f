"""The patch adapter of a fused op: SGLang's LlamaAttention, Gemma2Attention, Qwen2Attention, Qwen2MoeAttention and
MixtralAttention forwards (spec.REPLACES; 0.5.17, 0.5.23: the same body, and the attributes this adapter reads). On
CUDA that body is the qkv GEMM, the JIT rope in place (RotaryEmbedding.forward_cuda ->
apply_rope_with_cos_sin_cache_inplace, no store), then the attention, whose backend stores the KV first
(MHATokenToKVPool.set_kv_buffer -> store_cache), and o_proj. The method is replaced where SGLang
would fuse a KV store (enable_fused_set_kv_buffer: a bf16 MHA pool, no SWA pool, no context parallelism, the checks
qknorm_rope_store's dense site makes; Gemma-2's sliding window is the attention's, over a plain pool): it runs the
GEMM, this op's kernel (k rotated in place and stored with v, q rotated into a fresh contiguous q_out) and the
attention on q_out, k, v with save_kv_cache=False, as SGLang's own Qwen3-MoE path does.
patch/adapters.py holds the machinery and says what each field means.

Why q_out: handed the column view of qkv (rows q_size + 2 kv_size apart), SGLang 0.5.17's fa3 backend copies q
(q.contiguous()), one more kernel a layer from batch 2 on (28 more copy kernels in a Qwen2.5-7B decode step at batch 2
than at 1, H200). With q_out separate the kernel never writes q, so a failed self-check (patch/ops.py restores the
in-place outputs, here k and the cache rows, then reruns SGLang's sequence) has SGLang's own q to rerun on."""
from __future__ import annotations

from typing import Any, Dict

from astra_sglang.kernels.qknorm_rope_store.adapter import (_attend_without_store, _dense_canonical, _dense_store_path,
                                                            _rope_path, _rope_then_store)
from astra_sglang.kernels.rope_store.adapter import _rope_store_normalize
from astra_sglang.patch.adapters import OpAdapter, env_switch, new_q_out, q_out_stride

# ASTRA_DRS_Q_OUT=0 (dev): q back in place in the qkv output (q_out is q's own view, q_out_stride = q_stride) and the
# attention handed the column view as before q_out existed: arm A of the step A/B that measures the copy q_out saves
# (`e2e --step ... --arm-env A:ASTRA_DRS_Q_OUT=0`). Read when the adapter is imported (a worker's environment), as
# the other adapters' switches. Off, a failed self-check restores k but not q (q is an input, not snapshotted):
# SGLang's sequence then reruns on the q the kernel already rotated, so that one call's q is wrong before the op
# disables itself. On (the default) q is never written.
Q_OUT = env_switch("ASTRA_DRS_Q_OUT", True)
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to run expand on the CPU)


def _expand(a: Dict[str, Any]):
    """An attention forward(self, positions, hidden_states, forward_batch) of spec.REPLACES -> canonical arguments, or
    why SGLang keeps it. Every reason to decline comes before the qkv GEMM: after it, SGLang's kernel sequence serves
    what the kernel does not take (patch/apply.py not_covered)."""
    import torch

    attn, positions, hs, fb = a["self"], a["positions"], a["hidden_states"], a["forward_batch"]
    if not isinstance(hs, torch.Tensor) or hs.device.type not in DEVICES or hs.dim() != 2:
        return "hidden_states is not a 2-D CUDA tensor"
    why = _dense_store_path(attn, fb) or _rope_path(attn.rotary_emb)
    if why:
        return why
    c = _dense_canonical(attn, positions, hs, fb)
    c["q_out"] = new_q_out(c["q"], Q_OUT)
    return c


def _normalize(c):
    """rope_store's checks of q, k, v, the caches, positions and slots, then q_out's (q_out_stride the last dim)."""
    res = _rope_store_normalize(c)
    if isinstance(res, str):
        return res
    views, dims = res
    qos = q_out_stride(c, dims)
    if isinstance(qos, str):
        return qos
    views["q_out"] = c["q_out"]
    return views, dims + (qos,)


ADAPTER = OpAdapter(
    op="dense_rope_store",
    data="q",
    same_dtype=("q", "q_out", "k", "v", "k_cache", "v_cache"),
    fp32=("cos_sin_cache",),
    rowwise=("q", "q_out", "k", "v", "positions", "out_loc"),
    normalize=_normalize,
    returns=_attend_without_store,
    expand=_expand,
    sequence=_rope_then_store,
    slot_indexed={"k_cache": "out_loc", "v_cache": "out_loc"},
)
