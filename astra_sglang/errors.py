"""One error type for every user-facing failure: one line, non-zero exit."""


class AstraError(Exception):
    """A failure the user can act on. The CLI prints `error: <message>` and exits 2."""

    exit_code = 2
