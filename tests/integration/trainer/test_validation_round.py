"""A validation round through the real trainer and replay buffer reports FULL resolutions / graded tasks and the
verdict of every task, a task that never comes back included (an infrastructure error, not a failed answer)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_harness import RPC_TIMEOUT, FakeRollout, start_trainer, write_config

from fleet.contracts import scored_group
from grpofleet.v1 import common_pb2, replay_buffer_pb2
from trainer.metrics import read_jsonl

V = common_pb2
# Validation task i gets verdict VERDICTS[i]; task len(VERDICTS) is never answered.
VERDICTS = [
    (V.VERDICT_STATUS_COMPLETED, V.RESOLUTION_FULL),
    (V.VERDICT_STATUS_COMPLETED, V.RESOLUTION_PARTIAL),
    (V.VERDICT_STATUS_FORMAT_ERROR, V.RESOLUTION_NO),
    (V.VERDICT_STATUS_PATCH_NOT_APPLIED, V.RESOLUTION_NO),
    (V.VERDICT_STATUS_TIMEOUT, V.RESOLUTION_NO),
]


@dataclass
class VerdictRollout(FakeRollout):
    async def _score(self, lease: replay_buffer_pb2.Lease, version: int) -> None:
        p = lease.group
        if not p.validation:
            return await super()._score(lease, version)
        index = int(p.group_id.rsplit(":", 1)[1])
        if index >= len(VERDICTS):
            return  # holds the lease, as a worker whose sandbox never answers would
        status, resolution = VERDICTS[index]
        traj = common_pb2.Trajectory(response_token_ids=[5, 6], generation_logprobs=[-1.0, -1.0],
                                     token_versions=[version] * 2, reward=float(index == 0), finish_reason="stop",
                                     verdict=common_pb2.Verdict(status=status, resolution=resolution))
        group = common_pb2.ScoredGroup(prompt=p, trajectories=[traj], worker_id=self.worker_id, min_version=version,
                                       max_version=version, submitted_at_ms=int(time.time() * 1000))
        await asyncio.sleep(0.05)
        request = scored_group.submit_request(self.worker_id, lease.lease_id, group)
        await self.stub.SubmitGroup(request, timeout=RPC_TIMEOUT)


def test_validation_reports_verdict_breakdown_and_counts_a_lost_task_as_infrastructure(
        tmp_path: Path, tiny_model_path: str, replay_buffer: Any) -> None:
    config = write_config(tmp_path, tiny_model_path, async_on=False, steps=1, grpo__val_period=1,
                          grpo__max_val_samples=len(VERDICTS) + 1, grpo__val_timeout_s=4.0,
                          env__arith__num_tasks=100)  # 10 validation tasks, 6 of them asked for
    worker = VerdictRollout(replay_buffer(config), tiny_model_path).start()
    try:
        trainer = start_trainer(config)
        assert trainer.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
    finally:
        worker.stop()
    [val] = [r for r in read_jsonl(tmp_path / "run" / "logs" / "metrics.jsonl") if "val/tasks" in r]
    breakdown = {k.removeprefix("val/verdict/"): v for k, v in val.items() if k.startswith("val/verdict/")}
    assert breakdown == {"resolved": 1, "tests_failed": 1, "no_patch": 1, "patch_not_applied": 1, "timeout": 1,
                         "integrity_refused": 0, "infra_error": 1}
    assert (val["val/tasks"], val["val/graded"], val["val/step"]) == (6, 5, 1)
    assert val["val/accuracy"] == 0.2 and val["val/incomplete"] == 1.0
    assert "counted as infrastructure errors" in (tmp_path / "trainer.log").read_text()
