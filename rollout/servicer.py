"""grpofleet.v1.RolloutWorker: a thin adapter from protobuf to `RolloutWorker` and the engine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from grpc import aio

from grpofleet.v1 import common_pb2, rollout_worker_pb2, rollout_worker_pb2_grpc
from rollout.engine.base import StagedWeights
from rollout.worker import RolloutWorker
from weightsync.factory import receive


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string ("ipv4:10.0.0.5:4242", "ipv6:[::1]:4242"); loopback for anything else."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return "127.0.0.1"


class RolloutWorkerServicer(rollout_worker_pb2_grpc.RolloutWorkerServicer):
    def __init__(self, worker: RolloutWorker, engine_name: str) -> None:
        self.worker = worker
        self.engine_name = engine_name

    async def PushWeights(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[common_pb2.WeightChunk], context: aio.ServicerContext
    ) -> rollout_worker_pb2.PushWeightsResponse:
        t0 = time.monotonic()
        engine = self.worker.engine
        ws = await receive(request_iterator, engine.weight_spec(), stage=engine.stage,
                           on_staged=engine.on_staged, peer_host=peer_host(context.peer()),
                           timeout_s=self.worker.cfg.policy.weight_sync.timeout_s)
        try:
            receive_s = time.monotonic() - t0
            pause_s, load_s = await self.worker.apply_weights(ws)
        finally:
            if isinstance(ws.tensors, StagedWeights):
                ws.tensors.release()  # a no-op once the engine loaded it; else (refused, same version) given back
        return rollout_worker_pb2.PushWeightsResponse(
            version=self.worker.version, epoch=self.worker.epoch, pause_s=pause_s, load_s=load_s,
            receive_s=receive_s, bytes=ws.nbytes,
        )

    async def GetStatus(  # noqa: N802
        self, request: rollout_worker_pb2.WorkerStatusRequest, context: aio.ServicerContext
    ) -> rollout_worker_pb2.WorkerStatusResponse:
        w, s = self.worker, self.worker.stats
        s.set_busy(bool(w.in_flight))  # bring busy_s / idle_s up to now
        return rollout_worker_pb2.WorkerStatusResponse(
            worker_id=w.worker_id, weight_version=w.version, weight_epoch=w.epoch,
            groups_in_flight=len(w.in_flight), tokens_per_s=s.tokens_per_s(), tokens_generated=s.tokens_generated,
            groups_submitted=s.groups_submitted, weight_updates=s.weight_updates, total_pause_s=s.total_pause_s,
            last_pause_s=s.last_pause_s, state=w.state, engine=self.engine_name, scoring_retries=s.scoring_retries,
            busy_s=s.busy_s, idle_s=s.idle_s, agent=rollout_worker_pb2.AgentEpisodeStats(**w.episode_summary()),
        )

    async def Drain(  # noqa: N802
        self, request: rollout_worker_pb2.DrainRequest, context: aio.ServicerContext
    ) -> rollout_worker_pb2.DrainResponse:
        finished, released = await self.worker.drain(request.timeout_s)
        return rollout_worker_pb2.DrainResponse(groups_finished=finished, leases_released=released)
