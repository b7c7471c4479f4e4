"""The trainer's side of the ReplayBuffer contract. Protobuf stops here: callers get `trainer.batch.Group`s,
`Starvation` and `WorkerRef`s. Every call has a deadline; UNAVAILABLE / DEADLINE_EXCEEDED are retried with backoff
through an outage of the buffer or its Redis (up to `services.outage_tolerance_s`, then `ServiceDown` names what is
down), so a restart costs the trainer a pause, not the run. Every call is safe to retry: enqueues and commits are
idempotent, and a retried Sample carries the lost call's request id, so it gets back the same groups (no step trains
a group twice, none is left sampled but untrained)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from grpc import aio

from fleet.config import MasterConfig
from grpofleet.v1 import common_pb2, replay_buffer_pb2, replay_buffer_pb2_grpc
from services.runtime.client import call_through_outage, make_channel
from services.runtime.outage import Outage
from trainer.batch import Group, Trajectory
from trainer.data import PromptSpec
from weightsync.base import WorkerRef

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Starvation:
    reason: str = ""
    prompts_pending: int = 0
    leases_outstanding: int = 0
    live_workers: int = 0
    evicted_now: int = 0
    waited_s: float = 0.0

    def describe(self) -> str:
        return (
            f"{self.reason}: {self.prompts_pending} prompts pending, {self.leases_outstanding} leases out, "
            f"{self.live_workers} live workers, {self.evicted_now} evicted, waited {self.waited_s:.1f}s"
        )


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
        )
        for t in g.trajectories
    ]
    return Group(
        g.prompt.group_id, list(g.prompt.prompt_token_ids), trajs, int(g.min_version), int(g.prompt.target_step)
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


class BufferClient:
    def __init__(self, cfg: MasterConfig) -> None:
        self.timeout = cfg.services.rpc_timeout_s
        self.channel: aio.Channel = make_channel(cfg.services.replay_buffer.address, cfg.services)
        self.stub = replay_buffer_pb2_grpc.ReplayBufferStub(self.channel)
        # One outage per process, shared by all its calls: logged once, bounded by services.outage_tolerance_s.
        self.outage = Outage(
            f"replay buffer at {cfg.services.replay_buffer.address}",
            cfg.services.outage_tolerance_s,
            report_every_s=cfg.services.outage_report_s,
        )
        self._commit_warned = False

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        return await call_through_outage(f"replay buffer {name}", fn, self.outage)

    async def enqueue(self, prompts: list[PromptSpec]) -> tuple[int, int]:
        req = replay_buffer_pb2.EnqueuePromptsRequest(groups=[to_prompt(p) for p in prompts])
        r = await self._call("EnqueuePrompts", lambda: self.stub.EnqueuePrompts(req, timeout=self.timeout))
        return int(r.enqueued), int(r.duplicates)

    async def sample(
        self, step: int, num_groups: int, deadline_s: float, *, min_groups: int = 1, validation: bool = False
    ) -> tuple[list[Group], Starvation]:
        # One id per logical call, reused by its retries: a retried Sample gets back the groups the lost answer
        # carried instead of taking new ones (which would leave those groups sampled but never trained).
        req = replay_buffer_pb2.SampleRequest(
            step=step,
            num_groups=num_groups,
            deadline_ms=int(deadline_s * 1000),
            min_groups=min_groups,
            validation=validation,
            request_id=uuid.uuid4().hex,
        )
        groups, starvation = await self.sample_scored(req, deadline_s)
        return [to_group(g) for g in groups], starvation

    async def sample_scored(
        self, req: replay_buffer_pb2.SampleRequest, deadline_s: float
    ) -> tuple[list[common_pb2.ScoredGroup], Starvation]:
        """One Sample through the retrying call, the groups parsed from the bytes the workers submitted (validation
        reads their verdicts before they become `Group`s)."""
        # The server may hold the call for deadline_s: the RPC deadline must outlast it.
        r = await self._call("Sample", lambda: self.stub.Sample(req, timeout=deadline_s + self.timeout))
        s = r.starvation
        starvation = Starvation(
            s.reason, s.prompts_pending, s.leases_outstanding, s.live_workers, s.evicted_now, s.waited_s
        )
        return [common_pb2.ScoredGroup.FromString(b) for b in r.scored_groups], starvation

    async def begin_run(self, resume_step: int, weight_version: int) -> dict[str, int]:
        req = replay_buffer_pb2.BeginRunRequest(resume_step=resume_step, weight_version=weight_version)
        r = await self._call("BeginRun", lambda: self.stub.BeginRun(req, timeout=self.timeout))
        return {
            "epoch": int(r.epoch),
            "returned_groups": int(r.returned_groups),
            "retargeted_groups": int(r.retargeted_groups),
        }

    async def publish_version(self, version: int, epoch: int, step: int) -> None:
        req = replay_buffer_pb2.PublishVersionRequest(version=version, epoch=epoch, step=step)
        await self._call("PublishVersion", lambda: self.stub.PublishVersion(req, timeout=self.timeout))

    async def commit_step(self, step: int, epoch: int) -> int | None:
        """Tell the buffer that steps <= `step` are in a checkpoint (their groups can be forgotten)."""
        request_type: Any = getattr(replay_buffer_pb2, "CommitStepRequest", None)
        if request_type is None or not hasattr(self.stub, "CommitStep"):
            if not self._commit_warned:
                log.warning("the ReplayBuffer contract has no CommitStep yet: checkpoints are not committed")
                self._commit_warned = True
            return None
        fields = request_type.DESCRIPTOR.fields_by_name
        req = request_type(step=step, **({"epoch": epoch} if "epoch" in fields else {}))
        r = await self._call("CommitStep", lambda: self.stub.CommitStep(req, timeout=self.timeout))
        return int(r.committed_groups)

    async def list_workers(self) -> list[WorkerRef]:
        req = replay_buffer_pb2.ListWorkersRequest(include_dead=False)
        r = await self._call("ListWorkers", lambda: self.stub.ListWorkers(req, timeout=self.timeout))
        return [
            WorkerRef(
                w.worker_id, w.address, int(w.weight_version), int(w.weight_epoch), int(w.last_heartbeat_ms), w.state
            )
            for w in r.workers
        ]

    async def stats(self) -> dict[str, Any]:
        r = await self._call("Stats", lambda: self.stub.Stats(replay_buffer_pb2.StatsRequest(), timeout=self.timeout))
        out: dict[str, Any] = {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields if f.type != f.TYPE_MESSAGE}
        out["age_histogram"] = dict(r.age_histogram)
        out["dead_lettered_by_reason"] = dict(r.dead_lettered_by_reason)
        return out
