"""The trainer's protobuf edge on the replay buffer: callers get `trainer.batch.Group`s and give `PromptSpec`s; the
calls themselves (deadlines, retries through an outage, Sample's request id) are the one `buffer_client.BufferClient`
that the rollout workers use too."""

from __future__ import annotations

from buffer_client import BufferClient
from fleet.contracts.buffer import Starvation
from grpofleet.v1 import common_pb2
from trainer.batch import Grading, Group, Outcome, Trajectory
from trainer.data import PromptSpec


def grading(v: common_pb2.Verdict) -> Grading:
    """How far a trajectory's verdict measured the answer. An unspecified status is the wire's encoding of an
    infrastructure failure (or of a status this trainer does not know): no verdict the answer earned."""
    if v.status == common_pb2.VERDICT_STATUS_UNSPECIFIED:
        return "infra_error"
    return "not_gradable" if v.not_gradable else "graded"


_STATUS_OUTCOME = {
    common_pb2.VERDICT_STATUS_FORMAT_ERROR: "format_error",
    common_pb2.VERDICT_STATUS_PATCH_NOT_APPLIED: "not_applied",
    common_pb2.VERDICT_STATUS_INTEGRITY_REFUSED: "integrity",
    common_pb2.VERDICT_STATUS_INTEGRITY_VIOLATION: "integrity",
    common_pb2.VERDICT_STATUS_TIMEOUT: "timeout",
}
_RESOLUTION_OUTCOME = {common_pb2.RESOLUTION_FULL: "full", common_pb2.RESOLUTION_PARTIAL: "partial"}


def outcome(v: common_pb2.Verdict) -> Outcome:
    """What the sandbox said of one answer, in one word (the `outcome/*` breakdown of a step)."""
    if v.status == common_pb2.VERDICT_STATUS_UNSPECIFIED:
        return "infra_error"
    if v.not_gradable:
        return "not_gradable"
    if v.status == common_pb2.VERDICT_STATUS_COMPLETED:
        return _RESOLUTION_OUTCOME.get(v.resolution, "no")  # type: ignore[return-value]
    return _STATUS_OUTCOME.get(v.status, "infra_error")  # type: ignore[return-value]


def to_group(g: common_pb2.ScoredGroup) -> Group:
    trajs = [
        Trajectory(
            list(t.response_token_ids),
            list(t.generation_logprobs),
            list(t.token_versions),
            float(t.reward),
            t.finish_reason,
            t.verdict.resolution == common_pb2.RESOLUTION_FULL,
            observation_spans=[(s.start, s.length) for s in t.observation_spans],
            tool_calls=t.episode.tool_calls,
            tool_errors=t.episode.tool_errors,
            images=[(im.png, im.span.start, im.span.length) for im in t.images],
            grading=grading(t.verdict),
            outcome=outcome(t.verdict),
            generation_s=t.timings.generation_s,
            scoring_s=t.timings.scoring_s,
        )
        for t in g.trajectories
    ]
    return Group(
        g.prompt.group_id, list(g.prompt.prompt_token_ids), trajs, int(g.min_version), int(g.prompt.target_step),
        task_id=g.prompt.task_id,
    )


def to_prompt(p: PromptSpec) -> common_pb2.PromptGroup:
    return common_pb2.PromptGroup(
        group_id=p.group_id,
        target_step=p.target_step,
        env_name=p.env_name,
        task_id=p.task_id,
        prompt_token_ids=p.prompt_token_ids,
        num_generations=p.num_generations,
        env_payload=p.env_payload,
        enqueued_at_ms=p.enqueued_at_ms,
        validation=p.validation,
    )


async def enqueue_prompts(buffer: BufferClient, prompts: list[PromptSpec]) -> tuple[int, int]:
    """(enqueued, duplicates): enqueues are idempotent (group ids derive from the data position)."""
    return await buffer.enqueue([to_prompt(p) for p in prompts])


async def sample_groups(
    buffer: BufferClient, step: int, num_groups: int, deadline_s: float, *, min_groups: int = 1,
    validation: bool = False,
) -> tuple[list[Group], Starvation]:
    groups, starvation = await buffer.sample(step, num_groups, deadline_s, min_groups=min_groups,
                                             validation=validation)
    return [to_group(g) for g in groups], starvation
