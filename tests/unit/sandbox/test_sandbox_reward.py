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
