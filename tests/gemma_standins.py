"""Stand-ins for SGLang's GemmaRMSNorm and Gemma3RMSNorm, shared by the gemma_post_attention_norms tests (in their
process and in the fresh interpreters they start): the CUDA paths are SGLang's own, compiled from the wheel."""
from __future__ import annotations

import torch

from sglang_source import compile_method


def gemma_norms(root, ln):
    """(GemmaRMSNorm, Gemma3RMSNorm), also set on `ln`: a stand-in sglang.srt.layers.layernorm holding
    gemma_rmsnorm and gemma_fused_add_rmsnorm, which SGLang's forward_cuda (root: the sglang package) reads from it at
    call time. Constructed as (hidden, eps=1e-6, dtype=bf16, gen=None): a random weight; the eps in variance_epsilon
    (GemmaRMSNorm) or eps (Gemma3RMSNorm), as SGLang keeps it."""

    class _Op(torch.nn.Module):  # MultiPlatformOp's dispatch, fixed to forward_cuda at construction
        def __init__(self, h, dtype, gen):
            super().__init__()
            self.weight = torch.nn.Parameter((0.5 * torch.randn(h, generator=gen)).to(dtype), requires_grad=False)
            self.is_torch_compile = False
            self._forward_method = self.forward_cuda

        def forward(self, *a, **k):
            return self._forward_method(*a, **k)

        def forward_native(self, x, residual=None):
            raise AssertionError("native")

    class GemmaRMSNorm(_Op):
        def __init__(self, h, eps=1e-6, dtype=torch.bfloat16, gen=None):
            super().__init__(h, dtype, gen)
            self.variance_epsilon = eps

    class Gemma3RMSNorm(_Op):
        def __init__(self, h, eps=1e-6, dtype=torch.bfloat16, gen=None):
            super().__init__(h, dtype, gen)
            self.eps = eps

    for cls, names in ((GemmaRMSNorm, ("forward_cuda", "_forward_impl")), (Gemma3RMSNorm, ("forward_cuda",))):
        for name in names:
            setattr(cls, name, compile_method(root, "srt/layers/layernorm.py", cls.__name__, name, vars(ln)))
    ln.GemmaRMSNorm, ln.Gemma3RMSNorm = GemmaRMSNorm, Gemma3RMSNorm
    return GemmaRMSNorm, Gemma3RMSNorm
