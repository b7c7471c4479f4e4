"""Which weights: one frozen value for the identity that every push, registry entry and lease check compares.

The training loop mints it (`trainer/loop.py`: the epoch from BeginRun, the version = optimizer steps taken), the
push carries it (`weightsync`: `WeightSnapshot.id` on the trainer's side, `WeightSet.id` on the worker's), and the
rollout worker serves it. Trajectory ages use the version alone: every token records the version that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class WeightsId:
    """Ordered as (epoch, version): a later run epoch is newer whatever its version, since a run resumed from an
    older checkpoint starts its versions lower."""

    epoch: int
    version: int

    def __str__(self) -> str:
        return f"v{self.version} (epoch {self.epoch})"


NO_WEIGHTS = WeightsId(-1, -1)
"""What a worker serves before its first push: older than any weights of any run epoch."""


@dataclass(frozen=True)
class WorkerRef:
    """A rollout worker as the registry lists it, for the weight pusher. Here, not in `weightsync`, so that the
    buffer client (and the replay buffer through it) need not import torch: a restarted buffer serves seconds
    sooner."""

    worker_id: str
    address: str
    weight_version: int = -1
    weight_epoch: int = -1
    last_heartbeat_ms: int = 0
    state: str = ""

    @property
    def weights(self) -> WeightsId:
        """What the registry says this worker serves."""
        return WeightsId(self.weight_epoch, self.weight_version)
