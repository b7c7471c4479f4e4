"""R2E-Gym's log parser and its exact-match rule, ported from R2E-Gym (`src/r2egym`) line for line.

- `parse_log_pytest` is `repo_analysis/execution_log_parser.parse_log_pytest`, which `parse_log_fn(repo_name)` gives
  for every repository R2E supports (`R2E_REPOS`); its keys are R2E's, not pytest node ids: the summary line
  `PASSED r2e_tests/test_1.py::TestImageFile::test_parser` becomes `TestImageFile.test_parser`. Its statuses,
  PASSED / FAILED / ERROR, are swebench's `TestStatus` values. Before parsing, the log loses the ANSI colour codes and
  carriage returns R2E's `DockerRuntime.run_tests` strips.
- `exact_match` is `DockerRuntime._calculate_reward_r2e`: both maps decoloured (`decolor_dict_keys`), each key cut
  at its first " - ", then reward 1 iff the maps have the same size and every parsed key has the expected status.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

R2E_REPOS = ("sympy", "pandas", "pillow", "scrapy", "pyramid", "tornado", "datalad", "aiohttp", "coveragepy", "numpy",
             "orange3")
"""The `repo_name`s R2E's `parse_log_fn` has a parser for (all of them `parse_log_pytest`); it raises for others."""
PARSER_NAME = "r2e_parse_log_pytest"
_RUN_TESTS_STRIP = re.compile(r"\x1b\[[0-9;]*m|\r")
_DECOLOR = re.compile(r"\u001b\[\d+m")


def parse_log_pytest(log: str | None, test_spec: Any = None) -> dict[str, str]:
    """R2E's parser, with swebench's parser signature (the test spec is not used, as R2E has none)."""
    if log is None:
        return {}
    log = _RUN_TESTS_STRIP.sub("", log)
    test_status_map: dict[str, str] = {}
    if "short test summary info" not in log:
        return test_status_map
    # Substring tests on every line after the header, as R2E has them: a line is PASSED if "PASSED" is anywhere in it.
    for line in log.split("short test summary info")[1].strip().split("\n"):
        if "PASSED" in line:
            test_status_map[".".join(line.split("::")[1:])] = "PASSED"
        elif "FAILED" in line:
            test_status_map[".".join(line.split("::")[1:]).split(" - ")[0]] = "FAILED"
        elif "ERROR" in line:
            test_status_map[".".join(line.split("::")[1:]).split(" - ")[0]] = "ERROR"
    return test_status_map


def _normalised(status: dict[str, str]) -> dict[str, str]:
    decolored = {_DECOLOR.sub("", k): v for k, v in status.items()}
    # A later key (in sorted order) that cuts to the same name overwrites an earlier one, as in R2E's comprehension.
    return {k.split(" - ")[0]: decolored[k] for k in sorted(decolored)}


def exact_match(parsed: dict[str, str], expected: dict[str, str]) -> tuple[bool, list[str], list[str]]:
    """(R2E's reward is 1, expected tests whose status matched, expected tests that did not or are missing).

    R2E compares sizes first and then looks each parsed key up in the expected map; a parsed key the expected map
    lacks raises KeyError there (the run gets no reward), which here is a mismatch.
    """
    got, want = _normalised(parsed), _normalised(expected)
    matched = sorted(k for k, v in want.items() if got.get(k) == v)
    failed = sorted(k for k in want if got.get(k) != want[k])
    match = len(got) == len(want) and all(k in want and got[k] == want[k] for k in got)
    return match, matched, failed


PARSERS: dict[str, Callable[[str, Any], dict[str, str]]] = {PARSER_NAME: parse_log_pytest}
