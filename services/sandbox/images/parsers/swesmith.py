"""Log parsers of the SWE-smith runtime (swesmith 0.0.9), registered as `swesmith_*` names.

Each is a line-for-line port of the parser a SWE-smith repo profile grades with (`RepoProfile.log_parser`, or the
module function a profile's `log_parser` delegates to); `PORTED_FROM` names the source of each, and
`scripts/regen_swesmith_profiles.py` reads it to decide which profiles can be graded. None is identical to a parser
of swebench 5's PARSER_REGISTRY, so none reuses a swebench name: swebench's `parse_log_pytest` reads the `-rA`
summary where SWE-smith reads `--verbose` result lines, its `parse_log_gotest` needs the `(0.00s)` suffix and ignores
the package `FAIL` lines SWE-smith counts, its `parse_log_cargo` and `parse_log_jest` strip names SWE-smith keeps.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Parser = Callable[[str, Any], dict[str, str]]

# swebench's TestStatus in its declaration order: the pytest parser below tries them in this order and a later
# match overrides an earlier one, as SWE-smith's loop over the enum does.
_STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
_PYTEST = [(s, re.compile(rf"^(\S+)(\s+){s}")) for s in _STATUSES]


def parse_pytest_verbose(log: str, test_spec: Any = None) -> dict[str, str]:
    """`PythonProfile.log_parser`: `pytest --verbose` lines, `path::test STATUS [ n%]`."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        for status, pattern in _PYTEST:
            match = pattern.match(line)
            if match:
                status_map[match.group(1)] = status
    return status_map


_GO = [(re.compile(r"--- PASS: (\S+)"), "PASSED"), (re.compile(r"--- FAIL: (\S+)"), "FAILED"),
       (re.compile(r"FAIL:?\s?(.+?)\s"), "FAILED"), (re.compile(r"--- SKIP: (\S+)"), "SKIPPED")]


