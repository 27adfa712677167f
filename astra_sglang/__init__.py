"""astra-sglang: make SGLang's production GPU kernels faster and put them back."""

__version__ = "0.1.0"
