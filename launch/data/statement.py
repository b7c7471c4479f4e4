"""Problem statements written from the failing tests, the way a user would file an issue.

Input: pytest's output for the buggy tree (`--tb=short -rfE`). Kept: which tests fail, the test-file frames (the
assertion the user would look at) and the exception lines. Dropped by default: frames inside the library, which
point at the line that raised (often the mutated one), and captured output. A recipe with
`statement_frames: repository` keeps the library's frames too, as a user pasting the whole traceback would: an easier
task, whose statement localises every bug that raises inside the library.
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


# Python 3.11+ underlines the failing expression (`^^^^`, `~~~`): noise next to the line itself, dropped with the
# library's frames (the default statements stay as sets built before were written).
_MARKERS = re.compile(r"^\s+[\^~]+[\^~ ]*$")
# Of a long run of library frames a statement shows the outermost and the innermost: where the tests entered the
# library and where it raised, as a user trimming a traceback for an issue would.
_LIBRARY_FRAMES_KEPT = (2, 2)


@dataclass
class FailureExcerpt:
    title: str
    frames: list[list[str]] = field(default_factory=list)
    """Each frame's lines: its `path:line: in name` header, then its source lines."""
    library: list[bool] = field(default_factory=list)
    """Per frame: inside the library (only with `library_frames`)."""
    error: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines: list[str] = []
        run: list[list[str]] = []

        def flush() -> None:
            head, tail = _LIBRARY_FRAMES_KEPT
            if len(run) > head + tail + 1:
                kept = [*run[:head], [f"    [... {len(run) - head - tail} more frames ...]"], *run[-tail:]]
            else:
                kept = run
            lines.extend(line for frame in kept for line in frame)
            run.clear()

        for frame, in_library in zip(self.frames, self.library, strict=True):
            if in_library:
                run.append(frame)
                continue
            flush()
            lines.extend(frame)
        flush()
        return "\n".join([*lines, *self.error])


def _clip(line: str) -> str:
    return line if len(line) <= _MAX_LINE else line[:_MAX_LINE] + " [...]"


def _in_repository(path: str) -> bool:
    # pytest prints paths under its rootdir (the checkout) relative, the interpreter's and site-packages' absolute.
    return not path.startswith(("/", "..", "<"))


def parse_failures(output: str, test_paths: tuple[str, ...], *, library_frames: bool = False
                   ) -> list[FailureExcerpt]:
    """Failure sections of pytest's short traceback output, trimmed to test-file frames (with `library_frames`,
    every frame in the repository) and exception lines."""
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
            path = frame.group(1)
            in_tests = path.startswith(test_paths)
            keep_frame = in_tests or (library_frames and _in_repository(path))
            if keep_frame:
                current.frames.append([_clip(line)])
                current.library.append(not in_tests)
        elif line.startswith("E ") or line == "E":
            if len(current.error) < _MAX_E_LINES:
                current.error.append(_clip(line))
        elif keep_frame and line.startswith("    ") and not (library_frames and _MARKERS.match(line)):
            current.frames[-1].append(_clip(line))
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
    instance_id: str, package: str, version: str, failing: list[str], output: str, test_paths: tuple[str, ...],
    *, library_frames: bool = False,
) -> str:
    """An issue-like description of the failing tests; without `library_frames`, no frame inside the library, so
    no pointer at the changed line."""
    failing = sorted(failing)
    lines = [_pick(instance_id + "o", _OPENINGS).format(pkg=package, version=version), ""]
    lines.append("This test fails:" if len(failing) == 1 else f"These {len(failing)} tests fail:")
    lines += [f"- `{t}`" for t in failing[:_MAX_TESTS_LISTED]]
    if len(failing) > _MAX_TESTS_LISTED:
        lines.append(f"- ... and {len(failing) - _MAX_TESTS_LISTED} more")
    # Sorted by test: the order tests run in is not part of the bug.
    excerpts = sorted((e for e in parse_failures(output, test_paths, library_frames=library_frames) if e.error),
                      key=lambda e: e.title)
    if excerpts:
        shown = excerpts[:2]
        lines += ["", "Output of the failing test" + ("s" if len(shown) > 1 else "") + " (trimmed):", ""]
        for e in shown:
            lines += ["```", f"{e.title}", e.render(), "```"]
    lines += ["", _pick(instance_id + "c", _CLOSINGS)]
    return "\n".join(lines)
