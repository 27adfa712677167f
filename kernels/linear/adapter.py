"""The patch adapter: SGLang's UnquantizedLinearMethod.apply (sglang/srt/layers/quantization/unquant.py) onto this op's
ABI, for decode-sized calls (patch/adapters.py holds the machinery and says what each field means).

Patched: `sglang.srt.layers.quantization.unquant:UnquantizedLinearMethod.apply` (0.5.17 and 0.5.23), the method every
unquantized QKVParallelLinear, MergedColumnParallelLinear, ColumnParallelLinear, RowParallelLinear and ReplicatedLinear
calls from its forward. It is replaced for the whole class, so `expand` takes a call only where apply would end in a
plain cuBLAS F.linear of a decode-sized input:
- x a CUDA tensor of the weight's dtype (fp16 / bf16), at most MAX_TOKENS rows (checked first: prefill calls leave
  at once), in_features a multiple of 8 (the kernel's vector path) and at most MAX_IN_FEATURES; from 3 tokens only
  out_features <= MMA_MAX_OUT_FEATURES, in_features <= MMA_MAX_IN_FEATURES unless out_features <=
  MMA_LONG_MAX_OUT_FEATURES (then up to MMA_LONG_MAX_IN_FEATURES), and only on Hopper (`declined` says the shape rule);
- no bias (the kernel has no epilogue for one);
- apply's other branches not taken: no Intel AMX packing, no aiter, no bf16 GEMM backend of SGLang's own (cutedsl,
  and 0.5.23's opt-in Hopper gemv).
Every other call goes to the method untouched, before any work. The output is allocated as F.linear would
([..., out_features], x's dtype). RowParallelLinear's all-reduce and the layers' output handling stay SGLang's."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Dict, Mapping, Optional, Tuple

from astra_sglang.errors import AstraError
from astra_sglang.patch.adapters import OpAdapter, contiguity_problem


def _env_bound(name: str, default: int, env: Optional[Mapping[str, str]] = None) -> int:
    """A shape bound below, or the environment's value where set (read once, at import: a worker's setting); env:
    another process's environment instead of this one's."""
    v = (os.environ if env is None else env).get(name, "").strip()
    if not v:
        return default
    if not v.isdigit():
        raise AstraError(f"{name}={v!r}: expected a whole number of input features")
    return int(v)


# Decode sizes (H200, RESULTS.md): at 1-2 tokens the FMA path is 1.03-2.25x cuBLAS in context; 3-4 tokens take the
# tensor-core path, 1.06-1.65x in context where out_features <= MMA_MAX_OUT_FEATURES (o_proj, down_proj, TP-sharded
# widths) and about cuBLAS's time on wider outputs (qkv, gate_up: 0.75-1.03x), which stay with cuBLAS. At 8 tokens
# the path is 0.98-1.49x in context, but the decode step at batch 8 gained only 0.8-0.9% (Qwen3-8B,
# Qwen3-30B-A3B) and lost 0.77% (Gemma-2-9B), so more than 4 tokens stay with cuBLAS.
MAX_TOKENS = 4
FMA_MAX_TOKENS = 2
MMA_MAX_OUT_FEATURES = 4096
# 1-2 tokens: rows up to 21504 inputs, on the kernel's 2-row CTAs above 12288 (ASTRA_LONG_ROWS in kernel.cu). The
# 14336-wide down_proj (Llama-3-8B, Gemma-2-9B): 1.10-1.12x cuBLAS in context at 1 token and -3.9% / -4.9% of those
# models' decode step (H200, 2026-11-28). The longer down_proj rows (results/2026-11-30-h200/session24): in context
# 1.08-1.32x (15360 -> 3840 Gemma-3-12B, 18944 -> 3584 Qwen2.5-7B, 21504 -> 5376 Gemma-3-27B; 1-4 tokens); decode step
# on SGLang's default attention, every other default op in both arms: Gemma-3-12B -5.95% / -4.65% at batch 1 / 2,
# Qwen2.5-7B -5.18% / -2.73% / -1.59% at batch 1 / 2 / 4. Gemma-7B's 24576 -> 3072 (results/2026-12-01-h200/session33):
# in context 1.066x / 1.076x at 1 / 2 tokens, its decode step -2.97% / -2.34% at batch 1 / 2. Longer rows are not
# measured. ASTRA_LINEAR_MAX_IN_FEATURES (dev) moves the bound for a step A/B (`e2e --step --arm-env
# A:ASTRA_LINEAR_MAX_IN_FEATURES=12288`: cuBLAS keeps down_proj in arm A).
MAX_IN_FEATURES = _env_bound("ASTRA_LINEAR_MAX_IN_FEATURES", 24576)
# 3-4 tokens (the tensor-core path): up to 12288 inputs, and up to MMA_LONG_MAX_IN_FEATURES (nor past
# MAX_IN_FEATURES) where out_features <= MMA_LONG_MAX_OUT_FEATURES. Batch-4 decode step with the tensor-core path
# taking the 14336-wide down_proj (H200, 2026-11-28, results/2026-11-28-h200x2/session14): Gemma-2-9B (-> 3584)
# -2.53%, Llama-3-8B (-> 4096) +0.37% (slower); in context 4 x 14336 -> 3584 1.03-1.06x, -> 4096 1.005-1.02x;
# 3-4 x 18944 -> 3584 (Qwen2.5-7B) 1.21-1.24x.
# ASTRA_LINEAR_MMA_MAX_IN_FEATURES (dev) moves the first bound for a batch-4 step A/B (then every width up to
# MMA_MAX_OUT_FEATURES).
MMA_MAX_IN_FEATURES = _env_bound("ASTRA_LINEAR_MMA_MAX_IN_FEATURES", 12288)
MMA_LONG_MAX_OUT_FEATURES = 3584
MMA_LONG_MAX_IN_FEATURES = 21504  # the longest row measured at 3-4 tokens (Gemma-3-27B's, 2026-11-30)
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)


def apply_path_problem(layer, x) -> Optional[str]:
    """None where UnquantizedLinearMethod.apply(layer, x) would end in F.linear(x, layer.weight, bias), else why not.
    moe_gate's adapter asks the same of its gate."""
    mod = sys.modules.get("sglang.srt.layers.quantization.unquant")
    if mod is None or type(layer.quant_method) is not getattr(mod, "UnquantizedLinearMethod", None):
        return f"{type(layer.quant_method).__name__}: not the unquantized linear"
    amx = getattr(mod, "use_intel_amx_backend", None)
    if amx is not None and amx(layer):
        return "Intel AMX packed weight"
    if getattr(mod, "_use_aiter", False):
        return "aiter: SGLang runs its own GEMM"
    backend_of = getattr(mod, "get_bf16_gemm_backend", None)
    if backend_of is not None and str(x.dtype) == "torch.bfloat16":
        try:
            b = backend_of()
        except Exception:  # the runtime config is not published (outside a server): the default backend
            b = None
        if b is not None and any(getattr(b, f, lambda: False)() for f in ("is_cutedsl", "is_gemv")):
            return "SGLang's own bf16 GEMM backend (cutedsl / gemv)"
    return None


