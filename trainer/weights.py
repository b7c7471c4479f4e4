"""Weight publication: gather the full weights on rank 0, push them to every live rollout worker, keep late joiners
in sync.

* `gather_snapshot()` runs on every rank (each FSDP2 `full_tensor()` is an all-gather); rank 0 keeps a CPU copy in
  the served dtype. The copy is what is streamed, never the live parameters, so the next optimizer step can run
  while a push is in flight without a worker ever reading half-updated weights (NeMo RL #3839).
* `WeightTransport` moves one snapshot to a set of workers and reports per worker. `TcpTransport` (the default)
  sends the header with a one-time token and serves the raw bytes from the snapshot over `rollout.tcp_stream`
  (each worker reads them with one connection); `GrpcTransport` streams a `WeightChunk` header then slices of
  <= `policy.weight_sync.chunk_mb`; `NcclTransport` sends the header alone with an NCCL rendezvous and broadcasts
  the bytes with `rollout.nccl`. The worker-side modules serve both ends: one code path per wire format.
* `WeightPusher` owns the current snapshot. `publish()` pushes it to every worker the buffer lists, concurrently;
  `watch()` (a background task) pushes it to any worker that registered late, restarted or fell behind: the join
  handshake, since the buffer leases nothing to a worker without weights of the current run epoch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from grpc import aio

from fleet.config import MasterConfig
from grpofleet.v1 import common_pb2, rollout_worker_pb2_grpc
from rollout import tcp_stream
from rollout.weights import byte_view
from services.runtime.client import make_channel
from trainer.model import DTYPES, PolicyModule, iter_full_state

log = logging.getLogger(__name__)
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass
class WeightSnapshot:
    version: int
    epoch: int
    tensors: dict[str, torch.Tensor]  # HF name -> CPU tensor in the served dtype, contiguous, not a parameter view

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def header(self, transport: str = "grpc", **nccl: Any) -> common_pb2.WeightSetHeader:
        metas = [common_pb2.TensorMeta(name=n, dtype=DTYPE_NAMES[t.dtype], shape=list(t.shape))
                 for n, t in self.tensors.items()]
        return common_pb2.WeightSetHeader(version=self.version, epoch=self.epoch, tensors=metas, transport=transport,
                                          total_bytes=self.total_bytes, **nccl)


def gather_snapshot(policy: PolicyModule, dtype: torch.dtype, *, keep: bool, version: int,
                    epoch: int) -> WeightSnapshot | None:
    """Every rank calls this in step; the rank with `keep` (rank 0) gets the snapshot, the others None."""
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, full in iter_full_state(policy):
            if keep:
                tensors[name] = full.detach().to("cpu", dtype=dtype, copy=True).contiguous()
    return WeightSnapshot(version, epoch, tensors) if keep else None


@dataclass(frozen=True)
class WorkerRef:
    worker_id: str
    address: str
    weight_version: int = -1
    weight_epoch: int = -1
    last_heartbeat_ms: int = 0
    state: str = ""


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


def _chunks(snapshot: WeightSnapshot, chunk_bytes: int) -> Iterable[common_pb2.WeightChunk]:
    yield common_pb2.WeightChunk(header=snapshot.header("grpc"))
    for index, t in enumerate(snapshot.tensors.values()):
        raw = byte_view(t)
        for offset in range(0, len(raw), chunk_bytes):
            data = bytes(raw[offset : offset + chunk_bytes])
            yield common_pb2.WeightChunk(slice=common_pb2.TensorSlice(tensor_index=index, offset=offset, data=data))


async def _header_only(header: common_pb2.WeightSetHeader) -> AsyncIterator[common_pb2.WeightChunk]:
    """A PushWeights stream of the header alone: the bytes travel beside the call (TCP, NCCL)."""
    yield common_pb2.WeightChunk(header=header)


class WeightTransport(ABC):
    """Moves one snapshot to some workers; never raises for a worker's failure (it is reported per worker)."""

    def __init__(self, cfg: MasterConfig) -> None:
        self.cfg = cfg
        self.timeout = cfg.policy.weight_sync.timeout_s
        self._channels: dict[str, aio.Channel] = {}

    def stub(self, address: str) -> rollout_worker_pb2_grpc.RolloutWorkerStub:
        if address not in self._channels:
            self._channels[address] = make_channel(address, self.cfg.services)
        return rollout_worker_pb2_grpc.RolloutWorkerStub(self._channels[address])

    async def _call(self, worker: WorkerRef, messages: AsyncIterator[common_pb2.WeightChunk]) -> PushResult:
        t0 = time.monotonic()
        try:
            r = await self.stub(worker.address).PushWeights(messages, timeout=self.timeout)
        except aio.AioRpcError as exc:
            return PushResult(worker.worker_id, False, seconds=time.monotonic() - t0,
                              error=f"{exc.code().name}: {exc.details()}")
        return PushResult(worker.worker_id, True, r.version, r.epoch, r.pause_s, r.load_s, r.receive_s,
                          time.monotonic() - t0, r.bytes)

    @abstractmethod
    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]: ...

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


