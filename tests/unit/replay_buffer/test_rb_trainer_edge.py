"""The trainer's side of the contract: sampled bytes parse into the plain `ScoredGroup` (buffer_client/wire.py) with
the agent fields."""

from __future__ import annotations

from buffer_client.wire import from_proto_group
from fleet.contracts import scored_group
from grpofleet.v1 import common_pb2
from trainer.batch import loss_mask


def test_a_sampled_agent_group_reaches_the_trainer_with_spans_and_tool_counts() -> None:
    g = common_pb2.ScoredGroup(prompt=common_pb2.PromptGroup(group_id="g", target_step=2, prompt_token_ids=[1, 2]))
    t = g.trajectories.add(response_token_ids=[5, 6, 7, 8], generation_logprobs=[-1, 0, 0, -1], reward=1.0)
    t.token_versions.extend([3, -1, -1, 3])
    t.observation_spans.add(start=1, length=2)
    t.episode.tool_calls, t.episode.tool_errors = 4, 1
    g.min_version = g.max_version = 3
    _, data = scored_group.encode(g)  # the bytes the worker writes, which the trainer reads back
    group = from_proto_group(common_pb2.ScoredGroup.FromString(data))
    (traj,) = group.trajectories
    assert (group.prompt.group_id, traj.response_token_ids, traj.token_versions) == ("g", [5, 6, 7, 8], [3, -1, -1, 3])
    assert traj.episode is not None
    assert (traj.observation_spans, traj.episode.tool_calls, traj.episode.tool_errors) == ([(1, 2)], 4, 1)
    assert loss_mask(traj) == [1.0, 0.0, 0.0, 1.0]
