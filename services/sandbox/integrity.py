"""Integrity check: an agent patch may change the code under test, never the tests or how they are run.

This check is the policy signal (a patch that tries gets `refused`), not the protection: whatever it lets through,
the executor restores every test file and runner input to its pristine content before the tests run
(`runner.testpaths.is_protected`, `Workspace.restore_pristine`), so no parser here decides what pytest reads.

Refused: any file the task's test patch touches; test files (`tests/` or `test/` folders, `test_*.py`, `*_test.py`,
`conftest.py`); files that would replace the runner (`pytest.py`, `_pytest/`, `pytest/` at the top level or under
`src/`, `sitecustomize.py`, `usercustomize.py`); `pytest.ini`; any change to the pytest section of `setup.cfg`,
`tox.ini` or `pyproject.toml` (the rest of those files stays editable); the project's testing helpers
(`testpaths.is_testing_helper`: `pkg/testing/`, `pkg/_testing.py` ...: a no-op `assert_allclose` passes every test
that calls it); and compiled code (`is_compiled`: `*.pyc`, `__pycache__/`, extension modules), which the import system
runs instead of the source beside it, or without any, while only source is what a patch is graded as. Paths come
from git's own reading of the patch (`git apply --numstat`), so quoting, renames and mode changes cannot hide a file.

Code under test running inside the pytest process is the trusted runner's concern (`runner/plugin.py`).
"""

from __future__ import annotations

import configparser
import tomllib
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import Any

from services.sandbox.runner.testpaths import TEST_DIRS, is_test_file, is_test_path, is_testing_helper

__all__ = ["CONFIG_FILES", "TEST_DIRS", "check_patch", "is_compiled", "is_test_path", "unsafe_path"]
RUNNER_FILES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
                          "sitecustomize.py", "usercustomize.py"})
RUNNER_MODULES = frozenset({"pytest.py", "_pytest", "pytest", "py.py"})
CONFIG_FILES = frozenset({"setup.cfg", "tox.ini", "pyproject.toml"})
# Bytecode and extension modules: FileFinder tries extensions, then source, then sourceless bytecode, and a
# `__pycache__` entry with an unchecked hash (PEP 552) is used without looking at the source at all.
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")


def is_compiled(path: str) -> bool:
    """Compiled code Python would import: `*.pyc`, `*.pyo`, anything in a `__pycache__/`, `*.so`, `*.pyd`."""
    p = PurePosixPath(path)
    return p.name.endswith(COMPILED_SUFFIXES) or "__pycache__" in p.parts


def _runner_reason(path: str) -> str | None:
    p = PurePosixPath(path)
    if p.name in RUNNER_FILES:
        return f"{path} configures or extends the test runner"
    parts = p.parts[1:] if p.parts[:1] == ("src",) else p.parts
    if parts and parts[0] in RUNNER_MODULES:
        return f"{path} would shadow the test runner's own modules"
    return None


def unsafe_path(path: str) -> bool:
    p = PurePosixPath(path)
    return p.is_absolute() or ".." in p.parts or ".git" in p.parts


def _pytest_section(name: str, text: str | None) -> Any:
    """The pytest part of a config file (None when absent); an unreadable file is its own value."""
    if text is None:
        return None
    try:
        if name == "pyproject.toml":
            return tomllib.loads(text).get("tool", {}).get("pytest")
        parser = configparser.RawConfigParser(strict=False)
        parser.read_string(text)
        section = "tool:pytest" if name == "setup.cfg" else "pytest"
        return dict(parser.items(section)) if parser.has_section(section) else None
    except (ValueError, configparser.Error) as exc:
        return f"<unreadable: {type(exc).__name__}>"


def check_patch(
    paths: Iterable[str],
    test_patch_paths: Iterable[str],
    read_before: Callable[[str], str | None],
    read_after: Callable[[str], str | None],
    task_paths: Iterable[str] = (),
) -> str | None:
    """Why the patch is refused, or None. `read_before/after(path)` give a config file's text around the patch.
    `task_paths`: the files the task's own fix changes, code under test whatever their names (`TaskSpec.task_paths`:
    a pytest task fixes `src/_pytest/`, a django one `django/test/`); the test patch's files stay refused."""
    protected, owned = set(test_patch_paths), set(task_paths)
    for path in sorted(set(paths)):
        if unsafe_path(path):
            return f"patch touches {path}, outside the working tree"
        if path in protected:
            return f"patch modifies {path}, a file of the task's test patch"
        if path in owned and not is_compiled(path):
            continue
        if is_test_file(path):
            return f"patch modifies test file {path}"
        reason = _runner_reason(path)
        if reason:
            return f"patch modifies {reason}"
        if is_testing_helper(path):
            return f"patch modifies {path}, a testing helper of the suite (its assertions decide what passes)"
        if is_compiled(path):
            return f"patch carries compiled code {path}: only source is graded, and Python would run this instead"
        name = PurePosixPath(path).name
        if name in CONFIG_FILES and _pytest_section(name, read_before(path)) != _pytest_section(name, read_after(path)):
            return f"patch changes the pytest configuration in {path}"
    return None
