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


# A project's own testing helpers, by the names real projects give them: the assertion functions the tests call
# (`assert_allclose`, `raises`, `assert_frame_equal`) decide the outcome as much as the tests do. Folders:
# `numpy/testing/`, `sympy/testing/`, `matplotlib/testing/`, `torch/testing/`, `pandas/_testing/`, `pylint/testutils/`;
# modules: `sklearn/utils/_testing.py`, `pandas/util/testing.py`, `xarray/testing.py`, `scipy/_lib/_testutils.py`,
# `transformers/testing_utils.py`, and sympy < 1.6's `sympy/utilities/pytest.py` (`raises`) and `randtest.py`
# (`verify_numerically`). `astropy/tests/helper.py` and `django/test/` are inside test folders already.
TESTING_DIRS = frozenset({"testing", "_testing", "testutils", "_testutils", "test_utils", "testing_utils"})
TESTING_MODULES = frozenset({f"{d}.py" for d in TESTING_DIRS} | {"pytest.py", "randtest.py"})


def is_test_file(path: str) -> bool:
    """A test file: inside a `tests/` or `test/` folder, `test_*.py`, `*_test.py`, or `conftest.py`."""
    p = PurePosixPath(path)
    name = p.name
    if any(part in TEST_DIRS for part in p.parts[:-1]):
        return True
    if name == "conftest.py":
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def is_testing_helper(path: str) -> bool:
    """A file of the project's testing helpers: inside a `testing/`, `_testing/`, `testutils/`, `test_utils/` ...
    folder, or a module named `testing.py`, `_testing.py`, `testutils.py`, `pytest.py`, `randtest.py` ..."""
    p = PurePosixPath(path)
    return p.name in TESTING_MODULES or any(part in TESTING_DIRS for part in p.parts[:-1])


def is_test_path(path: str) -> bool:
    """Test code: a test file or a testing helper (protected alike: restored, dropped from a session's diff, and
    trusted by the runner as the tests themselves are, since what runs is always their pristine content)."""
    return is_test_file(path) or is_testing_helper(path)


def is_runner_input(path: str, config_names: frozenset[str] = CONFIG_NAMES) -> bool:
    """A file the runner reads before or around the tests: configuration, conftest, site hooks, `.pth` files, or a
    test folder itself (replaced by a file or a link)."""
    p = PurePosixPath(path)
    return (p.name in config_names or p.name in RUNNER_NAMES or p.name.endswith(".pth")
            or p.name in TEST_DIRS)


def is_protected(path: str, config_names: frozenset[str] = CONFIG_NAMES) -> bool:
    """Restored to its pristine content before the tests run, whatever the patch did to it."""
    return is_test_path(path) or is_runner_input(path, config_names)
