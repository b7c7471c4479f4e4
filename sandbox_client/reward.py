"""The project's only mapping from a sandbox verdict to a reward (`env.code.reward_mode`)."""

from __future__ import annotations

from typing import get_args

from fleet.contracts.sandbox import RewardMode, Verdict

REWARD_MODES: tuple[str, ...] = get_args(RewardMode)


def _part(report: dict[str, dict[str, list[str]]], name: str) -> tuple[int, int]:
    """(passing, listed) tests of one part of swebench's report (FAIL_TO_PASS, PASS_TO_PASS, ...)."""
    part = report.get(name, {})
    ok = len(part.get("success", []))
    return ok, ok + len(part.get("failure", []))


def _pass_rate(verdict: Verdict) -> float:
    report = verdict.report
    if report:
        parts = [_part(report, name) for name in report]
        ok, total = sum(p[0] for p in parts), sum(p[1] for p in parts)
        # No listed tests at all: swebench counts that as resolved, and so does the rate.
        return ok / total if total else float(verdict.resolution == "FULL")
    ran = verdict.tests_passed + verdict.tests_failed
    return verdict.tests_passed / ran if ran else float(verdict.resolution == "FULL")


def _fail_to_pass(verdict: Verdict) -> float:
    """FAIL_TO_PASS passing x PASS_TO_PASS still passing: the code as it was scores 0 (its FAIL_TO_PASS tests fail),
    whatever share of the suite already passed."""
    report = verdict.report or {}
    fixed, broken = _part(report, "FAIL_TO_PASS")
    kept, kept_total = _part(report, "PASS_TO_PASS")
    if not broken:  # no per-test lists: nothing to give partial credit for
        return float(verdict.resolution == "FULL")
    return fixed / broken * (kept / kept_total if kept_total else 1.0)


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
      pass (without those lists, of the tests that ran); fail_to_pass -> fraction of FAIL_TO_PASS tests that pass
      times the fraction of PASS_TO_PASS tests still passing (without the lists, as binary).
    An `infra_error` (or unfinished) verdict raises ValueError: infrastructure failures are never scored.
    """
    if verdict.status in ("infra_error", "pending", "running"):
        raise ValueError(f"cannot score a {verdict.status} verdict ({verdict.error[:200]}): retry the task instead")
    if mode not in REWARD_MODES:
        raise ValueError(f"env.code.reward_mode must be one of {', '.join(REWARD_MODES)}, got {mode!r}")
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
    if mode == "fail_to_pass":
        return _fail_to_pass(verdict)
    return _pass_rate(verdict)
