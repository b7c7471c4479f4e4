"""A rollout worker's PushWeights, served by a real grpc.aio server, receiving with the worker's own code
(`weightsync.factory.receive`): the weight pusher's tests (tests/unit/trainer) and the transports'
(tests/unit/weightsync) push to it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch
from grpc import aio

from grpofleet.v1 import common_pb2, rollout_worker_pb2, rollout_worker_pb2_grpc
from weightsync import factory as worker_weights


@dataclass
class FakeWorker(rollout_worker_pb2_grpc.RolloutWorkerServicer):
    spec: dict[str, tuple[tuple[int, ...], str]]
    version: int = -1
    epoch: int = -1
    pushes: int = 0
    largest_slice: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    heartbeat_ms: int = 0

    async def PushWeights(self, request_iterator: AsyncIterator[common_pb2.WeightChunk],  # noqa: N802
                          context: aio.ServicerContext) -> rollout_worker_pb2.PushWeightsResponse:
        async def spy() -> AsyncIterator[common_pb2.WeightChunk]:
            async for msg in request_iterator:
                if msg.WhichOneof("payload") == "slice":
                    self.largest_slice = max(self.largest_slice, len(msg.slice.data))
                yield msg

        ws = await worker_weights.receive(spy(), self.spec)
        self.version, self.epoch, self.tensors = ws.version, ws.epoch, ws.tensors
        self.pushes += 1
        self.heartbeat_ms = int(time.time() * 1000) + 1  # the worker heartbeats right after loading
        return rollout_worker_pb2.PushWeightsResponse(version=ws.version, epoch=ws.epoch, bytes=ws.nbytes)


async def serve(worker: FakeWorker) -> tuple[aio.Server, str]:
    server = aio.server()
    rollout_worker_pb2_grpc.add_RolloutWorkerServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
