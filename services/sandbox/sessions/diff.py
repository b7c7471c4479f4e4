"""What of a session's changes is graded: everything but its changes to test code (test files and the project's
testing helpers) and compiled code, which are dropped and recorded.

A single-shot patch that touches a test file is refused (`integrity.check_patch`): there it can only be an attempt
on the grading. An agent working in a session, though, is expected to write a reproduction test, or to run and
extend the repository's tests while it works; refusing its whole diff for that would punish good practice and
teach agents never to test. So `finish` grades the diff *without* the files that are tests -- `is_test_path`
(a `tests/` or `test/` folder, `test_*.py`, `*_test.py`, `conftest.py`) or a file of the task's test patch -- and
lists them in the result (`dropped_test_files`, and a note in the verdict's `error`).

Why this cannot be gamed:
- dropping only ever *removes* changes: the graded patch is a subset of what the agent did, graded exactly like a
  submitted patch (a fresh tree, the task's test patch and eval, the integrity check over what remains, pristine
  test files restored before the tests run), so it earns only what its non-test code earns;
- the tests that decide the reward are the task's hidden ones; no test file the agent wrote or changed is in the
  graded tree, so none can replace, shadow or configure them (`conftest.py` included);
- runner inputs that are not tests (`pytest.ini`, the pytest section of `setup.cfg`/`tox.ini`/`pyproject.toml`,
  `sitecustomize.py`, a `pytest/` package) are *not* dropped: they stay in the patch and get it `refused`;
- code that depends on a dropped file (a module importing the agent's test helper) fails in the graded tree.
Renames are read as a deletion and an addition (`--no-renames`), so a move out of a test folder cannot carry a test
file's content along unseen.

The same holds for the project's testing helpers (`testpaths.is_testing_helper`: `pkg/testing/`, `pkg/_testing.py`;
a no-op `assert_allclose` would pass every test calling it) and for compiled code (`integrity.is_compiled`: `.pyc`,
`__pycache__/`, extension modules; an unchecked-hash pyc of a fix runs instead of the buggy source beside it). A
session's commands may leave caches or build outputs behind, so these are dropped, not refused (a single-shot
patch carrying them is refused): the graded tree runs the session's *source* with the suite's own helpers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.sandbox.integrity import is_compiled, is_test_path
from services.sandbox.runner.testpaths import is_test_file, is_testing_helper

_HEADER = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(.+?)\t?$", re.M)


@dataclass
class SessionDiff:
    patch: str = ""
    problem: str | None = None
    """Why the changes cannot be graded (the agent's doing: a huge tree or diff); None when `patch` is the diff."""
    dropped: list[str] = field(default_factory=list)
    """Files the session changed that are left out of `patch`: test files, testing helpers, compiled code."""

    def note(self, error: str) -> str:
        """A verdict's `error` with the dropped files named, by kind."""
        kinds: dict[str, list[str]] = {"test files": [], "testing helpers": [],
                                       "compiled code, only source is graded": []}
        for path in self.dropped:
            kind = ("compiled code, only source is graded" if is_compiled(path) else
                    "testing helpers" if is_testing_helper(path) and not is_test_file(path) else "test files")
            kinds[kind].append(path)
        notes = [f"not graded ({kind}): {', '.join(paths)}" for kind, paths in kinds.items() if paths]
        return "; ".join(filter(None, [error, *notes]))


def test_patch_files(test_patch: str) -> set[str]:
    """The paths a test patch's file headers name (a missed one is still refused by the grading's check)."""
    return {m.group(1) for m in _HEADER.finditer(test_patch) if m.group(1) != "/dev/null"}


def graded_paths(changed: Iterable[str], test_patch: str,
                 task_paths: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(paths graded, test paths dropped) of a session's changed paths; `task_paths` (the files the task's own fix
    changes) are code under test whatever their names."""
    protected, owned = test_patch_files(test_patch), set(task_paths)
    kept: list[str] = []
    dropped: list[str] = []
    for path in sorted({p for p in changed if p}):
        test_like = is_test_path(path) and path not in owned
        (dropped if path in protected or test_like or is_compiled(path) else kept).append(path)
    return kept, dropped


def pathspecs(paths: Iterable[str]) -> list[str]:
    """git pathspecs matching exactly `paths` (no globbing, no magic from the names)."""
    return [f":(literal){p}" for p in paths]
