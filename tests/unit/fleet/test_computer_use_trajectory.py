"""A computer-use trajectory through the replay buffer's byte-level contract and the trainer's edge: its first
token is an observation (the first screenshot, version -1), its PNG bytes pass through unchanged, and the trainer
gets each image with the span of its placeholder run."""

from __future__ import annotations

import pytest

from buffer_client.wire import from_proto_group
from fleet.contracts.scored_group import check_payload, header_of, submit_request
from grpofleet.v1 import common_pb2

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8


def _group(first_version: int = -1) -> common_pb2.ScoredGroup:
    versions = [first_version] * 6 + [3, 3] + [-1] * 6 + [4]
    t = common_pb2.Trajectory(
        response_token_ids=list(range(15)), generation_logprobs=[0.0 if v < 0 else -1.0 for v in versions],
        token_versions=versions, reward=1.0, observation_spans=[common_pb2.TokenSpan(start=0, length=6),
                                                                common_pb2.TokenSpan(start=8, length=6)],
        images=[common_pb2.TrajectoryImage(png=PNG, span=common_pb2.TokenSpan(start=1, length=4), width=224,
                                           height=224),
                common_pb2.TrajectoryImage(png=PNG[::-1], span=common_pb2.TokenSpan(start=9, length=4))])
    return common_pb2.ScoredGroup(prompt=common_pb2.PromptGroup(group_id="g", num_generations=1), trajectories=[t],
                                  min_version=3, max_version=4)


def test_a_trajectory_starting_with_an_observation_is_accepted_and_its_bytes_pass_through() -> None:
    req = submit_request("w", "l", _group())
    check_payload(req.header, req.scored_group)  # what the buffer runs on SubmitGroup
    back = common_pb2.ScoredGroup.FromString(req.scored_group)  # Sample hands these bytes back unchanged
    group = from_proto_group(back)
    assert [(im.png, im.start, im.length) for im in group.trajectories[0].images] == [(PNG, 1, 4), (PNG[::-1], 9, 4)]


def test_a_generated_token_older_than_the_group_is_still_refused() -> None:
    g = _group(first_version=1)
    with pytest.raises(ValueError, match="version 1 < group.min_version"):
        check_payload(header_of(g), g.SerializeToString())
