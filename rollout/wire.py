"""The rollout worker's protobuf edge for what it produces: a sandbox verdict as the contract's `Verdict` message,
a single-shot generation and its score as a `Trajectory`, and the trajectories of one prompt as the `ScoredGroup` it
submits (single-shot in `worker.py`, agent episodes in `agent/runner.py`). Scoring itself (`scoring.py`) never sees
protobuf; the buffer calls convert at `buffer_client`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fleet.contracts.sandbox import Verdict
from grpofleet.v1 import common_pb2
from rollout.engine import Generation

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


def to_proto_verdict(v: Verdict) -> common_pb2.Verdict:
    return common_pb2.Verdict(
        status=_STATUS.get(v.status, common_pb2.VERDICT_STATUS_UNSPECIFIED),
        resolution=_RESOLUTION.get(v.resolution, common_pb2.RESOLUTION_NO),
        tests_passed=v.tests_passed, tests_failed=v.tests_failed, detail=v.error[:500],
    )


def trajectory(gen: Generation, verdict: Verdict, reward: float, *, generation_s: float,
               scoring_s: float) -> common_pb2.Trajectory:
    return common_pb2.Trajectory(
        response_token_ids=gen.token_ids, generation_logprobs=gen.logprobs, token_versions=gen.token_versions,
        reward=reward, verdict=to_proto_verdict(verdict), finish_reason=gen.finish_reason,
        timings=common_pb2.SampleTimings(generation_s=generation_s, scoring_s=scoring_s),
    )


def scored_group(prompt: common_pb2.PromptGroup, trajectories: Sequence[common_pb2.Trajectory], worker_id: str,
                 served_version: int) -> common_pb2.ScoredGroup:
    """The group's version range is its generated tokens' (`served_version` when it has none). Observation tokens
    (agent mode) carry version -1: no weights made them, they do not age a group."""
    versions = [v for t in trajectories for v in t.token_versions if v >= 0] or [served_version]
    return common_pb2.ScoredGroup(
        prompt=prompt, trajectories=trajectories, worker_id=worker_id, min_version=min(versions),
        max_version=max(versions), submitted_at_ms=int(time.time() * 1000),
    )
