"""The patch adapter: how SGLang's rmsnorm callables (sgl_kernel.rmsnorm, flashinfer.norm.rmsnorm) map onto
this op's kernel ABI. patch/adapters.py holds the machinery and says what each field means.

Not routed: sglang.kernels.ops.layernorm.norm.rmsnorm (the JIT rmsnorm.cuh, used by vision towers, with its
own hidden-size list) and the HF-parity rmsnorm_hf (cast before the weight multiply: a different rounding)."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguous_like, rows_band, weighted_rows

# Calls of 129-256 tokens at widths 1536-5120 stay SGLang's. There FlashInfer's kernel (512 threads a row, one vector
# each) was as fast or faster in context in every decode corpus since 2026-11-27 (H200, both dtypes, cuBLAS or astra's
# neighbours), through three launch changes (kOne rows, the late trigger, no prefetch): 256 x 4096 0.81-0.98x,
# 256 x 2880 0.87-0.99x, 256 x 1536 0.90-1.07x; at 48 replays 256 x 4096 0.855x and 256 x 2880 0.892x, both resolved
# slower (results/2026-12-02-h200/session40/N2). Narrower and wider rows of 256 tokens win (256 x 512 1.45x,
# 256 x 7168 1.10x there) and stay astra's, as do calls of up to 128 tokens (the corpus has none between 64 and 256).
KEEP_TOKENS, KEEP_WIDTHS = (129, 256), (1536, 5120)

ADAPTER = OpAdapter(
    op="rmsnorm",
    data="input",
    same_dtype=("input", "weight", "out"),
    rowwise=("input", "out"),
    ignorable=frozenset({"enable_pdl"}),
    alloc={"out": contiguous_like("input")},
    normalize=weighted_rows(("input", "out")),
    returns=lambda c: c["out"],
    keeps=rows_band(KEEP_TOKENS, "FlashInfer's rmsnorm was as fast or faster in context at {}-{} tokens of "
                    "{}-{}".format(*KEEP_TOKENS, *KEEP_WIDTHS), width=KEEP_WIDTHS),
)
