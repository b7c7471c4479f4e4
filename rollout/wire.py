"""The rollout worker's protobuf edge, the one place its plain types (`fleet/contracts/groups.py`) meet the wire: a
leased `PromptGroup` message becomes the contract's `PromptGroup` (`prompt_group`), and the `ScoredGroup` the worker
made becomes the message it submits (`to_proto_group`, with each trajectory's verdict as the contract's `Verdict`
message). The lease loop, scoring (`scoring.py`) and the agent runners (`agent/`) never see protobuf; the buffer
calls themselves are `buffer_client`'s."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fleet.contracts.groups import EpisodeInfo, PromptGroup, ScoredGroup, Trajectory
from fleet.contracts.sandbox import Verdict
from grpofleet.v1 import common_pb2
from rollout.engine import Generation
from sandbox_client.verdicts import is_not_gradable

_STATUS = {
    "completed": common_pb2.VERDICT_STATUS_COMPLETED,
    "format_error": common_pb2.VERDICT_STATUS_FORMAT_ERROR,
    "not_applied": common_pb2.VERDICT_STATUS_PATCH_NOT_APPLIED,
    "refused": common_pb2.VERDICT_STATUS_INTEGRITY_REFUSED,
    "timeout": common_pb2.VERDICT_STATUS_TIMEOUT,
    "integrity_violation": common_pb2.VERDICT_STATUS_INTEGRITY_VIOLATION,
}
_RESOLUTION = {"FULL": common_pb2.RESOLUTION_FULL, "PARTIAL": common_pb2.RESOLUTION_PARTIAL,
               "NO": common_pb2.RESOLUTION_NO}


# ---- plain types (what the worker's logic makes) --------------------------------------------------------------

def trajectory(gen: Generation, verdict: Verdict, reward: float, *, generation_s: float,
               scoring_s: float) -> Trajectory:
    """A single-shot answer: every response token was generated."""
    return Trajectory(gen.token_ids, gen.logprobs, gen.token_versions, reward, verdict, gen.finish_reason,
                      generation_s=generation_s, scoring_s=scoring_s)


def scored_group(prompt: PromptGroup, trajectories: Sequence[Trajectory], worker_id: str,
                 served_version: int) -> ScoredGroup:
    """The group's version range is its generated tokens' (`served_version` when it has none). Observation tokens
    (agent mode) carry version -1: no weights made them, they do not age a group."""
    versions = [v for t in trajectories for v in t.token_versions if v >= 0] or [served_version]
    return ScoredGroup(prompt, list(trajectories), worker_id, min(versions), max(versions), int(time.time() * 1000))


# ---- the edge: from the lease, to the submit -----------------------------------------------------------------

def prompt_group(p: common_pb2.PromptGroup) -> PromptGroup:
    """A leased group's message as the contract's plain type."""
    return PromptGroup(
        group_id=p.group_id, target_step=p.target_step, env_name=p.env_name, task_id=p.task_id,
        prompt_token_ids=list(p.prompt_token_ids), num_generations=p.num_generations, env_payload=p.env_payload,
        enqueued_at_ms=p.enqueued_at_ms, validation=p.validation)


def to_proto_prompt(p: PromptGroup) -> common_pb2.PromptGroup:
    return common_pb2.PromptGroup(
        group_id=p.group_id, target_step=p.target_step, env_name=p.env_name, task_id=p.task_id,
        prompt_token_ids=p.prompt_token_ids, num_generations=p.num_generations, env_payload=p.env_payload,
        enqueued_at_ms=p.enqueued_at_ms, validation=p.validation)


def to_proto_verdict(v: Verdict) -> common_pb2.Verdict:
    return common_pb2.Verdict(
        status=_STATUS.get(v.status, common_pb2.VERDICT_STATUS_UNSPECIFIED),
        resolution=_RESOLUTION.get(v.resolution, common_pb2.RESOLUTION_NO),
        tests_passed=v.tests_passed, tests_failed=v.tests_failed, detail=v.error[:500],
        not_gradable=is_not_gradable(v),
    )


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


def to_proto_group(g: ScoredGroup) -> common_pb2.ScoredGroup:
    """The message the worker submits (buffer_client serializes it once and writes the bytes to Redis)."""
    return common_pb2.ScoredGroup(
        prompt=to_proto_prompt(g.prompt), trajectories=[to_proto_trajectory(t) for t in g.trajectories],
        worker_id=g.worker_id, min_version=g.min_version, max_version=g.max_version,
        submitted_at_ms=g.submitted_at_ms)
