"""Progress for extract's long steps, on stderr: a tqdm bar where the length is known (unpacking),
an elapsed-time line where it is not (nvcc). Both draw only on a terminal, so logs and captured
output hold just the plain `  · ...` lines the command prints around them."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterable, Iterator, Optional, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def bar(items: Iterable[T], desc: str, unit: str = "it", total: Optional[int] = None) -> Iterator[T]:
    # disable=None: tqdm turns itself off when stderr is not a terminal
    yield from tqdm(items, desc=f"  · {desc}", unit=unit, total=total, disable=None, leave=False)


@contextlib.contextmanager
def ticker(desc: str, every: float = 0.5) -> Iterator[None]:
    """Show `desc` with the seconds spent while the body runs (a step of unknown length)."""
    t = tqdm(total=None, desc=f"  · {desc}", bar_format="{desc} {elapsed}", disable=None, leave=False)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every):
            t.refresh()

    th = threading.Thread(target=tick, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
        t.close()