class GrpcTransport(WeightTransport):
    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]:
        chunk = int(self.cfg.policy.weight_sync.chunk_mb * 1024 * 1024)

        async def stream() -> AsyncIterator[common_pb2.WeightChunk]:
            for msg in _chunks(snapshot, chunk):
                yield msg

        return list(await asyncio.gather(*(self._call(w, stream()) for w in workers)))


class TcpTransport(WeightTransport):
    """Header over gRPC, bytes over a plain TCP stream per worker, served from the snapshot without a copy. The
    listening socket lives as long as the transport; every push gets a fresh token per worker, withdrawn when the
    call has answered (a worker that never came for its bytes cannot collect them later)."""

    def __init__(self, cfg: MasterConfig) -> None:
        super().__init__(cfg)
        self._server: tcp_stream.StreamServer | None = None

    def _serve(self) -> tcp_stream.StreamServer:
        if self._server is None:
            ws = self.cfg.policy.weight_sync
            self._server = tcp_stream.StreamServer("", ws.stream_port, timeout_s=self.timeout)
            log.info("serving weight bytes on port %d", self._server.port)
        return self._server

    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]:
        server = self._serve()
        views = [byte_view(t) for t in snapshot.tensors.values()]
        host = self.cfg.policy.weight_sync.stream_host or ""

        def header(token: bytes) -> AsyncIterator[common_pb2.WeightChunk]:
            return _header_only(snapshot.header("tcp", stream_host=host, stream_port=server.port, stream_token=token))

        tokens = [os.urandom(tcp_stream.TOKEN_BYTES) for _ in workers]
        for token in tokens:
            server.offer(token, views)
        try:
            return list(await asyncio.gather(*(self._call(w, header(t)) for w, t in zip(workers, tokens, strict=True))))
        finally:
            for token in tokens:
                server.withdraw(token)

    async def close(self) -> None:
        await super().close()
        if self._server is not None:
            self._server.close()
            self._server = None


class NcclTransport(WeightTransport):
    """Header over gRPC, bytes over one NCCL broadcast (trainer rank 0 = NCCL rank 0, workers 1..N).

    A communicator is made once per worker set and reused (making one costs seconds); a new worker set gets a new
    rendezvous port. Untested in CI (no GPUs there); the gRPC transport serves late joiners either way."""

    def __init__(self, cfg: MasterConfig, device: torch.device) -> None:
        super().__init__(cfg)
        self.device = device
        self._link_key: tuple[str, ...] = ()
        self._init_method = ""

    def _rendezvous(self, workers: list[WorkerRef]) -> str:
        key = tuple(w.worker_id for w in workers)
        if key != self._link_key:
            addr = self.cfg.policy.weight_sync.nccl_address
            if addr is None:
                with socket.socket() as s:
                    s.bind(("", 0))
                    addr = f"{socket.gethostname()}:{s.getsockname()[1]}"
            self._link_key, self._init_method = key, f"tcp://{addr}"
        return self._init_method

    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]:
        from rollout import nccl
        from rollout.weights import TensorMeta

        init = self._rendezvous(workers)
        world = len(workers) + 1

        def header(rank: int) -> AsyncIterator[common_pb2.WeightChunk]:
            return _header_only(snapshot.header("nccl", nccl_init_method=init, nccl_world_size=world, nccl_rank=rank))

        calls = [asyncio.ensure_future(self._call(w, header(i + 1))) for i, w in enumerate(workers)]
        metas = [TensorMeta(n, DTYPE_NAMES[t.dtype], tuple(t.shape)) for n, t in snapshot.tensors.items()]

        def send() -> None:
            link = nccl.link(init, world, 0, self.device)
            nccl.send(link, metas, snapshot.tensors)

        try:
            await asyncio.to_thread(send)
        except Exception as exc:  # the next push makes a fresh rendezvous
            log.error("NCCL weight broadcast failed: %s", exc)
            self._link_key = ()
        return list(await asyncio.gather(*calls))