@functools.lru_cache(maxsize=None)
def _major(device) -> int:
    """The compute capability major of a CUDA device (cached: expand runs on every decode call)."""
    import torch

    return torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0


def _off_hopper(tokens: int, device) -> Optional[str]:
    """3+ tokens need the tensor-core path, which the kernel runs (and was tuned) on sm_90 only."""
    if tokens > FMA_MAX_TOKENS and _major(device) < 9:
        return "3+ tokens off Hopper: the tensor-core path is tuned for sm_90, the FMA path is slower than cuBLAS there"
    return None


def bounds_with(env: Mapping[str, str]) -> Tuple[int, int]:
    """(MAX_IN_FEATURES, MMA_MAX_IN_FEATURES) of a worker started with `env` on top of this process's environment
    (a step A/B arm's --arm-env)."""
    return (_env_bound("ASTRA_LINEAR_MAX_IN_FEATURES", MAX_IN_FEATURES, env),
            _env_bound("ASTRA_LINEAR_MMA_MAX_IN_FEATURES", MMA_MAX_IN_FEATURES, env))


def _kept(dims) -> Optional[str]:
    """The adapter's `keeps` (validate's n/a): the shape rule, and 3+ tokens where the current GPU is not Hopper."""
    import torch

    why = declined(*dims)
    if why is None and dims[0] > FMA_MAX_TOKENS and torch.cuda.is_available():
        why = _off_hopper(dims[0], torch.device("cuda", torch.cuda.current_device()))
    return why


def declined(tokens: int, in_features: int, out_features: int,
             bounds: Optional[Tuple[int, int]] = None) -> Optional[str]:
    """Why a [tokens, in_features] x [out_features, in_features] projection stays with cuBLAS by design, or None: the
    one rule expand, validate (n/a, not a failure) and profile's attribution of cuBLAS kernels to linear share.
    bounds: (MAX_IN_FEATURES, MMA_MAX_IN_FEATURES) of another process (a step A/B arm's --arm-env), else this one's."""
    max_in, mma_max_in = bounds or (MAX_IN_FEATURES, MMA_MAX_IN_FEATURES)
    if tokens > MAX_TOKENS:
        return f"{tokens} tokens > {MAX_TOKENS}: SGLang's cuBLAS GEMM"
    if in_features % 8:
        return f"in_features {in_features} is not a multiple of 8"
    if in_features > max_in:
        return f"in_features {in_features} > {max_in}: not measured on such long rows"
    long_in = max(mma_max_in, min(max_in, MMA_LONG_MAX_IN_FEATURES))
    if tokens > FMA_MAX_TOKENS and in_features > long_in:
        return (f"{tokens} tokens x {in_features} inputs (> {long_in}): the tensor-core path is not measured on such "
                f"long rows")
    if tokens > FMA_MAX_TOKENS and in_features > mma_max_in and out_features > MMA_LONG_MAX_OUT_FEATURES:
        return (f"{tokens} tokens x {in_features} inputs (> {mma_max_in}) x {out_features} outputs "
                f"(> {MMA_LONG_MAX_OUT_FEATURES}): the tensor-core path only ties cuBLAS on such long rows")
    if tokens > FMA_MAX_TOKENS and out_features > MMA_MAX_OUT_FEATURES:
        return (f"{tokens} tokens x {out_features} outputs (> {MMA_MAX_OUT_FEATURES}): cuBLAS is as fast as the "
                f"tensor-core path")
    return None


