"""Problem statements written from the failing tests, the way a user would file an issue.

Input: pytest's output for the buggy tree (`--tb=short -rfE`). Kept: which tests fail, the test-file frames (the
assertion the user would look at) and the exception lines. Dropped: frames inside the library, which would point
at the mutated line and hand the agent the answer, and captured output.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

_SECTION = re.compile(r"^={5,} (FAILURES|ERRORS|short test summary info|warnings summary|.*(passed|failed).*) ={5,}$")
# pytest pads section titles with `_` to 80 columns, down to a single `_` on each side for long test ids.
_HEADER = re.compile(r"^_+ (.+?) _+$")
_FRAME = re.compile(r"^(\S+?\.py):(\d+): (?:in (\S+)|(\w*Error.*))$")
_CAPTURED = re.compile(r"^-{5,} Captured .* -{5,}$")
_MAX_TESTS_LISTED = 10
_MAX_E_LINES = 12
_MAX_LINE = 300


@dataclass
class FailureExcerpt:
    title: str
    frames: list[str] = field(default_factory=list)
    error: list[str] = field(default_factory=list)

    def render(self) -> str:
        return "\n".join([*self.frames, *self.error])


def _clip(line: str) -> str:
    return line if len(line) <= _MAX_LINE else line[:_MAX_LINE] + " [...]"


def parse_failures(output: str, test_paths: tuple[str, ...]) -> list[FailureExcerpt]:
    """Failure sections of pytest's short traceback output, trimmed to test-file frames and exception lines."""
    out: list[FailureExcerpt] = []
    current: FailureExcerpt | None = None
    in_section = keep_frame = False
    for raw in output.splitlines():
        line = raw.rstrip()
        sec = _SECTION.match(line)
        if sec:
            in_section = sec.group(1) in ("FAILURES", "ERRORS")
            current = None
            continue
        if not in_section:
            continue
        head = _HEADER.match(line)
        if head:
            current = FailureExcerpt(head.group(1))
            out.append(current)
            keep_frame = False
            continue
        if current is None:
            continue
        if _CAPTURED.match(line):
            current = None  # captured stdout/stderr/log of the test: noise for an issue
            continue
        frame = _FRAME.match(line)
        if frame:
            keep_frame = frame.group(1).startswith(test_paths)
            if keep_frame:
                current.frames.append(_clip(line))
        elif line.startswith("E ") or line == "E":
            if len(current.error) < _MAX_E_LINES:
                current.error.append(_clip(line))
        elif keep_frame and line.startswith("    "):
            current.frames.append(_clip(line))
    return out


def _pick(seed: str, options: tuple[str, ...]) -> str:
    return options[int(hashlib.sha256(seed.encode()).hexdigest(), 16) % len(options)]


_OPENINGS = (
    "After upgrading to this version of {pkg}, part of the test suite fails.",
    "Some of {pkg}'s own tests fail on the current code.",
    "I ran the test suite of {pkg} {version} and got failures.",
    "There is a regression in {pkg}: tests that should pass are failing.",
)
_CLOSINGS = (
    "The tests describe the intended behaviour. Please fix the library code (not the tests) so that they pass "
    "without breaking the others.",
    "The tests are correct; the bug is in the library. A fix should make these tests pass and keep the rest green.",
)


def write_statement(
    instance_id: str, package: str, version: str, failing: list[str], output: str, test_paths: tuple[str, ...]
) -> str:
    """An issue-like description of the failing tests (no library frames, so no pointer at the changed line)."""
    failing = sorted(failing)
    lines = [_pick(instance_id + "o", _OPENINGS).format(pkg=package, version=version), ""]
    lines.append("This test fails:" if len(failing) == 1 else f"These {len(failing)} tests fail:")
    lines += [f"- `{t}`" for t in failing[:_MAX_TESTS_LISTED]]
    if len(failing) > _MAX_TESTS_LISTED:
        lines.append(f"- ... and {len(failing) - _MAX_TESTS_LISTED} more")
    # Sorted by test: the order tests run in is not part of the bug.
    excerpts = sorted((e for e in parse_failures(output, test_paths) if e.error), key=lambda e: e.title)
    if excerpts:
        shown = excerpts[:2]
        lines += ["", "Output of the failing test" + ("s" if len(shown) > 1 else "") + " (trimmed):", ""]
        for e in shown:
            lines += ["```", f"{e.title}", e.render(), "```"]
    lines += ["", _pick(instance_id + "c", _CLOSINGS)]
    return "\n".join(lines)
