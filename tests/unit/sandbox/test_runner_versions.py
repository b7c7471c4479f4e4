"""Which differences between the pytest a task set was built with and the executor's can rename a test."""

from __future__ import annotations

from fleet.contracts.sandbox import describe_runner, runner_mismatch

BUILT = {"python": "3.11.7", "pytest": "9.2.0"}


def test_another_pytest_release_is_named_with_both_versions() -> None:
    why = runner_mismatch(BUILT, {"python": "3.11.7", "pytest": "8.3.5"})
    assert why is not None
    assert "Python 3.11.7, pytest 9.2.0" in why and "Python 3.11.7, pytest 8.3.5" in why and "sandbox.python" in why


def test_another_python_minor_version_is_a_finding_too() -> None:
    assert runner_mismatch(BUILT, {"python": "3.12.3", "pytest": "9.2.0"}) is not None


def test_patch_releases_and_unknown_versions_are_not() -> None:
    assert runner_mismatch(BUILT, {"python": "3.11.9", "pytest": "9.2.1"}) is None
    assert runner_mismatch({}, BUILT) is None  # a set built before versions were recorded
    assert runner_mismatch(BUILT, {"python": "3.11.7"}) is None  # an executor without pytest reports none


def test_versions_read_as_a_sentence() -> None:
    assert describe_runner(BUILT) == "Python 3.11.7, pytest 9.2.0"
    assert describe_runner({}) == "unknown"
