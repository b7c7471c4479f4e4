"""The ReplayBuffer contract from the caller's side, for the trainer and the rollout workers: every call with a
deadline, transient failures (UNAVAILABLE, DEADLINE_EXCEEDED) retried with backoff through an outage of the buffer or
its Redis (up to `services.outage_tolerance_s`, then `ServiceDown` names what is down), so that a restart costs a
pause, not a group or the run. Every call is safe to retry: enqueues and commits are idempotent, a submit retried
after a lost answer is recognised as a duplicate, and a retried Sample carries the lost call's request id, so it gets
back the same groups (no step trains a group twice, none is left sampled but untrained).

Control plane and data plane: the calls go to the buffer, the scored groups' bytes go to and come from Redis directly
(`PayloadStore`, buffer_client/payloads.py, which rides out a Redis outage the same way). A worker's `submit` writes
the group's bytes to a payload key and submits the header; the submits of a worker's concurrent groups are coalesced
into one SubmitGroups call (buffer_client/submitter.py). `sample` reads the groups Sample names with one MGET.

Callers speak only the plain types of fleet/contracts: registry, lease and submit answers are those of
fleet/contracts/buffer.py (`WorkerInfo`, `Registration`, `Lease`, `LeaseReply`, `SubmitOutcome`, `Starvation`) and
fleet/contracts/weights.py (`WorkerRef`), the groups those of fleet/contracts/groups.py (an enqueued or leased
`PromptGroup`, a submitted or sampled `ScoredGroup`). Their protobuf is made and read here, through
buffer_client/wire.py: neither fleet imports generated group code."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from grpc import aio

from buffer_client.payloads import PayloadStore
from buffer_client.submitter import Encoded, SubmitBatcher
from buffer_client.wire import from_proto_group, from_proto_prompt, to_proto_group, to_proto_prompt
from fleet.config.infra import RedisConfig, ServicesConfig
from fleet.contracts.buffer import Lease, LeaseReply, Registration, Starvation, SubmitOutcome, WorkerInfo
from fleet.contracts.groups import PromptGroup, ScoredGroup
from fleet.contracts.weights import WeightsId, WorkerRef
from grpofleet.v1 import common_pb2, replay_buffer_pb2, replay_buffer_pb2_grpc
from services.runtime.client import call_through_outage, make_channel
from services.runtime.outage import Outage

T = TypeVar("T")
log = logging.getLogger(__name__)


def _worker_message(w: WorkerInfo) -> replay_buffer_pb2.WorkerInfo:
    return replay_buffer_pb2.WorkerInfo(
        worker_id=w.worker_id, address=w.address, weight_version=w.weight_version, weight_epoch=w.weight_epoch,
        state=w.state, groups_in_flight=w.groups_in_flight,
    )  # fmt: skip


class BufferClient:
    """Reads only its own sections (issue 14): `services` (the buffer's address, RPC deadline, outage bound, message
    size), `redis` (the data plane's URL and key prefix) and the run directory (where the embedded Redis is when
    `redis.url` is empty)."""

    def __init__(self, services: ServicesConfig, redis: RedisConfig, run_dir: str) -> None:
        self.timeout = services.rpc_timeout_s
        self.channel: aio.Channel = make_channel(services.replay_buffer.address, services)
        self.stub = replay_buffer_pb2_grpc.ReplayBufferStub(self.channel)
        # One outage per process, shared by all its calls: logged once, bounded by services.outage_tolerance_s.
        self.outage = Outage(
            f"replay buffer at {services.replay_buffer.address}",
            services.outage_tolerance_s,
            report_every_s=services.outage_report_s,
        )
        self.payloads = PayloadStore.from_config(services, redis, run_dir)
        self._submitter = SubmitBatcher(self._submit_batch)

    async def close(self) -> None:
        await self.channel.close()
        await self.payloads.close()

    async def _call(self, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        return await call_through_outage(f"replay buffer {name}", fn, self.outage)

    # ---- the rollout worker's calls ------------------------------------------------------------------------------

    async def register(self, info: WorkerInfo) -> Registration:
        req = replay_buffer_pb2.RegisterWorkerRequest(worker=_worker_message(info))
        r = await self._call("RegisterWorker", lambda: self.stub.RegisterWorker(req, timeout=self.timeout))
        return Registration(int(r.epoch), int(r.current_version), int(r.heartbeat_interval_ms))

    async def heartbeat(self, info: WorkerInfo) -> Registration:
        req = replay_buffer_pb2.HeartbeatRequest(worker=_worker_message(info))
        r = await self._call("Heartbeat", lambda: self.stub.Heartbeat(req, timeout=self.timeout))
        return Registration(int(r.epoch), int(r.current_version))

    async def lease(self, worker_id: str, version: int, epoch: int, n: int) -> LeaseReply:
        req = replay_buffer_pb2.LeasePromptsRequest(
            worker_id=worker_id, weight_version=version, weight_epoch=epoch, max_groups=n
        )
        r = await self._call("LeasePrompts", lambda: self.stub.LeasePrompts(req, timeout=self.timeout))
        leases = [Lease(x.lease_id, from_proto_prompt(x.group), int(x.delivery_count)) for x in r.leases]
        return LeaseReply(leases, int(r.retry_after_ms), r.reason)

    async def submit(self, worker_id: str, lease_id: str, group: ScoredGroup) -> SubmitOutcome:
        """Submit one whole group: its bytes to Redis, its header to the buffer, coalesced with the submits of the
        worker's other groups that finish meanwhile (one SubmitGroups call for all of them)."""
        return await self._submitter.submit(worker_id, lease_id, to_proto_group(group))

    async def _submit_batch(self, worker_id: str, groups: list[Encoded]) -> list[SubmitOutcome]:
        """Write the payloads (one round trip to Redis), then submit their headers (one call to the buffer). Both
        retried through outages: the keys stay the same, so a submit retried after a lost answer finds its group
        already kept and answers duplicate."""
        keys = await self.payloads.put([(e.header.group_id, e.data) for e in groups])
        req = replay_buffer_pb2.SubmitGroupsRequest(worker_id=worker_id, groups=[
            replay_buffer_pb2.GroupSubmission(lease_id=e.lease_id, header=e.header, payload_key=k)
            for e, k in zip(groups, keys, strict=True)
        ])  # fmt: skip
        r = await self._call("SubmitGroups", lambda: self.stub.SubmitGroups(req, timeout=self.timeout))
        return [SubmitOutcome(x.duplicate, x.dead_lettered, x.requeued) for x in r.results]

    async def release(self, worker_id: str, lease_id: str, reason: str, dead_letter: bool = False) -> None:
        req = replay_buffer_pb2.ReleaseLeaseRequest(
            worker_id=worker_id, lease_id=lease_id, reason=reason, dead_letter=dead_letter
        )
        await self._call("ReleaseLease", lambda: self.stub.ReleaseLease(req, timeout=self.timeout))

    # ---- the trainer's calls -------------------------------------------------------------------------------------

    async def enqueue(self, groups: list[PromptGroup]) -> tuple[int, int]:
        """(enqueued, duplicates): enqueues are idempotent (the trainer's group ids derive from the data position)."""
        req = replay_buffer_pb2.EnqueuePromptsRequest(groups=[to_proto_prompt(g) for g in groups])
        r = await self._call("EnqueuePrompts", lambda: self.stub.EnqueuePrompts(req, timeout=self.timeout))
        return int(r.enqueued), int(r.duplicates)

    async def sample(
        self, step: int, num_groups: int, deadline_s: float, *, min_groups: int = 1, validation: bool = False
    ) -> tuple[list[ScoredGroup], Starvation]:
        """Whole scored groups for `step` (parsed from the bytes the workers submitted) and why the answer is short,
        if it is."""
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
        # The server may hold the call for deadline_s: the RPC deadline must outlast it.
        r = await self._call("Sample", lambda: self.stub.Sample(req, timeout=deadline_s + self.timeout))
        s = r.starvation
        starvation = Starvation(
            s.reason, s.prompts_pending, s.leases_outstanding, s.live_workers, s.evicted_now, s.waited_s
        )
        # Training groups' keys stay until CommitStep covers the step (a resumed trainer reads them again);
        # validation groups are read once.
        keys = [g.payload_key for g in r.groups]
        values = await self.payloads.get(keys, delete=validation)
        missing = [k for k, v in zip(keys, values, strict=True) if v is None]
        if missing:  # deleted behind the buffer's back; the accounting check cannot see payload keys
            log.error("step %d: sampled groups whose payload is gone (not trained): %s", step, missing)
        groups = [from_proto_group(common_pb2.ScoredGroup.FromString(v)) for v in values if v is not None]
        return groups, starvation

    async def begin_run(self, resume_step: int) -> dict[str, int]:
        """A new run epoch, resumed at `resume_step` with the weights of that step (version == step)."""
        req = replay_buffer_pb2.BeginRunRequest(resume_step=resume_step, weight_version=resume_step)
        r = await self._call("BeginRun", lambda: self.stub.BeginRun(req, timeout=self.timeout))
        return {
            "epoch": int(r.epoch),
            "returned_groups": int(r.returned_groups),
            "retargeted_groups": int(r.retargeted_groups),
        }

    async def publish_version(self, weights: WeightsId) -> None:
        """The trainer now serves `weights`; the next step it samples for is their version (weights of version k are
        the policy after k steps), which the request's `step` carries too."""
        req = replay_buffer_pb2.PublishVersionRequest(version=weights.version, epoch=weights.epoch,
                                                      step=weights.version)
        await self._call("PublishVersion", lambda: self.stub.PublishVersion(req, timeout=self.timeout))

    async def commit_step(self, step: int, epoch: int) -> int:
        """Tell the buffer that steps <= `step` are in a checkpoint (their groups can be forgotten)."""
        req = replay_buffer_pb2.CommitStepRequest(step=step, epoch=epoch)
        r = await self._call("CommitStep", lambda: self.stub.CommitStep(req, timeout=self.timeout))
        return int(r.committed_groups)

    async def list_workers(self, include_dead: bool = False) -> list[WorkerRef]:
        """The registered workers with a recent heartbeat (`include_dead`: every registered one)."""
        req = replay_buffer_pb2.ListWorkersRequest(include_dead=include_dead)
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
