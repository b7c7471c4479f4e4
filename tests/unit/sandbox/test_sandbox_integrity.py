"""What an agent patch may not touch: tests, the test patch's files, the runner and its pytest configuration."""

from __future__ import annotations

import pytest

from services.sandbox.integrity import check_patch, is_test_path


def _check(paths: list[str], test_patch: list[str] = (), before: dict | None = None, after: dict | None = None):  # type: ignore[assignment,type-arg]
    return check_patch(paths, test_patch, (before or {}).get, (after or {}).get)


@pytest.mark.parametrize("path", ["tests/helpers.py", "pkg/test/data.json", "test_x.py", "pkg/x_test.py",
                                  "pkg/conftest.py", "conftest.py"])
def test_test_files_are_recognised(path: str) -> None:
    assert is_test_path(path)
    assert _check([path]) is not None


@pytest.mark.parametrize("path", ["pkg/core.py", "pkg/contesting.py", "contest.py", "docs/tests.md", "attest.py"])
def test_source_files_are_not_test_files(path: str) -> None:
    assert not is_test_path(path)
    assert _check([path]) is None


def test_files_of_the_test_patch_are_protected_whatever_their_name() -> None:
    assert _check(["pkg/fixtures.json"], ["pkg/fixtures.json"]) == (
        "patch modifies pkg/fixtures.json, a file of the task's test patch")


@pytest.mark.parametrize("path", ["pytest.py", "_pytest/main.py", "src/pytest/__init__.py", "sitecustomize.py",
                                  "pkg/usercustomize.py", "pytest.ini", "sub/pytest.ini"])
def test_runner_files_are_refused(path: str) -> None:
    reason = _check([path])
    assert reason is not None and path in reason


def test_a_package_module_named_like_the_runner_deeper_down_is_fine() -> None:
    assert _check(["pkg/contrib/pytest/plugin.py"]) is None


def test_pytest_section_changes_are_refused_other_edits_allowed() -> None:
    cfg = "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -q\n"
    assert _check(["setup.cfg"], before={"setup.cfg": cfg},
                  after={"setup.cfg": cfg.replace("name = x", "name = y")}) is None
    reason = _check(["setup.cfg"], before={"setup.cfg": cfg},
                    after={"setup.cfg": cfg.replace("-q", "-p evil")})
    assert reason == "patch changes the pytest configuration in setup.cfg"
    toml = '[project]\nname = "x"\n'
    assert _check(["pyproject.toml"], before={"pyproject.toml": toml},
                  after={"pyproject.toml": toml + '[tool.pytest.ini_options]\naddopts = "-p evil"\n'}) is not None
    assert _check(["tox.ini"], before={}, after={"tox.ini": "[pytest]\naddopts = -x\n"}) is not None
    assert _check(["tox.ini"], before={}, after={"tox.ini": "[tox]\nenvlist = py311\n"}) is None


def test_paths_outside_the_tree_are_refused() -> None:
    assert _check(["../etc/passwd"]) is not None
    assert _check([".git/config"]) is not None
