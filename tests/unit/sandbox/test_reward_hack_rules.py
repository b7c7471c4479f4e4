"""The path rules of issue 34: a project's testing helpers are test code, compiled Python is never graded."""

from __future__ import annotations

import asyncio
import os
import site
import sys

import pytest

from fleet.config.infra import SandboxConfig
from services.sandbox.integrity import check_patch, is_compiled
from services.sandbox.runner.testpaths import is_protected, is_test_path, is_testing_helper
from services.sandbox.sessions.diff import SessionDiff, graded_paths
from services.sandbox.trusted import TrustedRunner

# Where real projects keep the assertion helpers their tests import.
HELPERS = ["numpy/testing/__init__.py", "numpy/testing/_private/utils.py", "sympy/testing/pytest.py",
           "lib/matplotlib/testing/decorators.py", "pandas/_testing/asserters.py", "pandas/_testing.py",
           "pandas/util/testing.py", "sklearn/utils/_testing.py", "xarray/testing.py", "scipy/_lib/_testutils.py",
           "pylint/testutils/checker_test_case.py", "src/transformers/testing_utils.py",
           "sympy/utilities/pytest.py", "sympy/utilities/randtest.py"]
# Already test files by folder: astropy's and django's helpers.
IN_TEST_FOLDERS = ["astropy/tests/helper.py", "django/test/testcases.py", "django/test/utils.py"]


def _check(paths: list[str]) -> str | None:
    return check_patch(paths, [], lambda _: None, lambda _: None)


@pytest.mark.parametrize("path", HELPERS)
def test_testing_helpers_are_refused_by_name_and_restored_before_the_run(path: str) -> None:
    assert is_testing_helper(path) and is_test_path(path) and is_protected(path)
    assert _check([path]) == (f"patch modifies {path}, a testing helper of the suite (its assertions decide what "
                              "passes)")


@pytest.mark.parametrize("path", IN_TEST_FOLDERS)
def test_helpers_inside_test_folders_were_test_files_already(path: str) -> None:
    assert is_test_path(path) and _check([path]) == f"patch modifies test file {path}"


@pytest.mark.parametrize("path", ["numpy/core/numeric.py", "pkg/contrib/pytest/plugin.py", "pkg/attesting.py",
                                  "docs/testing.rst", "flask/app.py"])
def test_code_named_near_testing_is_code(path: str) -> None:
    assert not is_testing_helper(path) and _check([path]) is None


def test_a_top_level_pytest_module_is_still_reported_as_shadowing_the_runner() -> None:
    assert "would shadow the test runner" in (_check(["pytest.py"]) or "")


@pytest.mark.parametrize("path", ["calc/__pycache__/core.cpython-311.pyc", "calc/core.pyc", "calc/core.pyo",
                                  "calc/_speedups.cpython-311-x86_64-linux-gnu.so", "calc/core.pyd",
                                  "calc/__pycache__/notes.txt"])
def test_compiled_code_is_refused(path: str) -> None:
    assert is_compiled(path)
    reason = _check([path])
    assert reason is not None and reason.startswith(f"patch carries compiled code {path}")


@pytest.mark.parametrize("path", ["calc/core.py", "calc/core.pyi", "docs/so.md", "calc/pyc.py"])
def test_source_is_not_compiled_code(path: str) -> None:
    assert not is_compiled(path)


def test_a_session_diff_keeps_source_and_names_what_it_drops_by_kind() -> None:
    changed = ["calc/core.py", "calc/__pycache__/core.cpython-311.pyc", "calc/testing/__init__.py",
               "tests/test_repro.py", ""]
    kept, dropped = graded_paths(changed, "")
    assert kept == ["calc/core.py"]
    note = SessionDiff(dropped=dropped).note("")
    assert note == ("not graded (test files): tests/test_repro.py; not graded (testing helpers): "
                    "calc/testing/__init__.py; not graded (compiled code, only source is graded): "
                    "calc/__pycache__/core.cpython-311.pyc")


def test_the_isolated_runner_hides_the_base_interpreters_site_packages() -> None:
    # A venv's interpreter over a pyenv/uv Python: the base's site-packages is not the venv's, and a session's
    # plain `python` (no -S) would add it.
    base_sites = [p for p in site.getsitepackages([sys.base_prefix]) if os.path.isdir(p)]
    build = TrustedRunner.build(sys.executable, (), isolated=True, packages=SandboxConfig().runner_packages)
    runner = asyncio.run(build)
    try:
        assert {os.path.realpath(p) for p in base_sites} <= set(runner.hidden_site), runner.hidden_site
    finally:
        runner.remove()


# Real SWE-bench tasks whose fix lives where the rules above look for test code: the task's own gold files.
TASK_OWNED = ["src/_pytest/assertion/rewrite.py", "django/test/testcases.py", "sympy/testing/pytest.py",
              "xarray/testing.py", "lib/matplotlib/testing/decorators.py"]


@pytest.mark.parametrize("path", TASK_OWNED)
def test_the_files_of_the_tasks_own_fix_are_code_under_test_whatever_their_names(path: str) -> None:
    assert _check([path]) is not None  # another task's patch touching it is refused...
    assert check_patch([path], [], lambda _: None, lambda _: None, [path]) is None  # ...this task's fix is not
    assert graded_paths([path], "", [path]) == ([path], [])
    # The test patch's files and compiled code stay refused even when the fix touches them.
    assert check_patch([path], [path], lambda _: None, lambda _: None, [path]) is not None
    pyc = path.replace(".py", ".cpython-311.pyc")
    assert check_patch([pyc], [], lambda _: None, lambda _: None, [pyc]) is not None
