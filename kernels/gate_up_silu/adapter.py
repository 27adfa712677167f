"""The patch adapter of a fused op: SGLang's LlamaMLP.forward and Qwen2MLP.forward (Qwen3's dense MLP is Qwen2MLP),
0.5.17 and 0.5.23. On CUDA their body is gate_up_proj (MergedColumnParallelLinear -> UnquantizedLinearMethod.apply ->
F.linear), SiluAndMul.forward_cuda (SGLang's silu_and_mul kernel) and down_proj. The method is replaced: a call it
takes runs this op's kernel for the gate_up projection and the activation together, then `self.down_proj` on the
activation exactly as the replaced forward calls it (LlamaMLP: down_proj(x); Qwen2MLP: down_proj(x,
forward_batch=forward_batch)), so down_proj's quantization, astra's linear (where it is on), the tensor-parallel
all-reduce and its variants stay SGLang's. patch/adapters.py holds the machinery and says what each field means.

`expand` declines (the method runs as before) before any work unless:
- x is a 2-D CUDA tensor of at most MAX_TOKENS rows (checked first: every prefill call leaves at once);
- the MLP is SGLang's LlamaMLP or Qwen2MLP (or a subclass: which one decides how down_proj is called);
- act_fn is SGLang's SiluAndMul and would run its CUDA kernel (not torch.compile's native path, aiter, a forced
  fused-op backend, or Qwen2MLP's RL on-policy cast);
- gate_up_proj is a plain MergedColumnParallelLinear (not a LoRA wrapper), without bias, not gathering its output,
  not under 0.5.23's sequence parallelism (its forward all-gathers the input there), and its apply ends in F.linear
  (linear's `apply_path_problem`: unquantized, no AMX / aiter / cutedsl / gemv);
- x and the weight share one fp16 / bf16 dtype, the weight is [2I, H] for x [tokens, H], and the shape rule holds
  (`declined`: H a multiple of 8 and at most MAX_IN_FEATURES, I a multiple of 8);
- 0.5.23's own fusions are off: DualGemm (sm_100 dual GEMM) and DenseSiluAndMulQuant (sm_100 block-FP8).

Tensor parallel is taken: gate_up_proj's forward at TP > 1 is the same local F.linear on [I/tp gate; I/tp up] rows
(no gather: gather_output is False for the MLP), and everything collective happens inside down_proj, which runs as
SGLang calls it. down_proj itself may be any layer."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from astra_sglang.kernels.linear.adapter import apply_path_problem, token_precheck
from astra_sglang.patch.adapters import OpAdapter, contiguity_problem, cuda_dispatch_problem, loaded_class

MAX_TOKENS = 2  # the FMA GEMV's range (kernels/linear: 1-2 tokens); 3+ tokens keep SGLang's forward
# The GEMV loop is linear's 4-row CTA, measured to beat cuBLAS in context up to this row length (linear's 2-row CTAs
# for longer rows are not in this kernel; kernels/linear/RESULTS.md). Every model in the corpus has H <= 8192, so it
# never binds there; wider rows are unmeasured.
MAX_IN_FEATURES = 12288
# The widest intermediate measured to win at 2 tokens (Gemma-3-27B's 21504: 1.10x in context); Gemma-2-27B's 36864
# was 0.984x there (H200, 2026-11-27, results/2026-11-27-h200/session7/ §8), so wider rows keep SGLang's at 2 tokens.
MAX_INTER_AT_2_TOKENS = 21504
DEVICES = ("cuda",)  # where the kernel runs (unit tests widen it to exercise the routing on the CPU)


def declined(tokens: int, in_features: int, out_features: int, act: str = "silu_and_mul") -> Optional[str]:
    """Why x [tokens, in_features] through a [2 * out_features, in_features] gate_up weight stays with SGLang by
    design, or None: the one rule expand and validate (n/a, not a failure) share. act: SGLang's activation kernel
    the op fuses (gate_up_gelu_tanh: gelu_tanh_and_mul, the same width rule)."""
    if tokens > MAX_TOKENS:
        return f"{tokens} tokens > {MAX_TOKENS}: SGLang's GEMM and activation"
    if in_features % 8:
        return f"in_features {in_features} is not a multiple of 8 (the kernel's scalar path is for correctness only)"
    if in_features > MAX_IN_FEATURES:
        return (f"in_features {in_features} > {MAX_IN_FEATURES}: not measured (this GEMV is linear's 4-row CTA, which "
                f"tied cuBLAS on longer rows)")
    if out_features % 8:
        return (f"intermediate width {out_features} is not a multiple of 8: SGLang's {act} takes another "
                f"kernel (sgl_kernel) there")
    if tokens > 1 and out_features > MAX_INTER_AT_2_TOKENS:
        return (f"{tokens} tokens x intermediate {out_features} > {MAX_INTER_AT_2_TOKENS}: slower than SGLang's GEMM "
                f"and activation in context")
    return None


# (kind, module, class) of the MLPs whose forward this op replaces. The kind decides the down_proj call (Qwen2MLP
# passes forward_batch) and the RL on-policy cast (Qwen2MLP's); gate_up_gelu_tanh names the Gemma MLPs.
MLPS = (("llama", "sglang.srt.models.llama", "LlamaMLP"), ("qwen2", "sglang.srt.models.qwen2", "Qwen2MLP"))


def _mlp_kind(mlp, mlps=MLPS) -> Optional[str]:
    """The kind of the first of `mlps` that mlp is an instance of (whose forward this is), or None."""
    for kind, mod, cls in mlps:
        c = loaded_class(mod, cls)
        if c is not None and isinstance(mlp, c):
            return kind
    return None


def _act_problem(act, cls: str = "SiluAndMul", approximate: Optional[str] = None) -> Optional[str]:
    """None where act_fn(gate_up) would run SGLang's activation kernel (`cls`.forward_cuda: SiluAndMul's silu_and_mul;
    GeluAndMul's gelu_tanh_and_mul where its `approximate` is the one given), else why not."""
    mod = sys.modules.get("sglang.srt.layers.activation")
    if mod is None or type(act) is not getattr(mod, cls, None):
        return f"act_fn is {type(act).__name__}, not SGLang's {cls}"
    if approximate is not None and getattr(act, "approximate", None) != approximate:
        return f"{cls}'s approximate is {getattr(act, 'approximate', None)!r}, not {approximate!r}"
    return cuda_dispatch_problem(act, cls)