@dataclass
class WeightPusher:
    """Rank 0's weight publisher (runs on the control-plane event loop). Push rounds (a publish, or one round of the
    join watcher) never overlap: a worker is never sent the same version twice, nor an old one after a new one."""

    cfg: MasterConfig
    list_workers: Any  # async () -> list[WorkerRef]
    transport: WeightTransport
    late_transport: WeightTransport
    current: WeightSnapshot | None = None
    results: dict[str, PushResult] = field(default_factory=dict)
    _round: asyncio.Lock = field(default_factory=asyncio.Lock)
    _synced_at_ms: dict[str, int] = field(default_factory=dict)

    def _record(self, results: list[PushResult], snapshot: WeightSnapshot) -> None:
        for r in results:
            self.results[r.worker_id] = r
            if r.ok and (r.epoch, r.version) == (snapshot.epoch, snapshot.version):
                self._synced_at_ms[r.worker_id] = int(time.time() * 1000)
            elif not r.ok:
                log.warning("weight push v%d to %s failed: %s", snapshot.version, r.worker_id, r.error)

    async def publish(self, snapshot: WeightSnapshot) -> list[PushResult]:
        """Make `snapshot` current and push it to every listed worker; returns once every push has answered."""
        async with self._round:
            self.current = snapshot
            workers = await self.list_workers()
            if not workers:
                log.warning("weight version %d: no live rollout worker to push to (a joining one is synced on join)",
                            snapshot.version)
                return []
            results = await self.transport.push(snapshot, workers)
            self._record(results, snapshot)
            return results

    def behind(self, w: WorkerRef) -> bool:
        cur = self.current
        if cur is None or (w.weight_epoch, w.weight_version) == (cur.epoch, cur.version):
            return False
        # The registry can lag our own successful push by one heartbeat: trust the push unless the worker has
        # heartbeated since (e.g. it restarted and now reports no weights).
        synced = self._synced_at_ms.get(w.worker_id, -1)
        mine = self.results.get(w.worker_id)
        pushed_current = mine is not None and mine.ok and (mine.epoch, mine.version) == (cur.epoch, cur.version)
        return not (pushed_current and w.last_heartbeat_ms <= synced)

    async def sync_behind(self) -> list[PushResult]:
        """One round of the join handshake: push the current snapshot to every worker not serving it."""
        async with self._round:
            snap = self.current
            if snap is None:
                return []
            todo = [w for w in await self.list_workers() if self.behind(w)]
            if not todo:
                return []
            for w in todo:
                log.info("syncing worker %s (serving v%d epoch %d) to v%d epoch %d", w.worker_id, w.weight_version,
                         w.weight_epoch, snap.version, snap.epoch)
            results = await self.late_transport.push(snap, todo)
            self._record(results, snap)
            return results

    async def watch(self) -> None:
        """Background join handshake; runs until cancelled. A failure of one round is logged, not fatal."""
        while True:
            try:
                await self.sync_behind()
            except aio.AioRpcError as exc:
                log.warning("join watcher: %s %s", exc.code().name, exc.details())
            await asyncio.sleep(self.cfg.policy.weight_sync.join_poll_s)
