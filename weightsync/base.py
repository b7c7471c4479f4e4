"""The two halves of a weight transport, one interface each.

`WeightSender` (trainer rank 0) moves one `WeightSnapshot` to a set of rollout workers: the `PushWeights` call
always carries the header, and each transport decides where the bytes go. `WeightReceiver` (rollout worker) fills
a push's tensors once its header has been checked against the served model. Each transport module (`tcp`, `grpc`,
`nccl`) holds both halves of its wire format, so the two ends of one format never drift apart; `factory` picks them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from grpc import aio

from fleet.config.infra import ServicesConfig
from fleet.config.policy import WeightSyncConfig
from fleet.contracts.weights import WeightsId, WorkerRef
from grpofleet.v1 import common_pb2, rollout_worker_pb2_grpc
from services.runtime.client import make_channel
from weightsync.header import TensorMeta, WeightSet, WeightSnapshot, byte_view

Stager = Callable[[Sequence[tuple[str, tuple[int, ...], str]]], dict[str, torch.Tensor]]
"""(name, shape, dtype name) in push order -> memory to receive into; the engine's `stage`."""
OnStaged = Callable[[Any], Awaitable[None]]


@dataclass
class PushResult:
    worker_id: str
    ok: bool
    version: int = -1
    epoch: int = -1
    pause_s: float = 0.0
    load_s: float = 0.0
    receive_s: float = 0.0
    seconds: float = 0.0
    bytes: int = 0
    error: str = ""

    @property
    def weights(self) -> WeightsId:
        """What the worker answered that it serves after the push."""
        return WeightsId(self.epoch, self.version)


async def header_only(header: common_pb2.WeightSetHeader) -> AsyncIterator[common_pb2.WeightChunk]:
    """A PushWeights stream of the header alone: the bytes travel beside the call (TCP, NCCL)."""
    yield common_pb2.WeightChunk(header=header)


class WeightSender(ABC):
    """Moves one snapshot to some workers; never raises for a worker's failure (it is reported per worker)."""

    def __init__(self, sync: WeightSyncConfig, services: ServicesConfig) -> None:
        self.sync = sync
        self.services = services
        self.timeout = sync.timeout_s
        self.min_bytes_per_s = sync.min_push_mb_s * 1e6
        self._channels: dict[str, aio.Channel] = {}

    def stub(self, address: str) -> rollout_worker_pb2_grpc.RolloutWorkerStub:
        if address not in self._channels:
            self._channels[address] = make_channel(address, self.services)
        return rollout_worker_pb2_grpc.RolloutWorkerStub(self._channels[address])

    def deadline_s(self, nbytes: int) -> float:
        """A push's deadline: `timeout_s` plus its bytes at `min_push_mb_s` (bounded, and scaled to the payload)."""
        return self.timeout + nbytes / self.min_bytes_per_s

    async def _call(self, worker: WorkerRef, messages: AsyncIterator[common_pb2.WeightChunk],
                    nbytes: int) -> PushResult:
        t0 = time.monotonic()
        try:
            r = await self.stub(worker.address).PushWeights(messages, timeout=self.deadline_s(nbytes))
        except aio.AioRpcError as exc:
            return PushResult(worker.worker_id, False, seconds=time.monotonic() - t0,
                              error=f"{exc.code().name}: {exc.details()}")
        return PushResult(worker.worker_id, True, r.version, r.epoch, r.pause_s, r.load_s, r.receive_s,
                          time.monotonic() - t0, r.bytes)

    @abstractmethod
    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]: ...

    async def forget(self, keep: set[str]) -> None:
        """Close the channels of every address but `keep` (workers the registry no longer lists)."""
        for address in [a for a in self._channels if a not in keep]:
            await self._channels.pop(address).close()

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


class WeightReceiver(ABC):
    """Fills the tensors of one push whose header has been checked. Made from the header (`factory.make_receiver`),
    so a header that lacks what its transport needs is refused before any memory is staged."""

    def __init__(self, header: common_pb2.WeightSetHeader, *, peer_host: str, timeout_s: float) -> None:
        self.header = header
        self.peer_host = peer_host
        self.timeout_s = timeout_s

    @abstractmethod
    async def receive(self, ws: WeightSet, rest: AsyncIterator[object], stage: Stager,
                      on_staged: OnStaged | None) -> None:
        """Set `ws.tensors` from the bytes of this push (`rest`: the call's messages after the header)."""


class StagedReceiver(WeightReceiver):
    """A transport whose bytes land in host memory that the engine staged for them (tcp, grpc): the receiver writes
    them exactly once, where the engine loads them from. On any failure that memory is released, if it can be."""

    async def receive(self, ws: WeightSet, rest: AsyncIterator[object], stage: Stager,
                      on_staged: OnStaged | None) -> None:
        staged = stage([(m.name, m.shape, m.dtype) for m in ws.metas])
        try:
            views = [byte_view(t) for t in staged.values()]
            if on_staged is not None:
                await on_staged(staged)
            await self.fill(rest, ws.metas, views, staged)
        except BaseException:
            release = getattr(staged, "release", None)
            if release is not None:
                release()
            raise
        ws.tensors = staged

    @abstractmethod
    async def fill(self, rest: AsyncIterator[object], metas: list[TensorMeta], views: list[memoryview],
                   staged: dict[str, torch.Tensor]) -> None:
        """Write every tensor's bytes into `views` (flat byte views of `staged`, in header order)."""
