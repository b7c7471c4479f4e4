"""Validation's verdict breakdown and its `grpo-fleet status` line (trainer/validation.py, launch/status.py)."""

from __future__ import annotations

import pytest

from grpofleet.v1 import common_pb2 as pb
from launch.status import validation_lines
from trainer.validation import VERDICT_KINDS, summarize, verdict_kind


@pytest.mark.parametrize(("status", "resolution", "kind"), [
    (pb.VERDICT_STATUS_COMPLETED, pb.RESOLUTION_FULL, "resolved"),
    (pb.VERDICT_STATUS_COMPLETED, pb.RESOLUTION_PARTIAL, "tests_failed"),
    (pb.VERDICT_STATUS_COMPLETED, pb.RESOLUTION_NO, "tests_failed"),
    (pb.VERDICT_STATUS_FORMAT_ERROR, pb.RESOLUTION_NO, "no_patch"),
    (pb.VERDICT_STATUS_PATCH_NOT_APPLIED, pb.RESOLUTION_NO, "patch_not_applied"),
    (pb.VERDICT_STATUS_TIMEOUT, pb.RESOLUTION_NO, "timeout"),
    (pb.VERDICT_STATUS_INTEGRITY_REFUSED, pb.RESOLUTION_FULL, "integrity_refused"),
    (pb.VERDICT_STATUS_UNSPECIFIED, pb.RESOLUTION_FULL, "infra_error"),
])
def test_each_verdict_falls_in_one_bucket(status: int, resolution: int, kind: str) -> None:
    assert verdict_kind(pb.Verdict(status=status, resolution=resolution)) == kind


def _traj(status: int, resolution: int = pb.RESOLUTION_NO, reward: float = 0.0) -> pb.Trajectory:
    return pb.Trajectory(reward=reward, verdict=pb.Verdict(status=status, resolution=resolution))


def test_accuracy_is_full_resolutions_over_graded_tasks_and_missing_tasks_are_infrastructure() -> None:
    trajs = [_traj(pb.VERDICT_STATUS_COMPLETED, pb.RESOLUTION_FULL, 1.0), _traj(pb.VERDICT_STATUS_COMPLETED),
             _traj(pb.VERDICT_STATUS_PATCH_NOT_APPLIED), _traj(pb.VERDICT_STATUS_FORMAT_ERROR)]
    m = summarize(trajs, tasks=5)
    assert sum(m[f"val/verdict/{k}"] for k in VERDICT_KINDS) == m["val/tasks"] == 5
    assert (m["val/verdict/infra_error"], m["val/graded"], m["val/accuracy"]) == (1, 4, 0.25)
    assert m["val/incomplete"] == 1.0


def test_a_round_with_no_graded_task_reports_no_accuracy() -> None:
    m = summarize([], tasks=3)
    assert "val/accuracy" not in m and m["val/verdict/infra_error"] == 3


def test_status_line_shows_accuracy_and_the_nonzero_verdicts() -> None:
    m = {**summarize([_traj(pb.VERDICT_STATUS_COMPLETED, pb.RESOLUTION_FULL), _traj(pb.VERDICT_STATUS_TIMEOUT)],
                     tasks=3), "val/step": 20.0}
    [line] = validation_lines(m)
    assert line.startswith("val       step 20: accuracy 0.500 (FULL / 2 graded of 3 tasks)")
    assert line.endswith("resolved 1  timeout 1  infrastructure error 1")
    assert validation_lines({"reward/mean": 1.0}) == []