def _rl_on_policy() -> bool:
    """Qwen2MLP casts x to bf16 for an RL on-policy target (SiluAndMul then runs its native path too)."""
    get_exec = getattr(sys.modules.get("sglang.srt.models.qwen2"), "get_exec", None)
    if get_exec is None:
        return False
    try:
        return get_exec().deterministic.rl_on_policy_target is not None
    except ValueError:  # runtime config not published (outside a server): the method's default
        return False


def _sequence_parallel(lin_mod) -> bool:
    """0.5.23: under Megatron sequence parallelism ColumnParallelLinear.forward all-gathers its input shard first."""
    get_forward = getattr(lin_mod, "get_forward", None)
    if get_forward is None:  # 0.5.17
        return False
    try:
        return bool(getattr(get_forward(), "sp_active", False))
    except Exception:  # noqa: BLE001 - no forward context (outside a server): SGLang's forward reads the same
        return False


def _gate_up_problem(gate_up, x) -> Optional[str]:
    """None where gate_up_proj(x) is ColumnParallelLinear.forward's local F.linear, unquantized and bias-free, else
    why not."""
    lin = sys.modules.get("sglang.srt.layers.linear")
    if lin is None or type(gate_up) is not getattr(lin, "MergedColumnParallelLinear", None):
        return f"gate_up_proj is {type(gate_up).__name__}, not a plain MergedColumnParallelLinear (LoRA or another layer)"
    if getattr(gate_up, "bias", None) is not None:
        return "gate_up_proj has a bias"
    if getattr(gate_up, "gather_output", False):
        return "gate_up_proj gathers its output across ranks"
    if _sequence_parallel(lin):
        return "sequence parallel: gate_up_proj all-gathers its input"
    if not hasattr(gate_up, "quant_method"):
        return "gate_up_proj has no quant_method (a wrapped layer)"
    why = apply_path_problem(gate_up, x)
    return f"gate_up_proj: {why}" if why else None


def _sglang_fusion(mlp) -> Optional[str]:
    """0.5.23's own MLP fusions (Blackwell): DualGemm for gate_up + SwiGLU, DenseSiluAndMulQuant for block FP8."""
    if getattr(getattr(mlp, "dual_gemm", None), "mode", None) is not None:
        return "SGLang's own dual GEMM (gate_up + SwiGLU) serves this MLP"
    if getattr(getattr(mlp, "activation_quant", None), "enabled", False):
        return "SGLang's fused activation + FP8 quant serves this MLP"
    return None