def parse_go_test(log: str, test_spec: Any = None) -> dict[str, str]:
    """`GoProfile.log_parser`: `go test -v` result lines; a failing package's `FAIL\\t<pkg>` line counts as a failed
    test named after the package."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        for pattern, status in _GO:
            match = pattern.match(line.strip())
            if match:
                status_map[match.group(1)] = status
                break
    return status_map


def parse_cargo_test(log: str, test_spec: Any = None) -> dict[str, str]:
    """`RustProfile.log_parser`: `test <name> ... ok|FAILED` lines of `cargo test`."""
    status_map: dict[str, str] = {}
    for line in log.splitlines():
        line = line.removeprefix("test ")
        if "... ok" in line:
            status_map[line.rsplit(" ... ", 1)[0].strip()] = "PASSED"
        elif "... FAILED" in line:
            status_map[line.rsplit(" ... ", 1)[0].strip()] = "FAILED"
    return status_map


_JEST = re.compile(r"^\s*(✓|✕|○)\s(.+?)(?:\s\((\d+\s*m?s)\))?$")
_JEST_STATUS = {"✓": "PASSED", "✕": "FAILED", "○": "SKIPPED"}


def parse_jest(log: str, test_spec: Any = None) -> dict[str, str]:
    """`javascript.parse_log_jest`: `jest --verbose` lines (names kept as matched, unlike swebench's)."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        match = _JEST.match(line.strip())
        if match:
            status_map[match.group(2)] = _JEST_STATUS[match.group(1)]
    return status_map


_MOCHA = re.compile(r"^\s*([✓✔]|✖|-)\s(.+?)(?:\s\((\d+\s*m?s)\))?$")
_MOCHA_FAIL = re.compile(r"^\s*\d+\)\s+(.+?)(?:\s\((\d+\s*m?s)\))?$")
_MOCHA_STATUS = {"✓": "PASSED", "✔": "PASSED", "✖": "FAILED", "-": "SKIPPED"}


def parse_mocha(log: str, test_spec: Any = None) -> dict[str, str]:
    """`javascript.parse_log_mocha`: mocha's spec reporter, and its numbered failure list."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        match = _MOCHA.match(line.strip())
        if match:
            status_map[match.group(2)] = _MOCHA_STATUS[match.group(1)]
            continue
        failed = _MOCHA_FAIL.match(line.strip())
        if failed:
            status_map[failed.group(1)] = "FAILED"
    return status_map


_VITEST = [(re.compile(r"^✓\s+(.+?)(?:\s+\([\.\d]+ms\))?$"), "PASSED"),
           (re.compile(r"^❯\s+(.+?)(?:\s+\(.*?\))?$"), "FAILED"),
           (re.compile(r"^✗\s+(.+?)(?:\s+\([\.\d]+ms\))?$"), "FAILED"),
           (re.compile(r"^○\s+(.+?)(?:\s+\([\.\d]+ms\))?$"), "SKIPPED"),
           (re.compile(r"^✓\s+(.+?)$"), "PASSED"), (re.compile(r"^✗\s+(.+?)$"), "FAILED"),
           (re.compile(r"^○\s+(.+?)$"), "SKIPPED")]


def parse_vitest(log: str, test_spec: Any = None) -> dict[str, str]:
    """`javascript.parse_log_vitest`: one entry per test file (`✓ file (n tests)` / `❯ file (n tests | k failed)`)."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        for pattern, status in _VITEST:
            match = pattern.match(line.strip())
            if match:
                name = match.group(1).strip()
                status_map[name.split("(")[0].strip() if "(" in name else name] = status
                break
    return status_map


_KARMA = (re.compile(r"Executed\s+(\d+)\s+of\s+\d+\s+SUCCESS"),
          re.compile(r"Executed\s+\d+\s+of\s+\d+\s+\((\d+)\s+FAILED\)"),
          re.compile(r"Executed\s+\d+\s+of\s+(\d+)\s+\((\d+)\s+skipped\)"))


def parse_karma(log: str, test_spec: Any = None) -> dict[str, str]:
    """`javascript.parse_log_karma`: karma prints counts only, so SWE-smith's tests are numbered placeholders."""
    passed = failed = skipped = 0
    for line in log.split("\n"):
        if m := _KARMA[0].search(line):
            passed = max(passed, int(m.group(1)))
        if m := _KARMA[1].search(line):
            failed = max(failed, int(m.group(1)))
        if m := _KARMA[2].search(line):
            skipped = max(skipped, int(m.group(2)))
    return {**{f"karma_unit_test_{i + 1}": "PASSED" for i in range(passed)},
            **{f"karma_unit_test_failed_{i + 1}": "FAILED" for i in range(failed)},
            **{f"karma_unit_test_skipped_{i + 1}": "SKIPPED" for i in range(skipped)}}


_JASMINE = re.compile(r"(\d+)\s+specs?,\s+(\d+)\s+failures?(?:,\s+(\d+)\s+pending\s+specs?)?")


def parse_jasmine(log: str, test_spec: Any = None) -> dict[str, str]:
    """`javascript.parse_log_jasmine`: the first `N specs, F failures, P pending specs` summary, as placeholders."""
    for line in log.split("\n"):
        match = _JASMINE.search(line)
        if match:
            total, failures = int(match.group(1)), int(match.group(2))
            pending = int(match.group(3)) if match.group(3) else 0
            return {**{f"jasmine_spec_{i + 1}": "PASSED" for i in range(total - failures - pending)},
                    **{f"jasmine_spec_failed_{i + 1}": "FAILED" for i in range(failures)},
                    **{f"jasmine_spec_pending_{i + 1}": "SKIPPED" for i in range(pending)}}
    return {}


PORTED_FROM: dict[str, str] = {
    "PythonProfile.log_parser": "swesmith_pytest",
    "GoProfile.log_parser": "swesmith_gotest",
    "RustProfile.log_parser": "swesmith_cargo",
    "javascript.parse_log_jest": "swesmith_jest",
    "javascript.parse_log_mocha": "swesmith_mocha",
    "javascript.parse_log_vitest": "swesmith_vitest",
    "javascript.parse_log_karma": "swesmith_karma",
    "javascript.parse_log_jasmine": "swesmith_jasmine",
}
"""swesmith source (`Class.log_parser`, or `module.function` a profile's parser returns) -> registered name."""

PARSERS: dict[str, Parser] = {
    "swesmith_pytest": parse_pytest_verbose, "swesmith_gotest": parse_go_test, "swesmith_cargo": parse_cargo_test,
    "swesmith_jest": parse_jest, "swesmith_mocha": parse_mocha, "swesmith_vitest": parse_vitest,
    "swesmith_karma": parse_karma, "swesmith_jasmine": parse_jasmine,
}
