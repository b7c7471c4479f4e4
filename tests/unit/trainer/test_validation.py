"""Validation's verdict breakdown and its `grpo-fleet status` line (trainer/validation.py, launch/status.py)."""

from __future__ import annotations

import pytest

from fleet.contracts.groups import Trajectory
from fleet.contracts.sandbox import ResolutionName, TaskStatus, Verdict
from launch.status import validation_lines
from trainer.validation import VERDICT_KINDS, summarize, verdict_kind


@pytest.mark.parametrize(("status", "resolution", "kind"), [
    ("completed", "FULL", "resolved"),
    ("completed", "PARTIAL", "tests_failed"),
    ("completed", "NO", "tests_failed"),
    ("format_error", "NO", "no_patch"),
    ("not_applied", "NO", "patch_not_applied"),
    ("timeout", "NO", "timeout"),
    ("refused", "FULL", "integrity_refused"),
    ("infra_error", "FULL", "infra_error"),
])
def test_each_verdict_falls_in_one_bucket(status: TaskStatus, resolution: ResolutionName, kind: str) -> None:
    assert verdict_kind(Verdict(status=status, resolution=resolution)) == kind


def _traj(status: TaskStatus, resolution: ResolutionName = "NO", reward: float = 0.0) -> Trajectory:
    return Trajectory([], [], [], reward, Verdict(status=status, resolution=resolution), "stop")


def test_accuracy_is_full_resolutions_over_graded_tasks_and_missing_tasks_are_infrastructure() -> None:
    trajs = [_traj("completed", "FULL", 1.0), _traj("completed"),
             _traj("not_applied"), _traj("format_error")]
    m = summarize(trajs, tasks=5)
    assert sum(m[f"val/verdict/{k}"] for k in VERDICT_KINDS) == m["val/tasks"] == 5
    assert (m["val/verdict/infra_error"], m["val/graded"], m["val/accuracy"]) == (1, 4, 0.25)
    assert m["val/incomplete"] == 1.0


def test_a_round_with_no_graded_task_reports_no_accuracy() -> None:
    m = summarize([], tasks=3)
    assert "val/accuracy" not in m and m["val/verdict/infra_error"] == 3


def test_status_line_shows_accuracy_and_the_nonzero_verdicts() -> None:
    m = {**summarize([_traj("completed", "FULL"), _traj("timeout")],
                     tasks=3), "val/step": 20.0}
    [line] = validation_lines(m)
    assert line.startswith("val       step 20: accuracy 0.500 (FULL / 2 graded of 3 tasks)")
    assert line.endswith("resolved 1  timeout 1  infrastructure error 1")
    assert validation_lines({"reward/mean": 1.0}) == []


def test_a_round_says_how_long_its_answers_took_to_generate_and_to_grade() -> None:
    slow, quick = _traj("completed", "FULL", 1.0), _traj("timeout")
    slow.generation_s, slow.scoring_s = 4.0, 1.0
    quick.generation_s, quick.scoring_s = 2.0, 20.0
    m = summarize([slow, quick], tasks=2)
    assert (m["val/generation_s_mean"], m["val/generation_s_max"]) == (3.0, 4.0)
    assert (m["val/scoring_s_mean"], m["val/scoring_s_max"]) == (10.5, 20.0)
    assert "val/generation_s_max" not in summarize([], tasks=2)
