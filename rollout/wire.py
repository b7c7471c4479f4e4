"""The rollout worker's protobuf edge for what scoring produces: a sandbox verdict as the contract's `Verdict`
message, put into the trajectories the worker submits (single-shot in `worker.py`, agent episodes in
`agent/runner.py`). Scoring itself (`scoring.py`) never sees protobuf."""

from __future__ import annotations

from fleet.contracts.sandbox import Verdict
from grpofleet.v1 import common_pb2

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
