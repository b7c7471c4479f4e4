"""The project's only mapping from a sandbox verdict to a reward (`env.code.reward_mode`)."""

from __future__ import annotations

from typing import Literal

from fleet.contracts.sandbox import Verdict

RewardMode = Literal["binary", "pass_rate"]


def _pass_rate(verdict: Verdict) -> float:
    report = verdict.report
    if report:
        ok = sum(len(part.get("success", [])) for part in report.values())
        total = ok + sum(len(part.get("failure", [])) for part in report.values())
        # No listed tests at all: swebench counts that as resolved, and so does the rate.
        return ok / total if total else float(verdict.resolution == "FULL")
    ran = verdict.tests_passed + verdict.tests_failed
    return verdict.tests_passed / ran if ran else float(verdict.resolution == "FULL")


def reward_from_verdict(verdict: Verdict, mode: RewardMode = "binary", format_error_reward: float = 0.0, *,
                        integrity_violation_reward: float = -1.0) -> float:
    """Reward of one answer.

    - no usable patch (`patch_applied` false: a format error, or a patch git could not apply): `format_error_reward`;
    - refused by the integrity check: `min(0, format_error_reward)`, so tampering never pays better than a malformed
      answer;
    - integrity_violation (the run's outcome could not be believed: a forged report, pytest manipulated from code
      under test): `integrity_violation_reward` (`env.code.integrity_violation_reward`, default -1), below any
      honest outcome so that a cheat that is caught never pays;
    - timeout: 0;
    - completed: binary -> 1.0 iff resolution is FULL; pass_rate -> fraction of FAIL_TO_PASS + PASS_TO_PASS tests that
      pass (without those lists, of the tests that ran).
    An `infra_error` (or unfinished) verdict raises ValueError: infrastructure failures are never scored.
    """
    if verdict.status in ("infra_error", "pending", "running"):
        raise ValueError(f"cannot score a {verdict.status} verdict ({verdict.error[:200]}): retry the task instead")
    if mode not in ("binary", "pass_rate"):
        raise ValueError(f"env.code.reward_mode must be 'binary' or 'pass_rate', got {mode!r}")
    if verdict.status == "refused":
        return min(0.0, format_error_reward)
    if verdict.status == "integrity_violation":
        return integrity_violation_reward
    if not verdict.patch_applied:
        return format_error_reward
    if verdict.status == "timeout":
        return 0.0
    if mode == "binary":
        return 1.0 if verdict.resolution == "FULL" else 0.0
    return _pass_rate(verdict)
