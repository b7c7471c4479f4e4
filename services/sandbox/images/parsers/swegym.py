"""The SWE-Gym fork's parser that swebench 5 does not have (pydantic's), under the fork's name."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_ESCAPES = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))


def parse_log_pytest_pydantic(log: str, test_spec: Any = None) -> dict[str, str]:
    """github.com/SWE-Gym/SWE-Bench-Fork `log_parsers.parse_log_pytest_pydantic` (its debugging print left out):
    colour codes and control characters stripped, `FAILED [ 12%]` read as FAILED, and the `name STATUS` lines of
    older pytest versions read as well as the `STATUS name` summary."""
    from swebench.harness.constants import TestStatus

    statuses = [s.value for s in TestStatus]
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        line = re.sub(r"\[(\d+)m", "", line).translate(_ESCAPES)
        line = re.sub(r"FAILED\s*\[.*?\]", "FAILED", line)
        if any(line.startswith(s) for s in statuses):
            if line.startswith(TestStatus.FAILED.value):
                line = line.replace(" - ", " ")
            case = line.split()
            status_map[case[1]] = case[0]
        elif any(line.endswith(s) for s in statuses):
            case = line.split()
            status_map[case[0]] = case[1]
    return status_map


PARSERS: dict[str, Callable[[str, Any], dict[str, str]]] = {"parse_log_pytest_pydantic": parse_log_pytest_pydantic}
