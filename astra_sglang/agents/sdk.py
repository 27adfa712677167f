"""Lazy access to the OpenAI Agents SDK (`pip install 'astra-sglang[agents]'`).

Only API that openai-agents 0.4 ... 0.24 share is used: Agent, Runner, RunConfig, function_tool,
OpenAIChatCompletionsModel, ModelSettings, set_tracing_disabled, the Model interface and
ModelResponse/Usage. openai-agents >= 0.21 needs openai 3, SGLang pins openai 2.x: beside SGLang,
pip resolves an older openai-agents, which this code also runs on.
"""
from __future__ import annotations

from ..errors import AstraError


def require():
    try:
        import agents  # noqa: F401
        from agents.models.interface import Model  # noqa: F401
    except ImportError as e:
        raise AstraError(
            f"optimize needs the OpenAI Agents SDK ({e}): pip install 'astra-sglang[agents]'"
        ) from e
    return agents


def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("openai-agents")
    except Exception:
        return "unknown"
