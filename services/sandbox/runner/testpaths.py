"""Which paths of a task's tree are tests or runner inputs (shared by the executor and the runner)."""

from __future__ import annotations

from pathlib import PurePosixPath

TEST_DIRS = frozenset({"tests", "test"})
# Every file name pytest reads configuration from (`_pytest/config/findpaths.py`, pytest 9: `pytest.toml` too); the
# executor also asks the installed pytest for its own list (`trusted.pytest_config_names`).
CONFIG_NAMES = frozenset({"pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                          "setup.cfg"})
# Read by the interpreter or by pytest itself from wherever they sit on a path.
RUNNER_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})


def is_test_path(path: str) -> bool:
    """A test file: inside a `tests/` or `test/` folder, `test_*.py`, `*_test.py`, or `conftest.py`."""
    p = PurePosixPath(path)
    name = p.name
    if any(part in TEST_DIRS for part in p.parts[:-1]):
        return True
    if name == "conftest.py":
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def is_runner_input(path: str, config_names: frozenset[str] = CONFIG_NAMES) -> bool:
    """A file the runner reads before or around the tests: configuration, conftest, site hooks, `.pth` files, or a
    test folder itself (replaced by a file or a link)."""
    p = PurePosixPath(path)
    return (p.name in config_names or p.name in RUNNER_NAMES or p.name.endswith(".pth")
            or p.name in TEST_DIRS)


def is_protected(path: str, config_names: frozenset[str] = CONFIG_NAMES) -> bool:
    """Restored to its pristine content before the tests run, whatever the patch did to it."""
    return is_test_path(path) or is_runner_input(path, config_names)
