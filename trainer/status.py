"""Rank 0 serves `grpofleet.v1.Trainer.GetStatus` (step, version, phase, recent metrics) on `services.trainer`.

The training thread writes `TrainerState`; the servicer, on the control-plane event loop, only reads it. Fields are
replaced whole (never mutated in place), so a reader sees either the old or the new value under the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpc import aio

from fleet.config.infra import ServicesConfig
from grpofleet.v1 import trainer_pb2, trainer_pb2_grpc
from services.runtime.server import GrpcService

PHASES = ("starting", "waiting_for_data", "training", "pushing_weights", "validating", "checkpointing", "done")


@dataclass
class TrainerState:
    step: int = 0
    """Steps trained, which is also the version of the weights last published."""
    epoch: int = 0
    phase: str = "starting"
    max_steps: int = 0
    world_size: int = 1
    async_mode: bool = False
    metrics: dict[str, float] = field(default_factory=dict)

    def set_phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown trainer phase {phase!r}")
        self.phase = phase


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, state: TrainerState) -> None:
        self.state = state

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: trainer_pb2.TrainerStatusRequest, context: aio.ServicerContext
    ) -> trainer_pb2.TrainerStatusResponse:
        s = self.state
        return trainer_pb2.TrainerStatusResponse(
            step=s.step, weight_version=s.step, epoch=s.epoch, phase=s.phase, max_steps=s.max_steps,
            metrics=dict(s.metrics), world_size=s.world_size, async_mode=s.async_mode)


async def start_status_service(services: ServicesConfig, state: TrainerState) -> GrpcService:
    """Start serving on `services.trainer`; the caller stops it with `await service.stop()`."""
    service = GrpcService("trainer", services.trainer, services)
    service.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(state), "grpofleet.v1.Trainer")
    await service.start()
    await service.set_serving(True)
    return service
