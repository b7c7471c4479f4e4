"""fleet/contracts/scored_group.py: the submit header agrees with the group bytes, and the buffer's top-level check
(inline submits) catches every disagreement without decoding trajectories."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleet.contracts import scored_group
from grpofleet.v1 import common_pb2
from grpofleet.v1 import replay_buffer_pb2 as pb


def group(gid: str, tokens: int = 300, versions: tuple[int, int] = (7, 7)) -> common_pb2.ScoredGroup:
    g = common_pb2.ScoredGroup(prompt=common_pb2.PromptGroup(group_id=gid, target_step=3, num_generations=2))
    lo, hi = versions
    for _ in range(2):
        t = g.trajectories.add(response_token_ids=range(tokens), token_versions=[lo] * (tokens // 2))
        t.token_versions.extend([hi] * (tokens - tokens // 2))
        t.generation_logprobs.extend([-0.5] * tokens)
    g.min_version, g.max_version = lo, hi
    return g


def agent_group() -> common_pb2.ScoredGroup:
    """Agent mode: observation tokens carry version -1 (a 10-byte varint) inside the trajectory."""
    g = group("agent", 8, (300, 301))
    for t in g.trajectories:
        t.token_versions[2:4] = [-1, -1]
        t.observation_spans.add(start=2, length=2)
        t.episode.tool_calls, t.episode.tool_errors = 3, 1
    return g


def test_submit_request_carries_the_group_bytes_and_a_matching_header() -> None:
    g = group("a", versions=(4, 9))
    req = scored_group.submit_request("w", "1-0@1", g)
    assert common_pb2.ScoredGroup.FromString(req.scored_group) == g
    h = req.header
    assert (h.group_id, h.target_step, h.min_version, h.max_version, h.validation) == ("a", 3, 4, 9, False)
    assert list(h.trajectory_tokens) == [300, 300]
    scored_group.check_payload(h, req.scored_group)


def test_submit_request_refuses_a_group_that_is_not_whole() -> None:
    g = group("a")
    g.trajectories[1].token_versions.append(7)
    with pytest.raises(ValueError, match=r"trajectories\[1\].*differ in length"):
        scored_group.submit_request("w", "1-0@1", g)
    with pytest.raises(ValueError, match="must not be empty"):
        scored_group.submit_request("w", "1-0@1", common_pb2.ScoredGroup())


@pytest.mark.parametrize("make", [agent_group, lambda: group("empty", 0), lambda: group("v", 5, (0, 200))])
def test_check_payload_accepts_well_formed_groups(make: Callable[[], common_pb2.ScoredGroup]) -> None:
    g = make()
    scored_group.check_payload(scored_group.header_of(g), g.SerializeToString())


def _header(**changes: object) -> Callable[[pb.ScoredGroupHeader], None]:
    def apply(h: pb.ScoredGroupHeader) -> None:
        for k, v in changes.items():
            if k == "trajectory_tokens":
                h.ClearField(k)
                h.trajectory_tokens.extend(v)  # type: ignore[call-overload]
            else:
                setattr(h, k, v)

    return apply


def _versions(g: common_pb2.ScoredGroup, v: int) -> None:
    g.min_version = g.max_version = v  # claims other weights than its tokens had


BROKEN = [
    ("group_id", lambda g: None, _header(group_id="b"), "header.group_id"),
    ("target_step", lambda g: None, _header(target_step=4), "header.target_step"),
    ("validation", lambda g: None, _header(validation=True), "header.validation"),
    ("min_version", lambda g: None, _header(min_version=6), "header.min_version"),
    ("max_version", lambda g: None, _header(max_version=8), "header.max_version"),
    ("count", lambda g: None, _header(trajectory_tokens=[300]), "header.trajectory_tokens"),
    ("partial", lambda g: g.trajectories.pop(), _header(trajectory_tokens=[300]), "whole groups"),
    ("logprobs", lambda g: g.trajectories[0].generation_logprobs.append(0.0), lambda h: None, "differ in length"),
    ("lying_min", lambda g: _versions(g, 8), _header(min_version=8, max_version=8), "< group.min"),
    ("lying_max", lambda g: _versions(g, 6), _header(min_version=6, max_version=6), "> group.max"),
]  # fmt: skip


@pytest.mark.parametrize(("bad", "mutate", "edit", "text"), BROKEN, ids=[b[0] for b in BROKEN])
def test_check_payload_names_each_disagreement(
    bad: str, mutate: Callable[..., object], edit: Callable[[pb.ScoredGroupHeader], None], text: str
) -> None:
    g = group("a")
    h = scored_group.header_of(g)
    mutate(g)
    edit(h)
    with pytest.raises(ValueError, match=text):
        scored_group.check_payload(h, g.SerializeToString())


def test_garbage_payload_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a serialized ScoredGroup"):
        scored_group.check_payload(scored_group.header_of(group("a")), b"\x1a\xff\xff\xff")


def test_encode_fills_the_header_from_the_bytes_it_serialized() -> None:
    g = group("a", 300)
    header, data = scored_group.encode(g)
    assert header.payload_bytes == len(data) and common_pb2.ScoredGroup.FromString(data) == g
    scored_group.check_payload(header, data)  # what the buffer checks on an inline submit



def test_prompt_of_a_requeued_group_is_its_prompt() -> None:
    g = group("a")
    assert scored_group.prompt_of("scored", g.SerializeToString()) == g.prompt
    assert scored_group.prompt_of("prompt", g.prompt.SerializeToString()) == g.prompt


def test_length_delimited_fields_walks_every_wire_type() -> None:
    msg = pb.Lease(lease_id="x", delivery_count=3, group=common_pb2.PromptGroup(group_id="g", enqueued_at_ms=2**40))
    assert scored_group.length_delimited_fields(msg.SerializeToString(), 1) == [b"x"]
    (inner,) = scored_group.length_delimited_fields(msg.SerializeToString(), 2)
    assert scored_group.length_delimited_fields(inner, 1) == [b"g"]
    with pytest.raises(ValueError):
        scored_group.length_delimited_fields(b"\x0a\x05ab", 1)  # says 5 bytes, holds 2
