"""transport=grpc: the tensor bytes inside the `PushWeights` call itself, as `TensorSlice`s of at most
`policy.weight_sync.chunk_mb`, for networks where only the rollout port is open (several times slower than tcp:
every slice is copied in Python and protobuf)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import torch

from fleet.config.infra import ServicesConfig
from fleet.config.policy import GrpcWeightSyncConfig
from fleet.contracts.weights import WorkerRef
from grpofleet.v1 import common_pb2
from services.runtime.errors import InvalidArgument
from weightsync.base import PushResult, StagedReceiver, WeightSender
from weightsync.header import TensorMeta, WeightSnapshot, byte_view


def chunks(snapshot: WeightSnapshot, chunk_bytes: int) -> Iterable[common_pb2.WeightChunk]:
    """The whole PushWeights stream of a snapshot: its header, then every tensor in slices of `chunk_bytes`."""
    yield common_pb2.WeightChunk(header=snapshot.header("grpc"))
    for index, t in enumerate(snapshot.tensors.values()):
        raw = byte_view(t)
        for offset in range(0, len(raw), chunk_bytes):
            data = bytes(raw[offset : offset + chunk_bytes])
            yield common_pb2.WeightChunk(slice=common_pb2.TensorSlice(tensor_index=index, offset=offset, data=data))


class GrpcSender(WeightSender):
    sync: GrpcWeightSyncConfig

    def __init__(self, sync: GrpcWeightSyncConfig, services: ServicesConfig) -> None:
        super().__init__(sync, services)

    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]:
        chunk = int(self.sync.chunk_mb * 1024 * 1024)

        async def stream() -> AsyncIterator[common_pb2.WeightChunk]:
            for msg in chunks(snapshot, chunk):
                yield msg

        return list(await asyncio.gather(*(self._call(w, stream(), snapshot.total_bytes) for w in workers)))


class GrpcReceiver(StagedReceiver):
    """Assembles the slices that follow the header; every byte of every tensor must come exactly where announced."""

    async def fill(self, rest: AsyncIterator[object], metas: list[TensorMeta], views: list[memoryview],
                   staged: dict[str, torch.Tensor]) -> None:
        filled = [0] * len(metas)
        async for chunk in rest:
            s = chunk.slice  # type: ignore[attr-defined]
            if not 0 <= s.tensor_index < len(metas):
                raise InvalidArgument(f"slice for tensor index {s.tensor_index} outside the announced set")
            buf = views[s.tensor_index]
            end = s.offset + len(s.data)
            if s.offset < 0 or end > buf.nbytes:
                raise InvalidArgument(f"slice [{s.offset}, {end}) outside tensor {metas[s.tensor_index].name!r}")
            buf[s.offset:end] = s.data
            filled[s.tensor_index] += len(s.data)
        for m, buf, n in zip(metas, views, filled, strict=True):
            if n != buf.nbytes:
                raise InvalidArgument(f"tensor {m.name!r}: received {n} of {buf.nbytes} bytes")
