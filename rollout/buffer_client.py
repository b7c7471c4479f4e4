"""The rollout worker's side of the ReplayBuffer contract: every call with a deadline, transient failures
(UNAVAILABLE, DEADLINE_EXCEEDED) retried with backoff through an outage of the buffer or its Redis (up to
`services.outage_tolerance_s`, then `ServiceDown` names what is down), so that a restart costs a pause, not a
group. A submit retried after a lost answer is recognised as a duplicate by the buffer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from grpc import aio

from fleet.config import MasterConfig
from fleet.contracts import scored_group
from grpofleet.v1 import common_pb2, replay_buffer_pb2, replay_buffer_pb2_grpc
from services.runtime.client import call_through_outage, make_channel
from services.runtime.outage import Outage

T = TypeVar("T")


class BufferClient:
    def __init__(self, cfg: MasterConfig) -> None:
        self.cfg = cfg
        self.timeout = cfg.services.rpc_timeout_s
        self.channel: aio.Channel = make_channel(cfg.services.replay_buffer.address, cfg.services)
        self.stub = replay_buffer_pb2_grpc.ReplayBufferStub(self.channel)
        # One outage per process, shared by all its calls: logged once, bounded by services.outage_tolerance_s.
        self.outage = Outage(
            f"replay buffer at {cfg.services.replay_buffer.address}",
            cfg.services.outage_tolerance_s,
            report_every_s=cfg.services.outage_report_s,
        )

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        return await call_through_outage(f"replay buffer {name}", fn, self.outage)

    async def register(self, info: replay_buffer_pb2.WorkerInfo) -> replay_buffer_pb2.RegisterWorkerResponse:
        req = replay_buffer_pb2.RegisterWorkerRequest(worker=info)
        return await self._call("RegisterWorker", lambda: self.stub.RegisterWorker(req, timeout=self.timeout))

    async def heartbeat(self, info: replay_buffer_pb2.WorkerInfo) -> replay_buffer_pb2.HeartbeatResponse:
        req = replay_buffer_pb2.HeartbeatRequest(worker=info)
        return await self._call("Heartbeat", lambda: self.stub.Heartbeat(req, timeout=self.timeout))

    async def lease(self, worker_id: str, version: int, epoch: int, n: int) -> replay_buffer_pb2.LeasePromptsResponse:
        req = replay_buffer_pb2.LeasePromptsRequest(
            worker_id=worker_id, weight_version=version, weight_epoch=epoch, max_groups=n
        )
        return await self._call("LeasePrompts", lambda: self.stub.LeasePrompts(req, timeout=self.timeout))

    async def submit(self, worker_id: str, lease_id: str, group: common_pb2.ScoredGroup) -> Any:
        # Serialized once, here: the buffer stores and returns these bytes without decoding them.
        req = scored_group.submit_request(worker_id, lease_id, group)
        return await self._call("SubmitGroup", lambda: self.stub.SubmitGroup(req, timeout=self.timeout))

    async def release(self, worker_id: str, lease_id: str, reason: str, dead_letter: bool = False) -> None:
        req = replay_buffer_pb2.ReleaseLeaseRequest(
            worker_id=worker_id, lease_id=lease_id, reason=reason, dead_letter=dead_letter
        )
        await self._call("ReleaseLease", lambda: self.stub.ReleaseLease(req, timeout=self.timeout))
