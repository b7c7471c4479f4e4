"""Progress bars for the waits of a first run (task build, model build, first training step), on stderr.

`counting` is a tqdm bar over known work; `waiting` shows a description with the time spent so far for waits whose
length is unknown, refreshed by a thread so that it moves while the work blocks. Off a terminal (compose logs, CI)
they refresh every few seconds instead of continuously, so logs get a few lines rather than thousands.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm


def _interactive() -> bool:
    return sys.stderr.isatty()


def counting(desc: str, total: int, unit: str = "it") -> tqdm:
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                mininterval=0.2 if _interactive() else 10.0)


@contextmanager
def waiting(desc: str) -> Iterator[tqdm]:
    """`with waiting("making the model"):` -- a line `desc [elapsed]` that ticks until the block ends."""
    bar = tqdm(total=None, desc=desc, bar_format="{desc} [{elapsed}]{postfix}", file=sys.stderr,
               mininterval=0.5 if _interactive() else 10.0)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(1.0 if _interactive() else 10.0):
            bar.refresh()

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
        yield bar
    finally:
        done.set()
        thread.join()
        bar.close()
