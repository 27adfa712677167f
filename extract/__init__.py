"""extract: pull an op's production CUDA kernel out of SGLang / FlashInfer into a workspace."""
from .extractor import available_variants, choose_variant, extract  # noqa: F401
from .sources import Root, Sources, discover  # noqa: F401
