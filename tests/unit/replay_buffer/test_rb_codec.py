"""The byte-level shortcuts of codec.py produce exactly what the generated protobuf code would."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from grpofleet.v1 import common_pb2
from grpofleet.v1 import replay_buffer_pb2 as pb
from services.replay_buffer import codec


def group(gid: str, tokens: int = 300) -> common_pb2.ScoredGroup:
    g = common_pb2.ScoredGroup(prompt=common_pb2.PromptGroup(group_id=gid, target_step=3, num_generations=2))
    for _ in range(2):
        t = g.trajectories.add(response_token_ids=range(tokens), token_versions=[7] * tokens)
        t.generation_logprobs.extend([-0.5] * tokens)
    g.min_version = g.max_version = 7
    return g


def test_submit_group_bytes_are_the_group_as_sent() -> None:
    req = pb.SubmitGroupRequest(worker_id="w", lease_id="1-0@1", group=group("a"))
    env = codec.decode_submit(req.SerializeToString())
    assert env.request == req
    assert env.group_bytes == req.group.SerializeToString()
    assert common_pb2.ScoredGroup.FromString(env.group_bytes) == req.group


def test_a_group_sent_in_pieces_is_merged_and_reencoded() -> None:
    head = pb.SubmitGroupRequest(group=common_pb2.ScoredGroup(prompt=common_pb2.PromptGroup(group_id="a")))
    tail = pb.SubmitGroupRequest(worker_id="w", group=common_pb2.ScoredGroup(min_version=4))
    env = codec.decode_submit(head.SerializeToString() + tail.SerializeToString())
    parsed = common_pb2.ScoredGroup.FromString(env.group_bytes)
    assert (parsed.prompt.group_id, parsed.min_version, env.request.worker_id) == ("a", 4, "w")


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        codec.decode_submit(b"\x1a\xff\xff\xff")


@pytest.mark.parametrize("starved", [False, True])
def test_sample_framing_matches_the_generated_serializer(starved: bool) -> None:
    groups = [group("a"), group("b", 5000), group("c", 0)]
    starvation = pb.Starvation(reason="generating", prompts_pending=3, waited_s=1.5) if starved else None
    framed = codec.encode_sample([g.SerializeToString() for g in groups], starvation)
    expected = pb.SampleResponse(groups=groups, starvation=starvation)
    assert framed == expected.SerializeToString()
    assert pb.SampleResponse.FromString(framed) == expected
    assert codec.serialize_sample(expected) == framed


def test_empty_sample_answer() -> None:
    assert codec.encode_sample([], None) == b""


def test_prompt_of_a_requeued_group_is_its_prompt() -> None:
    g = group("a")
    assert codec.prompt_of("scored", g.SerializeToString()) == g.prompt
    assert codec.prompt_of("prompt", g.prompt.SerializeToString()) == g.prompt


def test_length_delimited_fields_walks_every_wire_type() -> None:
    msg = pb.Lease(lease_id="x", delivery_count=3, group=common_pb2.PromptGroup(group_id="g", enqueued_at_ms=2**40))
    assert codec.length_delimited_fields(msg.SerializeToString(), 1) == [b"x"]
    (inner,) = codec.length_delimited_fields(msg.SerializeToString(), 2)
    assert codec.length_delimited_fields(inner, 1) == [b"g"]
    with pytest.raises(ValueError):
        codec.length_delimited_fields(b"\x0a\x05ab", 1)  # says 5 bytes, holds 2
