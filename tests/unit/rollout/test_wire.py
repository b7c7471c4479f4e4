"""The worker's protobuf edge for verdicts (rollout/wire.py): every verdict a trajectory can carry has its wire status;
an infrastructure error never reaches a trajectory (it is retried or the lease is released), so it has none."""

from fleet.contracts.sandbox import FINAL_STATUSES, Verdict
from grpofleet.v1 import common_pb2 as pb
from rollout.wire import to_proto_verdict


def test_every_scorable_verdict_has_its_wire_status() -> None:
    for status in (FINAL_STATUSES - {"infra_error"}) | {"format_error"}:
        assert to_proto_verdict(Verdict(status=status)).status != pb.VERDICT_STATUS_UNSPECIFIED, status  # type: ignore[arg-type]
    assert to_proto_verdict(Verdict(status="infra_error")).status == pb.VERDICT_STATUS_UNSPECIFIED


def test_resolution_counts_and_detail_cross_as_they_are() -> None:
    verdict = Verdict(status="completed", resolution="FULL", tests_passed=3, tests_failed=1, error="x" * 900)
    v = to_proto_verdict(verdict)
    assert (v.resolution, v.tests_passed, v.tests_failed, len(v.detail)) == (pb.RESOLUTION_FULL, 3, 1, 500)
