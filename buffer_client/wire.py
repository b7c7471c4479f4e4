"""The one place where a group's plain types (`fleet/contracts/groups.py`) meet protobuf, for both ends of the replay
buffer: the trainer enqueues `PromptGroup`s and samples `ScoredGroup`s, a rollout worker leases `PromptGroup`s and
submits `ScoredGroup`s, and `BufferClient` converts each at the call. Neither fleet imports generated group code.

Each mapping is written once, both ways (`to_proto_*` / `from_proto_*`): a prompt group, a verdict, a trajectory and
a scored group. The wire's verdict is narrower than the sandbox's: its status enum has no `infra_error` (an
unspecified status is the wire's encoding of one, or of a status the reader does not know), and `detail` keeps the
first 500 characters of the verdict's error.
"""

from __future__ import annotations

from typing import cast

from fleet.contracts.groups import EpisodeInfo, PromptGroup, ScoredGroup, Trajectory, TrajectoryImage
from fleet.contracts.sandbox import ResolutionName, TaskStatus, Verdict
from grpofleet.v1 import common_pb2
from sandbox_client.verdicts import is_not_gradable

_STATUS = {
    "completed": common_pb2.VERDICT_STATUS_COMPLETED,
    "format_error": common_pb2.VERDICT_STATUS_FORMAT_ERROR,
    "not_applied": common_pb2.VERDICT_STATUS_PATCH_NOT_APPLIED,
    "refused": common_pb2.VERDICT_STATUS_INTEGRITY_REFUSED,
    "timeout": common_pb2.VERDICT_STATUS_TIMEOUT,
    "integrity_violation": common_pb2.VERDICT_STATUS_INTEGRITY_VIOLATION,
}
_STATUS_NAME = {int(v): cast(TaskStatus, k) for k, v in _STATUS.items()}
_RESOLUTION = {"FULL": common_pb2.RESOLUTION_FULL, "PARTIAL": common_pb2.RESOLUTION_PARTIAL,
               "NO": common_pb2.RESOLUTION_NO}
_RESOLUTION_NAME = {int(v): cast(ResolutionName, k) for k, v in _RESOLUTION.items()}


# ---- prompt groups: enqueued by the trainer, leased by a worker ---------------------------------------------------

def from_proto_prompt(p: common_pb2.PromptGroup) -> PromptGroup:
    return PromptGroup(
        group_id=p.group_id, target_step=p.target_step, env_name=p.env_name, task_id=p.task_id,
        prompt_token_ids=list(p.prompt_token_ids), num_generations=p.num_generations, env_payload=p.env_payload,
        enqueued_at_ms=p.enqueued_at_ms, validation=p.validation)


def to_proto_prompt(p: PromptGroup) -> common_pb2.PromptGroup:
    return common_pb2.PromptGroup(
        group_id=p.group_id, target_step=p.target_step, env_name=p.env_name, task_id=p.task_id,
        prompt_token_ids=p.prompt_token_ids, num_generations=p.num_generations, env_payload=p.env_payload,
        enqueued_at_ms=p.enqueued_at_ms, validation=p.validation)


# ---- verdicts -------------------------------------------------------------------------------------------------

def to_proto_verdict(v: Verdict) -> common_pb2.Verdict:
    return common_pb2.Verdict(
        status=_STATUS.get(v.status, common_pb2.VERDICT_STATUS_UNSPECIFIED),
        resolution=_RESOLUTION.get(v.resolution, common_pb2.RESOLUTION_NO),
        tests_passed=v.tests_passed, tests_failed=v.tests_failed, detail=v.error[:500],
        not_gradable=is_not_gradable(v),
    )


def from_proto_verdict(v: common_pb2.Verdict) -> Verdict:
    """The wire's verdict as the sandbox contract's: an unspecified (or unknown) status is `infra_error`, an
    unspecified resolution NO, `not_gradable` the verdict's `gradable` turned round."""
    return Verdict(
        status=_STATUS_NAME.get(v.status, "infra_error"), resolution=_RESOLUTION_NAME.get(v.resolution, "NO"),
        tests_passed=v.tests_passed, tests_failed=v.tests_failed, error=v.detail, gradable=not v.not_gradable,
    )


# ---- trajectories and scored groups: submitted by a worker, sampled by the trainer ---------------------------------

def _episode(e: EpisodeInfo) -> common_pb2.EpisodeInfo:
    return common_pb2.EpisodeInfo(turns=e.turns, tool_calls=e.tool_calls, tool_errors=e.tool_errors,
                                  end_reason=e.end_reason, generated_tokens=e.generated_tokens,
                                  observation_tokens=e.observation_tokens)


def to_proto_trajectory(t: Trajectory) -> common_pb2.Trajectory:
    # Single-shot answers leave `episode` unset, as the contract says (an empty EpisodeInfo would be present).
    episode = {} if t.episode is None else {"episode": _episode(t.episode)}
    return common_pb2.Trajectory(
        response_token_ids=t.response_token_ids, generation_logprobs=t.generation_logprobs,
        token_versions=t.token_versions, reward=t.reward, verdict=to_proto_verdict(t.verdict),
        finish_reason=t.finish_reason,
        timings=common_pb2.SampleTimings(generation_s=t.generation_s, scoring_s=t.scoring_s),
        observation_spans=[common_pb2.TokenSpan(start=s, length=n) for s, n in t.observation_spans],
        images=[common_pb2.TrajectoryImage(png=im.png, span=common_pb2.TokenSpan(start=im.start, length=im.length),
                                           width=im.width, height=im.height) for im in t.images],
        **episode,
    )


def from_proto_trajectory(t: common_pb2.Trajectory) -> Trajectory:
    e = t.episode
    episode = (EpisodeInfo(e.turns, e.tool_calls, e.tool_errors, e.end_reason, e.generated_tokens,
                           e.observation_tokens) if t.HasField("episode") else None)
    return Trajectory(
        list(t.response_token_ids), list(t.generation_logprobs), list(t.token_versions), float(t.reward),
        from_proto_verdict(t.verdict), t.finish_reason,
        generation_s=t.timings.generation_s, scoring_s=t.timings.scoring_s,
        observation_spans=[(s.start, s.length) for s in t.observation_spans], episode=episode,
        images=[TrajectoryImage(im.png, im.span.start, im.span.length, im.width, im.height) for im in t.images],
    )


def to_proto_group(g: ScoredGroup) -> common_pb2.ScoredGroup:
    """The message a worker submits (the buffer client serializes it once and writes the bytes to Redis)."""
    return common_pb2.ScoredGroup(
        prompt=to_proto_prompt(g.prompt), trajectories=[to_proto_trajectory(t) for t in g.trajectories],
        worker_id=g.worker_id, min_version=g.min_version, max_version=g.max_version,
        submitted_at_ms=g.submitted_at_ms)


def from_proto_group(g: common_pb2.ScoredGroup) -> ScoredGroup:
    """A sampled group's message as the contract's plain type."""
    return ScoredGroup(from_proto_prompt(g.prompt), [from_proto_trajectory(t) for t in g.trajectories], g.worker_id,
                       int(g.min_version), int(g.max_version), int(g.submitted_at_ms))