def _expand(a: Dict[str, Any]):
    """UnquantizedLinearMethod.apply(self, layer, x, bias=None) -> canonical arguments, or why the method keeps it."""
    import torch

    layer, x = a["layer"], a["x"]
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return "x is not a tensor"
    k = x.shape[-1]
    t = x.numel() // k if k else 0
    if t > MAX_TOKENS:  # first: every prefill call of every linear passes here
        return f"{t} tokens > {MAX_TOKENS}: SGLang's cuBLAS GEMM"
    if a.get("bias") is not None:
        return "the layer has a bias"
    w = getattr(layer, "weight", None)
    if not isinstance(w, torch.Tensor) or x.device.type not in DEVICES:
        return "x or the weight is not a CUDA tensor"
    if w.dim() != 2 or w.shape[1] != k:
        return f"x {tuple(x.shape)} does not match weight {tuple(w.shape)}"
    if x.dtype != w.dtype or x.dtype not in (torch.float16, torch.bfloat16):
        return f"x {x.dtype} / weight {w.dtype}: not one fp16 / bf16 dtype"
    why = declined(t, k, w.shape[0]) or _off_hopper(t, x.device) or apply_path_problem(layer, x)
    if why:
        return why
    return {"x": x, "weight": w, "out": torch.empty(x.shape[:-1] + (w.shape[0],), device=x.device, dtype=x.dtype)}


def token_precheck(x_position: int, max_tokens: int, keyword: str = "x", kept_by: str = "SGLang's cuBLAS GEMM"):
    """A precheck for a method taking x [..., features] at `x_position` (or as `keyword`): a call of more than
    max_tokens rows is declined off the raw arguments, before binding (every eager prefill call of every such
    layer passes here); None leaves the call to expand. linear's apply(self, layer, x), moe_gate's
    ReplicatedLinear.forward(self, x) and moe_experts' fused_experts(hidden_states, ...) share it; `kept_by` names
    what serves a declined call."""
    reason = f"more than {max_tokens} tokens: {kept_by}"

    def precheck(args, kwargs) -> Optional[str]:
        x = args[x_position] if len(args) > x_position else kwargs.get(keyword)
        shape = getattr(x, "shape", None)
        if not shape:
            return None
        k = shape[-1]
        return reason if k and x.numel() // k > max_tokens else None

    return precheck


def normalize_linear(c):
    """x [..., in], weight [out, in], out [..., out] -> the ABI's 2-D views and (tokens, in, out). moe_gate's too."""
    x, w, out = c["x"], c["weight"], c["out"]
    k, n = w.shape[1], w.shape[0]
    t = x.numel() // k if k else 0
    bad = contiguity_problem(c, ("x", "weight", "out"))
    if bad:
        return bad
    return {"x": x.view(t, k), "weight": w, "out": out.view(t, n)}, (t, k, n)


def sequence_linear(c: Dict[str, Any]) -> None:
    """SGLang's kernel on canonical tensors: UnquantizedLinearMethod.apply's F.linear (cuBLAS), into `out`. moe_gate's
    too (its gate's apply ends in the same call)."""
    import torch

    c["out"].copy_(torch.nn.functional.linear(c["x"], c["weight"]))


# On by default since 2026-11-26 (H200, every other default op in both arms): decode step -8.95 / -6.22% on
# qwen3-30b-a3b-20l, -12.26 / -9.87% on Qwen3-8B, -8.97 / -6.26% on Llama-3-8B, -8.98 / -8.58% on Gemma-2-9B at batch
# 1 / 2, greedy ids identical (kernels/linear/RESULTS.md). DEFAULT_OFF = "reason" would take it out of `--ops all`.
DEFAULT_OFF = ""

ADAPTER = OpAdapter(
    op="linear",
    data="x",
    same_dtype=("x", "weight", "out"),
    rowwise=("x", "out"),
    normalize=normalize_linear,
    returns=lambda c: c["out"],
    expand=_expand,
    sequence=sequence_linear,
    precheck=token_precheck(2, MAX_TOKENS),  # apply(self, layer, x, bias=None)
    max_tokens=MAX_TOKENS,
    keeps=_kept,
    # bench's installed baseline: F.linear returns a new tensor that `sequence` copies into the ABI's out; the copy
    # is the binding's, timed alone and taken out of SGLang's time
    returned=("out",),
)
