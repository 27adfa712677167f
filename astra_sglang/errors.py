"""One error type for every user-facing failure: one line per problem, non-zero exit."""
from __future__ import annotations

from typing import Tuple


class AstraError(Exception):
    """A failure the user can act on. The CLI prints `error: <message>` and exits 2.

    Several problems found at once (preconditions) travel in one error: `AstraError(a, b)`
    prints as `error: a` and `error: b`, each on its own line, so every place that prints
    `f"error: {e}"` shows them all without knowing about the list."""

    exit_code = 2

    def __init__(self, *messages: str):
        self.messages: Tuple[str, ...] = tuple(str(m) for m in messages) or ("unknown error",)
        super().__init__("\nerror: ".join(self.messages))
