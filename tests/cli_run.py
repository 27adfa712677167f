"""The CLI run in-process from tests, and the contract every bad input keeps: stderr ends with its
`error:` line(s) and holds no traceback."""
from __future__ import annotations

from typing import List, Tuple

from astra_sglang.cli import main


def run_cli(args: List[str], capsys) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of `astra-sglang ARGS`."""
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def error_lines(err: str) -> List[str]:
    """The error lines, asserting stderr ends with them and holds no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("error: ")]
    assert errs and lines[-len(errs):] == errs, err
    assert "Traceback" not in err
    return errs


def one_error(err: str, *needles: str) -> str:
    """Exactly one error line, the last, holding every needle."""
    errs = error_lines(err)
    assert len(errs) == 1, err
    for n in needles:
        assert n in errs[0], errs[0]
    return errs[0]
