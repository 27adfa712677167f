"""The patch adapter: how SGLang's gemma_rmsnorm callables (sgl_kernel.gemma_rmsnorm,
flashinfer.norm.gemma_rmsnorm) map onto this op's kernel ABI. patch/adapters.py holds the machinery and says
what each field means. The weight is the stored Gemma weight (w - 1); the kernel adds the 1."""
from __future__ import annotations

from astra_sglang.patch.adapters import OpAdapter, contiguous_like, rows_band, weighted_rows

# Calls of 129-256 tokens at widths 3584-5376 stay SGLang's: in context FlashInfer's kernel was as fast or faster
# there in most decode corpora since 2026-11-27 (H200): 256 x 5376 0.914x at 48 replays (resolved slower,
# results/2026-12-02-h200/session40/N) and 0.96x before, 256 x 3840 0.95-1.00x in every variant, 256 x 3584 0.92x
# once and 1.06x on 2026-12-02. 256 x 2304 (1.09x) and every call of up to 128 tokens (1.42-1.95x) stay astra's.
KEEP_TOKENS, KEEP_WIDTHS = (129, 256), (3584, 5376)

ADAPTER = OpAdapter(
    op="gemma_rmsnorm",
    data="input",
    same_dtype=("input", "weight", "out"),
    rowwise=("input", "out"),
    ignorable=frozenset({"enable_pdl"}),
    alloc={"out": contiguous_like("input")},
    normalize=weighted_rows(("input", "out")),
    returns=lambda c: c["out"],
    keeps=rows_band(KEEP_TOKENS, "FlashInfer's gemma_rmsnorm was as fast or faster in context at {}-{} tokens of "
                    "{}-{}".format(*KEEP_TOKENS, *KEEP_WIDTHS), width=KEEP_WIDTHS),
)
