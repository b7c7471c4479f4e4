"""A step whose verdicts all failed to measure the answers is warned about, naming the repos (trainer/grading.py).

The groups take the path a real one takes: a verdict from the sandbox's own grader (or an infrastructure failure),
the buffer client's encoding of the worker's group, the bytes the replay buffer stores, and its decoding for the
trainer (`buffer_client/wire.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from buffer_client.wire import from_proto_group, to_proto_group
from fleet.contracts.groups import PromptGroup, ScoredGroup, Trajectory
from fleet.contracts.sandbox import TaskSpec, Verdict
from grpofleet.v1 import common_pb2
from trainer.data import ListSource, Task
from trainer.grading import check_grading, grading, outcome, ungraded_warning

REPOS = {"django__django-1": "django/django", "django__django-2": "django/django", "sympy__sympy-1": "sympy/sympy"}


def _unreadable_log_verdict() -> Verdict:
    """What the image path's grader says of a log with no test markers (a parser that does not match the image)."""
    from services.sandbox.images import contract

    contract.load()
    spec = TaskSpec(repo_url="image://x", base_commit="HEAD", patch="", image="x", eval_script="pytest",
                    log_parser="parse_log_pytest", fail_to_pass=["t.py::a"])
    return contract.grade(spec, contract.test_spec(spec, []), "Segmentation fault before any test ran")


VERDICTS = {
    "graded": lambda: Verdict(status="completed", resolution="NO", patch_applied=True, tests_failed=1),
    "not_gradable": _unreadable_log_verdict,
    "infra_error": lambda: Verdict(status="infra_error", error="image pull failed: x"),
}


def _group(task_id: str, kinds: list[str], verdicts: dict[str, Callable[[], Verdict]] = VERDICTS) -> ScoredGroup:
    """A scored group as the trainer receives it from the replay buffer."""
    trajs = [Trajectory([1, 2], [-0.1, -0.2], [3, 3], 0.0, verdicts[k](), "stop") for k in kinds]
    scored = ScoredGroup(PromptGroup(group_id=f"0:{task_id}", task_id=task_id, env_name="swe"), trajs, "w", 3, 3, 0)
    return from_proto_group(common_pb2.ScoredGroup.FromString(to_proto_group(scored).SerializeToString()))


def _source() -> ListSource:
    return ListSource([Task("swe", tid, [1], b"{}", repo=repo) for tid, repo in REPOS.items()])


def test_the_graders_unreadable_log_reaches_the_trainer_as_not_gradable() -> None:
    group = _group("django__django-1", ["not_gradable", "graded", "infra_error"])
    assert [grading(t.verdict) for t in group.trajectories] == ["not_gradable", "graded", "infra_error"]


def test_a_step_of_only_infra_errors_is_warned_about_once_naming_each_repo(caplog: pytest.LogCaptureFixture) -> None:
    groups = [_group("django__django-1", ["infra_error"] * 6), _group("django__django-2", ["infra_error"] * 6),
              _group("sympy__sympy-1", ["infra_error"] * 4)]
    with caplog.at_level(logging.WARNING, logger="trainer.grading"):
        metrics = check_grading(12, groups, _source().repo_of)
    assert [r.getMessage() for r in caplog.records] == [
        "step 12: all 16 verdicts were infra errors (repos: django/django x12, sympy/sympy x4) — the reward is not "
        "measuring the policy"]
    assert metrics == {"verdicts/graded": 0.0, "verdicts/not_gradable": 0.0, "verdicts/infra_error": 16.0,
                       "verdicts/all_ungraded": 1.0}


def test_a_step_of_only_unreadable_logs_is_warned_about() -> None:
    warning = ungraded_warning(3, [_group("sympy__sympy-1", ["not_gradable"] * 4)], _source().repo_of)
    assert warning is not None
    assert warning.startswith("step 3: all 4 verdicts were not gradable (repos: sympy/sympy x4)")


def test_a_mix_of_unreadable_logs_and_infra_errors_is_warned_about_with_both_counts() -> None:
    groups = [_group("django__django-1", ["not_gradable"] * 3 + ["infra_error"])]
    warning = ungraded_warning(5, groups, _source().repo_of)
    assert warning is not None and "all 4 verdicts were not graded (3 not gradable, 1 infra errors)" in warning


def test_one_graded_verdict_means_no_warning_but_the_step_still_counts_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    groups = [_group("django__django-1", ["not_gradable"] * 3 + ["graded"]), _group("sympy__sympy-1",
                                                                                    ["infra_error"] * 4)]
    with caplog.at_level(logging.WARNING, logger="trainer.grading"):
        metrics = check_grading(7, groups, _source().repo_of)
    assert not caplog.records
    assert metrics == {"verdicts/graded": 1.0, "verdicts/not_gradable": 3.0, "verdicts/infra_error": 4.0,
                       "verdicts/all_ungraded": 0.0}


def test_a_task_the_source_does_not_know_is_named_by_its_task_id() -> None:
    warning = ungraded_warning(1, [_group("astropy__astropy-9", ["infra_error"] * 2)], _source().repo_of)
    assert warning is not None and "(repos: astropy__astropy-9 x2)" in warning


def test_each_verdict_kind_reaches_the_step_as_its_outcome_share_with_rollout_timings() -> None:
    """The FULL / PARTIAL / NO / not applied / infra breakdown of a step (`outcome/*`), through the wire."""
    from trainer.batch import build_step_batch
    from trainer.grading import OUTCOMES

    verdicts = {**VERDICTS,
        "full": lambda: Verdict(status="completed", resolution="FULL", patch_applied=True, tests_passed=2),
        "partial": lambda: Verdict(status="completed", resolution="PARTIAL", patch_applied=True, tests_passed=1),
        "not_applied": lambda: Verdict(status="not_applied"),
        "format": lambda: Verdict(status="format_error"),
        "timeout": lambda: Verdict(status="timeout", patch_applied=True),
    }
    kinds = ["full", "partial", "graded", "not_applied", "format", "timeout", "not_gradable", "infra_error"]
    group = _group("django__django-1", kinds, verdicts)
    assert [outcome(t.verdict) for t in group.trajectories] == [
        "full", "partial", "no", "not_applied", "format_error", "timeout", "not_gradable", "infra_error"]
    stats = build_step_batch([group], 3, leave_one_out=True, normalize=True, max_len=64).stats
    assert sum(stats[f"outcome/{k}"] for k in OUTCOMES) == pytest.approx(1.0)
    assert stats["outcome/full"] == stats["outcome/not_applied"] == pytest.approx(1 / 8)
    assert stats["outcome/integrity"] == 0.0
    assert "rollout/generation_s_mean" in stats and "rollout/scoring_s_max" in stats