def mlp_expand(mlps=MLPS, act_cls: str = "SiluAndMul", act: str = "silu_and_mul",
               approximate: Optional[str] = None):
    """The expand of a fused gate_up + activation op over `mlps` whose act_fn is SGLang's `act_cls` (running kernel
    `act`; `approximate`: GeluAndMul's); gate_up_gelu_tanh's too."""
    names = " / ".join(cls for _, _, cls in mlps)

    def expand(a: Dict[str, Any]):
        """MLP.forward(self, x[, forward_batch]) -> canonical arguments (plus the down_proj call that `returns`
        makes), or why SGLang keeps it. Every reason to decline comes before any work."""
        import torch

        mlp, x = a["self"], a["x"]
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.device.type not in DEVICES:
            return "x is not a 2-D CUDA tensor"
        t = x.shape[0]
        if t > MAX_TOKENS:  # first: every prefill call passes here
            return f"{t} tokens > {MAX_TOKENS}: SGLang's GEMM and activation"
        if t == 0:
            return "no tokens"
        kind = _mlp_kind(mlp, mlps)
        if kind is None:
            return f"{type(mlp).__name__} is not SGLang's {names}"
        gate_up_proj, down = getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None)
        if not callable(down):
            return "the MLP has no down_proj to call"
        why = _sglang_fusion(mlp) or _act_problem(getattr(mlp, "act_fn", None), act_cls, approximate)
        if why:
            return why
        if kind == "qwen2" and _rl_on_policy():
            return "RL on-policy target (the method casts x to bf16)"
        w = getattr(gate_up_proj, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.device != x.device:
            return "gate_up_proj's weight is not a 2-D tensor on x's device"
        if x.dtype != w.dtype or x.dtype not in (torch.float16, torch.bfloat16):
            return f"x {x.dtype} / gate_up_proj weight {w.dtype}: not one fp16 / bf16 dtype"
        if w.shape[1] != x.shape[1] or w.shape[0] % 2:
            return f"gate_up_proj's weight {tuple(w.shape)} is not [2I, {x.shape[1]}] for x {tuple(x.shape)}"
        why = declined(t, w.shape[1], w.shape[0] // 2, act) or _gate_up_problem(gate_up_proj, x)
        if why:
            return why
        return {"x": x, "weight": w,
                "out": torch.empty((t, w.shape[0] // 2), device=x.device, dtype=x.dtype),
                # what `returns` does with the activation: the replaced forward's own down_proj call
                "down": down, "down_kw": {"forward_batch": a.get("forward_batch")} if kind == "qwen2" else {}}

    return expand


def _normalize(c):
    """x [T, H], weight [2I, H], out [T, I] -> the ABI's tensors and (T, H, I)."""
    x, w, out = c["x"], c["weight"], c["out"]
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] != x.shape[1] or w.shape[0] % 2:
        return f"weight {tuple(w.shape)} is not [2I, H] for x {tuple(x.shape)}"
    t, h, k = x.shape[0], x.shape[1], w.shape[0] // 2
    if tuple(out.shape) != (t, k):
        return f"out {tuple(out.shape)} != {(t, k)}"
    bad = contiguity_problem(c, ("x", "weight", "out"))
    if bad:
        return bad
    return {"x": x, "weight": w, "out": out}, (t, h, k)


def two_steps(act: str = "silu_and_mul"):
    """The `sequence` of a fused gate_up + activation op: SGLang's two steps on canonical tensors, gate_up_proj's
    F.linear (cuBLAS), then its `act` (what SiluAndMul / GeluAndMul.forward_cuda call), into `out`."""

    def sequence(c: Dict[str, Any]) -> None:
        import importlib

        import torch

        fn = getattr(importlib.import_module("sglang.srt.layers.activation"), act)
        original = getattr(fn, "__astra_original__", fn)  # SGLang's own, also where astra's `act` op is patched
        original(torch.nn.functional.linear(c["x"], c["weight"]), c["out"])

    sequence.__doc__ = f"F.linear, then SGLang's {act}, into `out`."
    return sequence


def _returns(c: Dict[str, Any]):
    """What the replaced forward returns: down_proj on the activation, called as that forward calls it."""
    y, _ = c["down"](c["out"], **c["down_kw"])
    return y


def mlp_adapter(op: str, expand, act: str = "silu_and_mul") -> OpAdapter:
    """The adapter of a fused gate_up + `act` op whose `expand` is mlp_expand's (gate_up_gelu_tanh's too)."""
    return OpAdapter(
        op=op,
        data="x",
        same_dtype=("x", "weight", "out"),
        rowwise=("x", "out"),
        normalize=_normalize,
        returns=_returns,
        expand=expand,
        sequence=two_steps(act),
        precheck=token_precheck(1, MAX_TOKENS),  # forward(self, x[, forward_batch=None]): x at position 1
        max_tokens=MAX_TOKENS,
        keeps=lambda dims: declined(*dims, act=act),
        # the activation kernel writes into the ABI's out itself (`sequence`): no returned tensor to copy
    )


# On in `--ops all` since its decode-step A/B over every other default op (H200, 2026-11-27,
# results/2026-11-27-h200/session7/): Qwen3-8B -1.27% / -1.73%, Llama-3-8B -1.06% / -0.57% at batch 1 / 2, greedy
# tokens identical. DEFAULT_OFF = "reason" would take it out of `--ops all` again.
DEFAULT_OFF = ""

ADAPTER = mlp_adapter("gate_up_silu", mlp_expand())
