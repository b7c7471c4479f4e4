"""The executor's log line for each run, with its phases (where a slow run's time went), and its reader:
`benchmarks/gpu_fleet_swe.py` sums a fleet's runs from the sandbox service's log with it."""

from __future__ import annotations

import re

RUN_LOG = "task %s@%.12s: %s %s in %.2f s (%s)"
_RUN_LINE = re.compile(r"task \S+: (\w+) \w* ?in [0-9.]+ s \(((?:\w+=[0-9.]+ ?)*)\)")


def read_run_log(text: str) -> list[tuple[str, dict[str, float]]]:
    """(status, timings) of every run line in an executor's log, in order."""
    return [(m[1], {k: float(v) for k, v in (kv.split("=", 1) for kv in m[2].split())})
            for m in _RUN_LINE.finditer(text)]
