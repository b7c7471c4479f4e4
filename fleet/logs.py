"""The fleet's one log format, configured once by each process's entry point (the CLI, every service's `main`, the
trainer): `HH:MM:SS [prefix] L logger: message`. The launcher parses it back (an `E`/`C` line is an error worth
showing when a process dies), so it is defined here, below everything that writes or reads it."""

from __future__ import annotations

import logging


def setup_logging(level: str = "INFO", prefix: str = "") -> None:
    fmt = f"%(asctime)s {prefix}%(levelname).1s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, datefmt="%H:%M:%S", force=True)
