"""Scored groups as the trainer receives them (the plain types of fleet/contracts/groups.py), built the short way for
the trainer's unit tests: a verdict of tests that ran (graded, resolution NO) unless one is given."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.contracts.groups import EpisodeInfo, PromptGroup, ScoredGroup, Trajectory, TrajectoryImage
from fleet.contracts.sandbox import Verdict


def traj(response_ids: list[int], logprobs: list[float], versions: list[int], reward: float,
         finish_reason: str = "", *, observation_spans: Sequence[tuple[int, int]] = (), tool_calls: int = 0,
         tool_errors: int = 0, images: Sequence[tuple[bytes, int, int]] = (),
         verdict: Verdict | None = None) -> Trajectory:
    """`images`: (PNG, start, length) of each screenshot's placeholder run; tool counts make an episode."""
    episode = (EpisodeInfo(0, tool_calls, tool_errors, finish_reason, 0, 0) if tool_calls or tool_errors else None)
    return Trajectory(response_ids, logprobs, versions, reward, verdict or Verdict(status="completed"),
                      finish_reason, observation_spans=list(observation_spans), episode=episode,
                      images=[TrajectoryImage(png, start, n, 0, 0) for png, start, n in images])


def group(group_id: str, prompt_ids: list[int], trajectories: list[Trajectory], min_version: int,
          target_step: int = 0, task_id: str = "") -> ScoredGroup:
    versions = [v for t in trajectories for v in t.token_versions if v >= 0] or [min_version]
    prompt = PromptGroup(group_id=group_id, target_step=target_step, task_id=task_id, prompt_token_ids=prompt_ids)
    return ScoredGroup(prompt, trajectories, "w", min_version, max(versions), 0)
