"""The one protobuf edge of a group (buffer_client/wire.py): plain groups cross it token-exact, both ways, and every
verdict a trajectory can carry has its wire status; an infrastructure error never reaches a trajectory (it is retried
or the lease is released), so it has none."""

from buffer_client.wire import from_proto_group, from_proto_prompt, to_proto_group, to_proto_prompt, to_proto_verdict
from fleet.contracts.groups import EpisodeInfo, PromptGroup, ScoredGroup, Trajectory, TrajectoryImage
from fleet.contracts.sandbox import FINAL_STATUSES, Verdict
from fleet.contracts.scored_group import encode
from grpofleet.v1 import common_pb2 as pb


def test_every_scorable_verdict_has_its_wire_status() -> None:
    for status in (FINAL_STATUSES - {"infra_error"}) | {"format_error"}:
        assert to_proto_verdict(Verdict(status=status)).status != pb.VERDICT_STATUS_UNSPECIFIED, status  # type: ignore[arg-type]
    assert to_proto_verdict(Verdict(status="infra_error")).status == pb.VERDICT_STATUS_UNSPECIFIED


def test_resolution_counts_and_detail_cross_as_they_are() -> None:
    verdict = Verdict(status="completed", resolution="FULL", tests_passed=3, tests_failed=1, error="x" * 900)
    v = to_proto_verdict(verdict)
    assert (v.resolution, v.tests_passed, v.tests_failed, len(v.detail)) == (pb.RESOLUTION_FULL, 3, 1, 500)


def _group() -> ScoredGroup:
    prompt = PromptGroup(group_id="g", target_step=3, env_name="swe", task_id="t", prompt_token_ids=[5, 6],
                         num_generations=2, env_payload=b'{"a": 1}', enqueued_at_ms=9, validation=True)
    single = Trajectory([1, 2], [-0.5, -0.25], [4, 5], 1.0, Verdict(status="completed", resolution="FULL"), "stop",
                        generation_s=0.5, scoring_s=0.25)
    episode = Trajectory([1, 7, 2], [-0.5, 0.0, -0.125], [4, -1, 5], 0.0, Verdict(status="format_error"), "submitted",
                         observation_spans=[(1, 1)], episode=EpisodeInfo(2, 1, 0, "submitted", 2, 1),
                         images=[TrajectoryImage(b"\x89PNG", 1, 1, 8, 8)])
    return ScoredGroup.assemble(prompt, [single, episode], "w", served_version=4)


def test_a_leased_prompt_crosses_the_edge_both_ways_unchanged() -> None:
    prompt = _group().prompt
    assert from_proto_prompt(to_proto_prompt(prompt)) == prompt


def test_a_scored_group_reaches_the_wire_token_exact_with_its_masks_and_versions() -> None:
    g = to_proto_group(_group())
    assert (g.min_version, g.max_version, g.worker_id) == (4, 5, "w"), "observation tokens (-1) do not age a group"
    single, episode = g.trajectories
    assert (list(single.response_token_ids), list(single.generation_logprobs), list(single.token_versions)) == \
        ([1, 2], [-0.5, -0.25], [4, 5])
    assert not single.HasField("episode") and not single.observation_spans, "a single-shot answer has no episode"
    assert (single.timings.generation_s, single.timings.scoring_s) == (0.5, 0.25)
    assert list(episode.token_versions) == [4, -1, 5] and list(episode.generation_logprobs) == [-0.5, 0.0, -0.125]
    assert [(s.start, s.length) for s in episode.observation_spans] == [(1, 1)]
    assert (episode.episode.turns, episode.episode.observation_tokens) == (2, 1)
    assert [(im.png, im.span.start, im.span.length, im.width) for im in episode.images] == [(b"\x89PNG", 1, 1, 8)]
    assert episode.verdict.status == pb.VERDICT_STATUS_FORMAT_ERROR
    assert g.prompt.SerializeToString() == to_proto_prompt(_group().prompt).SerializeToString()
    encode(g)  # the buffer client's check of a whole group passes


def test_a_sampled_group_reads_back_as_the_plain_group_the_worker_made() -> None:
    g = _group()
    back = from_proto_group(pb.ScoredGroup.FromString(to_proto_group(g).SerializeToString()))
    assert (back.prompt, back.worker_id, back.min_version, back.max_version) == (g.prompt, "w", 4, 5)
    single, episode = back.trajectories
    assert single.episode is None and episode.episode == g.trajectories[1].episode
    assert (episode.response_token_ids, episode.token_versions, episode.observation_spans) == \
        ([1, 7, 2], [4, -1, 5], [(1, 1)])
    assert episode.images == g.trajectories[1].images
    assert (single.verdict.status, single.verdict.resolution, episode.verdict.status) == \
        ("completed", "FULL", "format_error")


def test_an_unspecified_wire_status_reads_back_as_an_infrastructure_error() -> None:
    from buffer_client.wire import from_proto_verdict

    assert from_proto_verdict(pb.Verdict()).status == "infra_error"
    assert from_proto_verdict(to_proto_verdict(Verdict(status="infra_error"))).status == "infra_error"
