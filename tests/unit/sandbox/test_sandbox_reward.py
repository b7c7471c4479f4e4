"""`reward_from_verdict`, the only reward mapping: binary, pass rate, format errors, and never an infra failure."""

from __future__ import annotations

import pytest

from fleet.contracts.sandbox import Verdict
from sandbox_client import reward_from_verdict

REPORT = {"FAIL_TO_PASS": {"success": ["a"], "failure": ["b"]}, "PASS_TO_PASS": {"success": ["c", "d"], "failure": []}}


def _done(resolution: str = "NO", **kw: object) -> Verdict:
    return Verdict(status="completed", patch_applied=True, test_patch_applied=True, resolution=resolution,  # type: ignore[arg-type]
                   **kw)  # type: ignore[arg-type]


def test_binary_is_one_only_for_full() -> None:
    assert reward_from_verdict(_done("FULL"), "binary") == 1.0
    assert reward_from_verdict(_done("PARTIAL", report=REPORT), "binary") == 0.0
    assert reward_from_verdict(_done("NO"), "binary") == 0.0


def test_pass_rate_counts_fail_to_pass_and_pass_to_pass() -> None:
    assert reward_from_verdict(_done("PARTIAL", report=REPORT), "pass_rate") == pytest.approx(3 / 4)


def test_pass_rate_without_lists_uses_the_tests_that_ran() -> None:
    assert reward_from_verdict(_done("NO", tests_passed=1, tests_failed=3), "pass_rate") == 0.25


def test_no_usable_patch_gets_the_format_error_reward() -> None:
    assert reward_from_verdict(Verdict(status="not_applied"), "binary", format_error_reward=-0.5) == -0.5


def test_tampering_never_pays_better_than_a_format_error() -> None:
    refused = Verdict(status="refused", patch_applied=True)
    assert reward_from_verdict(refused, "pass_rate", format_error_reward=-0.5) == -0.5
    assert reward_from_verdict(refused, "pass_rate", format_error_reward=0.2) == 0.0


def test_timeout_scores_zero() -> None:
    assert reward_from_verdict(Verdict(status="timeout", patch_applied=True, report=REPORT), "pass_rate") == 0.0


@pytest.mark.parametrize("status", ["infra_error", "pending", "running"])
def test_infrastructure_failures_are_never_scored(status: str) -> None:
    with pytest.raises(ValueError, match="cannot score"):
        reward_from_verdict(Verdict(status=status, error="disk full"), "binary")  # type: ignore[arg-type]


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="reward_mode"):
        reward_from_verdict(_done("FULL"), "best")  # type: ignore[arg-type]


# The unchanged code: its FAIL_TO_PASS tests fail, the rest of the suite passes (as a patch that changes nothing).
UNCHANGED = {"FAIL_TO_PASS": {"success": [], "failure": ["t::f1", "t::f2"]},
             "PASS_TO_PASS": {"success": [f"t::p{i}" for i in range(8)], "failure": []}}


def test_a_patch_that_changes_nothing_earns_the_suite_under_pass_rate_and_nothing_under_fail_to_pass() -> None:
    assert reward_from_verdict(_done("NO", report=UNCHANGED), "pass_rate") == pytest.approx(0.8)
    assert reward_from_verdict(_done("NO", report=UNCHANGED), "fail_to_pass") == 0.0


def test_fail_to_pass_credits_progress_on_the_bug_scaled_by_what_still_passes() -> None:
    half = {"FAIL_TO_PASS": {"success": ["t::f1"], "failure": ["t::f2"]}, "PASS_TO_PASS": UNCHANGED["PASS_TO_PASS"]}
    assert reward_from_verdict(_done("PARTIAL", report=half), "fail_to_pass") == pytest.approx(0.5)
    fixed_but_broke = {"FAIL_TO_PASS": {"success": ["t::f1", "t::f2"], "failure": []},
                       "PASS_TO_PASS": {"success": ["t::p0", "t::p1", "t::p2"], "failure": ["t::p3"]}}
    assert reward_from_verdict(_done("PARTIAL", report=fixed_but_broke), "fail_to_pass") == pytest.approx(0.75)
    full = {"FAIL_TO_PASS": {"success": ["t::f1", "t::f2"], "failure": []}, "PASS_TO_PASS": {}}
    assert reward_from_verdict(_done("FULL", report=full), "fail_to_pass") == 1.0


def test_fail_to_pass_without_lists_is_binary() -> None:
    assert reward_from_verdict(_done("NO", tests_passed=9, tests_failed=1), "fail_to_pass") == 0.0
    assert reward_from_verdict(_done("FULL", tests_passed=10), "fail_to_pass") == 1.0
