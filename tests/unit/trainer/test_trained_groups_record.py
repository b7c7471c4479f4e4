"""A step's record in trained_groups.jsonl names, per group, the task it answered, its mean reward and how many of
its answers resolved the task (trainer/batch.py), so a run can tell a skill spreading over tasks from a few tasks
learnt by heart (benchmarks/gpu_fleet_swe.py `training_tasks`)."""

from __future__ import annotations

import sys
from pathlib import Path

from buffer_client.wire import from_proto_group, to_proto_group
from fleet.contracts.groups import PromptGroup, ScoredGroup, Trajectory
from fleet.contracts.sandbox import Verdict
from grpofleet.v1 import common_pb2
from trainer.batch import build_step_batch

ROOT = Path(__file__).resolve().parents[3]


def _group(task_id: str, resolutions: list[str], scoring_s: list[float]) -> ScoredGroup:
    """A scored SWE group as the trainer receives it from the replay buffer (through the wire encoding)."""
    trajs = [Trajectory([1, 2], [-0.1, -0.2], [3, 3], 1.0 if r == "FULL" else 0.0,
                        Verdict(status="completed", resolution=r, patch_applied=True), "stop", scoring_s=s)
             for r, s in zip(resolutions, scoring_s, strict=True)]
    scored = ScoredGroup(PromptGroup(group_id=f"0:{task_id}", task_id=task_id, env_name="swe"), trajs, "w", 3, 3, 0)
    return from_proto_group(common_pb2.ScoredGroup.FromString(to_proto_group(scored).SerializeToString()))


def test_each_trained_group_carries_its_task_mean_reward_and_resolved_answers() -> None:
    groups = [_group("toolz__cmp_flip__1", ["FULL", "NO", "NO", "FULL"], [0.5, 12.5, 0.6, 0.7]),
              _group("parse__op_swap__2", ["NO"] * 4, [0.5, 0.75, 0.25, 0.5])]
    batch = build_step_batch(groups, 7, leave_one_out=True, normalize=True, max_len=64)
    assert batch.group_ids == ["0:toolz__cmp_flip__1", "0:parse__op_swap__2"]
    assert batch.group_tasks == ["toolz__cmp_flip__1", "parse__op_swap__2"]
    assert batch.group_rewards == [0.5, 0.0] and batch.group_resolved == [2, 0]
    assert batch.group_scoring_s_max == [12.5, 0.75]  # each group's slowest answer, through the wire


def test_a_runs_training_tasks_say_whether_resolving_spreads_or_repeats() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_fleet_swe import training_tasks

    # Two steps per half; "a" is resolved again and again, "b" once, "c" never.
    records = [{"step": 0, "epoch": 1, "groups": ["0:a", "0:c"], "tasks": ["a", "c"], "rewards": [0.25, 0.0],
                "resolved": [4, 0]},
               {"step": 1, "epoch": 1, "groups": ["1:a", "1:b"], "tasks": ["a", "b"], "rewards": [0.5, 0.0],
                "resolved": [8, 0]},
               {"step": 2, "epoch": 1, "groups": ["2:a", "2:c"], "tasks": ["a", "c"], "rewards": [1.0, 0.0],
                "resolved": [16, 0]},
               {"step": 3, "epoch": 2, "groups": ["3:b", "3:c"], "tasks": ["b", "c"], "rewards": [0.06, 0.0],
                "resolved": [1, 0]}]
    got = training_tasks(records)
    assert (got["steps"], got["groups"], got["tasks"], got["tasks_resolved"], got["resolved_answers"]) == \
        (4, 8, 3, 2, 29)
    assert got["first_half"]["steps"] == 2 and got["first_half"]["resolved_answers"] == 12
    assert got["second_half"]["tasks_resolved"] == 2 and got["second_half"]["resolved_answers"] == 17
    assert got["top5_share"] == 1.0
    assert got["most_resolved"] == [{"task": "a", "groups": 3, "resolved": 28}, {"task": "b", "groups": 2,
                                                                                 "resolved": 1}]
    assert "slowest" not in got  # records from before the scoring times name no slow task
    # Each task's slowest answer over the run, and how many of its groups held one over 10 s.
    timed = [{**r, "scoring_s_max": s} for r, s in zip(records, [[3.0, 14.0], [0.9, 1.2], [2.0, 11.5], [0.8, 9.0]],
                                                           strict=True)]
    assert training_tasks(timed, top=2)["slowest"] == [{"task": "c", "scoring_s_max": 14.0, "slow_groups": 2},
                                                       {"task": "a", "scoring_s_max": 3.0, "slow_groups": 0}]
    # A run from before the records named their tasks reports nothing rather than zeros.
    assert training_tasks([{"step": 0, "epoch": 1, "groups": ["0:a"]}]) == {}
